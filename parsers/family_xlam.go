package parsers

// xlam (Salesforce xLAM): a JSON list of {"name","arguments"} objects, found
// in order of preference in a ```json fence, after [TOOL_CALLS] (to the end
// of the line), inside <tool_call>…</tool_call>, after </think>, or as the
// whole output.

import "strings"

func init() { Register("xlam", xlamParser{}) }

var _ Parser = xlamParser{}

type xlamParser struct{}

// xlamPayload records the calls of a payload that starts with '[' or '{'.
func xlamPayload(c *vlCollector, s string) {
	i := vlSkipWS(s, 0)
	if i < len(s) && s[i] == '[' {
		c.callList(s, i, vlStdKeys, false)
		return
	}
	c.takeJSONCall(s, i, vlStdKeys, false)
}

// xlamLooksLikeCalls: `[{` or `{"` after whitespace.
func xlamLooksLikeCalls(s string) bool {
	i := vlSkipWS(s, 0)
	if i >= len(s) {
		return false
	}
	if s[i] == '[' {
		j := vlSkipWS(s, i+1)
		return j >= len(s) || s[j] == '{'
	}
	if s[i] == '{' {
		j := vlSkipWS(s, i+1)
		return j >= len(s) || s[j] == '"'
	}
	return false
}

// Parse: content is the output minus the payload block (minus the thinking
// for the </think> form, which a reasoning parser normally removed first).
func (xlamParser) Parse(text string, tools []ToolSchema) Result {
	return settle(xlamOnce, text, tools)
}

func xlamOnce(text string, _ []ToolSchema) Result {
	// The payload forms are tried in order; the first that yields a call
	// decides. A form that yields none leaves the collector empty, so the
	// forms can share it.
	var c vlCollector
	if r, ok := xlamFenced(&c, text); ok {
		return r
	}
	if r, ok := xlamToolCallsLine(&c, text); ok {
		return r
	}
	if r, ok := xlamTagged(text); ok {
		return r
	}
	// 4. The text after </think>, else 5. the whole output.
	body, content := text, ""
	if k := lastIndex(text, "</think>"); k >= 0 {
		body, content = text[k+len("</think>"):], text[:k]
	}
	if xlamLooksLikeCalls(body) {
		xlamPayload(&c, body)
		if c.next() > 0 {
			return c.result(textPtr(content))
		}
	}
	return Result{Content: textPtr(text)}
}

// xlamFenced takes the calls of ``` fences whose body is a call list.
func xlamFenced(c *vlCollector, text string) (Result, bool) {
	if !strings.Contains(text, "```") {
		return Result{}, false
	}
	from := 0
	var parts []string
	last := 0
	for {
		f := strings.Index(text[from:], "```")
		if f < 0 {
			break
		}
		f += from
		bs := f + 3
		if strings.HasPrefix(text[bs:], "json") {
			bs += 4
		}
		e := strings.Index(text[bs:], "```")
		body, end := text[bs:], len(text)
		if e >= 0 {
			body, end = text[bs:bs+e], bs+e+3
		}
		if !xlamLooksLikeCalls(body) {
			if e < 0 {
				break
			}
			from = end
			continue
		}
		parts = append(parts, text[last:f])
		xlamPayload(c, body)
		last, from = end, end
	}
	if c.next() > 0 {
		parts = append(parts, text[last:])
		return c.result(vlJoin(parts)), true
	}
	return Result{}, false
}

// xlamToolCallsLine takes the call list after [TOOL_CALLS], up to the end
// of the line.
func xlamToolCallsLine(c *vlCollector, text string) (Result, bool) {
	k := strings.Index(text, "[TOOL_CALLS]")
	if k < 0 {
		return Result{}, false
	}
	body := text[k+len("[TOOL_CALLS]"):]
	rest := ""
	if nl := strings.IndexByte(body, '\n'); nl >= 0 {
		// A multi-line JSON payload continues past the newline.
		if end, st := vlSkipJSON(body, vlSkipWS(body, 0), false); st == vlOK {
			body, rest = body[:end], body[end:]
		} else {
			body, rest = body[:nl], body[nl:]
		}
	}
	if xlamLooksLikeCalls(body) {
		xlamPayload(c, body)
		return c.result(vlJoin([]string{text[:k], rest})), true
	}
	return Result{}, false
}

// xlamTagged takes the calls of <tool_call> blocks.
func xlamTagged(text string) (Result, bool) {
	if !strings.Contains(text, "<tool_call>") {
		return Result{}, false
	}
	ts := tagScan{first: -1}
	last, from := 0, 0
	for {
		k := strings.Index(text[from:], "<tool_call>")
		if k < 0 {
			break
		}
		k += from
		bs := k + len("<tool_call>")
		e := strings.Index(text[bs:], "</tool_call>")
		body, end := text[bs:], len(text)
		if e >= 0 {
			body, end = text[bs:bs+e], bs+e+len("</tool_call>")
		}
		// A complete JSON payload decides where the block ends, so a
		// string mentioning </tool_call> does not cut it.
		if je, st := vlSkipJSON(text, vlSkipWS(text, bs), false); st == vlOK {
			a := vlSkipWS(text, je)
			if strings.HasPrefix(text[a:], "</tool_call>") {
				body, end = text[bs:je], a+len("</tool_call>")
			}
		}
		if !xlamLooksLikeCalls(body) {
			from = bs
			continue
		}
		ts.parts = append(ts.parts, text[last:k])
		xlamPayload(&ts.c, body)
		last, from = end, end
	}
	if ts.c.next() > 0 {
		ts.parts = append(ts.parts, text[last:])
		return ts.c.result(vlJoin(ts.parts)), true
	}
	return Result{}, false
}
