package parsers

import (
	"errors"
	"strings"
)

// tagJSONParser handles formats that wrap a {"name","arguments"} JSON
// object in a pair of tags: hermes, qwen (same format) and longcat.
//
// Unlike upstream it scans the JSON before looking for the close tag, so an
// argument string that itself contains "</tool_call>" does not cut the call;
// every call stands alone (a malformed one becomes a CallError, its siblings
// survive); and an open tag followed by prose is not a call.
type tagJSONParser struct{ open, close string }

var _ Parser = tagJSONParser{}

func init() {
	Register("hermes", tagJSONParser{"<tool_call>", "</tool_call>"})
	Register("qwen", tagJSONParser{"<tool_call>", "</tool_call>"})
	Register("longcat", tagJSONParser{"<longcat_tool_call>", "</longcat_tool_call>"})
}

func (p tagJSONParser) Parse(text string, _ []ToolSchema) Result {
	var c collector
	first := -1
	pos := 0
	for pos < len(text) {
		k := strings.Index(text[pos:], p.open)
		if k < 0 {
			break
		}
		start := pos + k
		bs := start + len(p.open)
		j := skipSpace(text, bs)
		if j < len(text) && text[j] == '{' {
			if first < 0 {
				first = start
			}
			pos = parseTaggedJSON(&c, text, start, j, p.open, p.close)
			continue
		}
		if j < len(text) && text[j] == '[' {
			// Several calls as one JSON array inside a single tag pair, as
			// Qwen2.5 sometimes writes them: each element is a call.
			if next, ok := parseTaggedList(&c, text, start, j, p.open, p.close); ok {
				if first < 0 {
					first = start
				}
				pos = next
				continue
			}
		}
		// Not JSON: a call only if the tag pair closes around something.
		closeAt, bodyEnd, closed := tagExtent(text, bs, p.open, p.close)
		if closed && strings.TrimSpace(text[bs:bodyEnd]) != "" {
			if first < 0 {
				first = start
			}
			c.fail("", "call body is not a JSON object", text[start:closeAt])
			pos = closeAt
			continue
		}
		if !closed && j == len(text) {
			// Output ended right after the open tag: a cut-off call.
			if first < 0 {
				first = start
			}
			c.fail("", "call is truncated (output ended after "+p.open+")", text[start:])
			break
		}
		pos = bs // prose that mentions the tag
	}
	return c.result(text, first)
}

// tagExtent finds where the call opened before bs ends: closeAt is the index
// after the close tag (or where the next call or the text starts/ends),
// bodyEnd where the body ends, closed whether the close tag was found first.
func tagExtent(text string, bs int, open, close string) (closeAt, bodyEnd int, closed bool) {
	rest := text[bs:]
	ci := strings.Index(rest, close)
	oi := strings.Index(rest, open)
	switch {
	case ci >= 0 && (oi < 0 || ci < oi):
		return bs + ci + len(close), bs + ci, true
	case oi >= 0:
		return bs + oi, bs + oi, false
	default:
		return len(text), len(text), false
	}
}

// parseTaggedJSON parses the JSON call object at text[j] (j after the open
// tag at start) and returns where scanning resumes.
func parseTaggedJSON(c *collector, text string, start, j int, open, close string) int {
	end, co, err := scanCallObject(text, j)
	if err == nil {
		after := skipSpace(text, end)
		rest := text[after:]
		closed := strings.HasPrefix(rest, close)
		if closed || after == len(text) || strings.HasPrefix(rest, open) {
			callEnd := after
			if closed {
				callEnd += len(close)
			}
			raw := text[start:callEnd]
			switch {
			case co.argsErr != nil:
				c.fail(co.name, "arguments: "+co.argsErr.Error(), raw)
			case !co.hasName || co.name == "":
				c.fail("", `call object has no "name"`, raw)
			default:
				repairs := co.repairs
				if !closed {
					repairs = append(repairs, RepairCloseMissing)
				}
				c.ok(co.name, co.args, raw, repairs...)
			}
			return callEnd
		}
		closeAt, _, _ := tagExtent(text, end, open, close)
		c.fail(co.name, "unexpected text after the call's JSON object", text[start:closeAt])
		return closeAt
	}
	closeAt, bodyEnd, closed := tagExtent(text, j, open, close)
	if end >= bodyEnd && bodyEnd < len(text) {
		// The scan ran past the end of this call; judge the body alone.
		_, err = scanValue(text[:bodyEnd], j)
	}
	reason := describeScanErr(err, "call JSON")
	if errors.Is(err, errJSONEOF) && closed {
		reason = "call JSON is incomplete before " + close
	}
	c.fail(nameHint(text[j:bodyEnd]), reason, text[start:closeAt])
	return closeAt
}

// nameHint fishes the function name out of a malformed call object, so the
// error message can say which call failed.
func nameHint(body string) string {
	k := strings.Index(body, `"name"`)
	if k < 0 {
		return ""
	}
	i := skipSpace(body, k+6)
	if i >= len(body) || body[i] != ':' {
		return ""
	}
	i = skipSpace(body, i+1)
	if i >= len(body) || body[i] != '"' {
		return ""
	}
	end, err := scanString(body, i)
	if err != nil {
		return ""
	}
	n, _ := unquoteJSON(body[i:end])
	return n
}

// parseTaggedList reads a JSON array of call objects after an open tag. It
// reports false when the text is not such an array (prose in brackets):
// only "[" followed by "{" or "]" is taken as a call list.
func parseTaggedList(c *collector, text string, start, j int, open, close string) (int, bool) {
	k := skipSpace(text, j+1)
	if k < len(text) && text[k] != '{' && text[k] != ']' {
		return 0, false
	}
	end, err := scanValue(text, j)
	if err == nil {
		after := skipSpace(text, end)
		rest := text[after:]
		closed := strings.HasPrefix(rest, close)
		if closed || after == len(text) || strings.HasPrefix(rest, open) {
			callEnd := after
			if closed {
				callEnd += len(close)
			}
			mistralList(c, text[j:end], text[start:callEnd])
			return callEnd, true
		}
	}
	// Broken, truncated or followed by junk: the complete elements still
	// count, the rest is reported.
	closeAt, bodyEnd, _ := tagExtent(text, j, open, close)
	body := text[j:bodyEnd]
	if err == nil && end <= bodyEnd {
		mistralList(c, text[j:end], text[start:closeAt])
		c.fail("", "unexpected text after the call list", text[start:closeAt])
		return closeAt, true
	}
	mistralList(c, body, text[start:closeAt])
	return closeAt, true
}
