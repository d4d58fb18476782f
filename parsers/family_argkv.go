package parsers

// GLM-style key/value families: poolside_v1 (the glm45 format) and hy_v3
// (Hunyuan v3). Calls carry a name and <arg_key>K</arg_key><arg_value>V
// </arg_value> pairs:
//
//	poolside_v1  <tool_call>NAME\n<arg_key>…</arg_key>\n<arg_value>…</arg_value>\n</tool_call>
//	hy_v3        <tool_calls><tool_call>NAME<tool_sep><arg_key>…</arg_key><arg_value>…</arg_value></tool_call></tool_calls>

import (
	"encoding/json"
	"strings"
)

func init() {
	Register("poolside_v1", poolsideParser{})
	Register("hy_v3", hyV3Parser{})
}

var (
	_ Parser = poolsideParser{}
	_ Parser = hyV3Parser{}
)

const (
	kvKey      = "<arg_key>"
	kvKeyEnd   = "</arg_key>"
	kvValue    = "<arg_value>"
	kvValueEnd = "</arg_value>"
)

// kvLooseValue types a value of a parameter the schema says nothing about
// (or when there is no schema): JSON, then a Python literal, then the
// stripped text — glm45's rule, so `42` is 42 and `true` is true.
func kvLooseValue(raw string) json.RawMessage {
	t := strings.TrimSpace(raw)
	if t != "" {
		if c, err := compactJSON(t); err == nil {
			return json.RawMessage(c)
		}
		if lit, ok := pyLiteralJSON(t); ok {
			return lit
		}
	}
	return json.RawMessage(appendJSONString(nil, t))
}

// kvValueFor: a declared string-only parameter keeps its text verbatim
// (whitespace included, glm45/poolside); other declared types go through
// the schema coercion on the stripped text; undeclared ones are loose.
func kvValueFor(tools []ToolSchema, fn, param, raw string) json.RawMessage {
	if !vlDeclared(tools, fn, param) {
		return kvLooseValue(raw)
	}
	types := paramTypes(tools, fn, param)
	if len(types) == 1 && types[0] == "string" {
		return json.RawMessage(appendJSONString(nil, raw))
	}
	return qxValue(tools, fn, param, strings.TrimSpace(raw))
}

// kvScan parses <arg_key>/<arg_value> pairs from text[i:] until something
// else follows. It returns the arguments, where the pairs ended, and
// either the reason they are malformed or trunc when the output ends
// inside a pair. Pairs are read in sequence, so a value that mentions
// </tool_call> does not end the call.
func kvScan(tools []ToolSchema, fn, text string, i int) (args string, end int, reason string, trunc bool) {
	ab := newArgs()
	for {
		j := vlSkipSpaceAny(text, i)
		if !strings.HasPrefix(text[j:], kvKey) {
			if j >= len(text) {
				return ab.String(), j, "", false
			}
			return ab.String(), i, "", false
		}
		ks := j + len(kvKey)
		ke := strings.Index(text[ks:], kvKeyEnd)
		av := strings.Index(text[ks:], kvValue)
		if ke < 0 && av < 0 {
			return "", len(text), "", true
		}
		if ke < 0 || (av >= 0 && av < ke) {
			return "", ks, "<arg_key> is not closed", false
		}
		key := strings.TrimSpace(text[ks : ks+ke])
		if key == "" || strings.Contains(key, "<") {
			return "", ks, "malformed argument key", false
		}
		v := vlSkipSpaceAny(text, ks+ke+len(kvKeyEnd))
		if v >= len(text) {
			return "", len(text), "", true
		}
		if !strings.HasPrefix(text[v:], kvValue) {
			return "", v, "argument " + key + " has no <arg_value>", false
		}
		vs := v + len(kvValue)
		ve := strings.Index(text[vs:], kvValueEnd)
		if ve < 0 {
			return "", len(text), "", true
		}
		ab.add(key, kvValueFor(tools, fn, key, text[vs:vs+ve]))
		i = vs + ve + len(kvValueEnd)
	}
}

// kvSkip finds where a broken call ends: after the next end tag, else at
// the next call, else at the end of the text.
func kvSkip(text string, i int, open, closeTag string) int {
	c := strings.Index(text[i:], closeTag)
	o := strings.Index(text[i:], open)
	if c >= 0 && (o < 0 || c < o) {
		return i + c + len(closeTag)
	}
	if o >= 0 {
		return i + o
	}
	return len(text)
}

// --- poolside_v1 ---

type poolsideParser struct{}

// Parse reads GLM-4.5-style <tool_call> blocks; content is the text before
// the first call. `<tool_call>` followed by something that is not a
// function name is prose; an unclosed call at the end of the output is a
// truncation error (upstream drops every call then).
func (poolsideParser) Parse(text string, tools []ToolSchema) Result {
	const open, closeTag = "<tool_call>", "</tool_call>"
	if !strings.Contains(text, open) {
		return Result{Content: textPtr(text)}
	}
	ts := tagScan{first: -1}
	from := 0
	for {
		k := strings.Index(text[from:], open)
		if k < 0 {
			break
		}
		k += from
		ns := vlSkipSpaceAny(text, k+len(open))
		ne := ns
		for ne < len(text) && text[ne] != '\n' && text[ne] != '<' {
			ne++
		}
		name := strings.TrimSpace(text[ns:ne])
		atEnd := (ne >= len(text) || strings.HasPrefix(text[ne:], open)) && (name == "" || vlValidName(name))
		if !atEnd && (!vlValidName(name) || !(text[ne] == '\n' || strings.HasPrefix(text[ne:], kvKey) || strings.HasPrefix(text[ne:], closeTag))) {
			from = k + len(open)
			continue
		}
		if ts.first < 0 {
			ts.first = k
		}
		args, end, reason, trunc := kvScan(tools, name, text, ne)
		e := vlSkipSpaceAny(text, end)
		switch {
		case trunc || (reason == "" && e >= len(text)):
			ts.c.fail(name, "truncated: the call is not closed by </tool_call>", text[k:])
			from = len(text)
			continue
		case reason == "" && name == "":
			reason = "missing function name"
		case reason == "" && !strings.HasPrefix(text[e:], closeTag):
			reason = "unexpected text where <arg_key> or </tool_call> was expected"
		}
		if reason != "" {
			stop := kvSkip(text, max(end, ne), open, closeTag)
			ts.c.fail(name, reason, text[k:stop])
			from = stop
			continue
		}
		stop := e + len(closeTag)
		ts.c.add(name, args, text[k:stop])
		from = stop
	}
	return ts.c.result(ts.before(text))
}

// --- hy_v3 ---

type hyV3Parser struct{}

const (
	hyBlock    = "<tool_calls>"
	hyBlockEnd = "</tool_calls>"
	hyCall     = "<tool_call>"
	hyCallEnd  = "</tool_call>"
	hySep      = "<tool_sep>"
)

// Parse reads <tool_calls> blocks of <tool_call>NAME<tool_sep>pairs
// </tool_call>, sequentially. A call without its end tag is accepted when
// the next call or the block end follows, or at the end of the output when
// its last value is complete (upstream accepts an unclosed final call); a
// call cut inside a name or value is a truncation error. Content is the
// text before the first block.
func (hyV3Parser) Parse(text string, tools []ToolSchema) Result {
	if !strings.Contains(text, hyBlock) {
		return Result{Content: textPtr(text)}
	}
	ts := tagScan{first: -1}
	from := 0
	for from < len(text) {
		k := strings.Index(text[from:], hyBlock)
		if k < 0 {
			break
		}
		k += from
		i := vlSkipSpaceAny(text, k+len(hyBlock))
		if i < len(text) && !strings.HasPrefix(text[i:], hyCall) && !strings.HasPrefix(text[i:], hyBlockEnd) {
			from = k + len(hyBlock) // prose mentioning the tag
			continue
		}
		if ts.first < 0 {
			ts.first = k
		}
		n0 := ts.c.next()
		i = ts.hyBlock(text, i, tools)
		if ts.c.next() == n0 {
			if i >= len(text) {
				ts.c.fail("", "truncated: the output ends inside the tool call block", text[k:])
			} else {
				ts.c.fail("", "tool call block holds no call", text[k:i])
			}
		}
		from = i
	}
	return ts.c.result(ts.before(text))
}

// hyBlock reads the calls of one block from i; it returns where the block
// ended.
func (ts *tagScan) hyBlock(text string, i int, tools []ToolSchema) int {
	for {
		i = vlSkipSpaceAny(text, i)
		switch {
		case strings.HasPrefix(text[i:], hyBlockEnd):
			return i + len(hyBlockEnd)
		case i >= len(text) || !strings.HasPrefix(text[i:], hyCall):
			return i // end of output, or an unclosed block followed by text
		}
		cs := i
		nb := i + len(hyCall)
		lt := strings.IndexByte(text[nb:], '<')
		if lt < 0 {
			ts.c.fail(strings.TrimSpace(text[nb:]), "truncated: the output ends inside the call", text[cs:])
			return len(text)
		}
		ne := nb + lt
		name := strings.TrimSpace(text[nb:ne])
		j := ne
		if strings.HasPrefix(text[j:], hySep) {
			j += len(hySep)
		}
		args, end, reason, trunc := kvScan(tools, name, text, j)
		if trunc {
			ts.c.fail(name, "truncated: the output ends inside the call", text[cs:])
			return len(text)
		}
		e := vlSkipSpaceAny(text, end)
		closed := strings.HasPrefix(text[e:], hyCallEnd)
		switch {
		case reason != "":
		case !vlValidName(name):
			reason = "missing or invalid function name"
		case closed:
		case e >= len(text):
			// Unclosed at the very end: complete only after a value.
			if !strings.HasSuffix(strings.TrimRight(text[:end], " \t\r\n"), kvValueEnd) {
				ts.c.fail(name, "truncated: the output ends inside the call", text[cs:])
				return len(text)
			}
		case strings.HasPrefix(text[e:], hyCall), strings.HasPrefix(text[e:], hyBlockEnd):
		default:
			reason = "unexpected text where <arg_key> or </tool_call> was expected"
		}
		if reason != "" {
			stop := kvSkip(text, max(end, ne), hyCall, hyCallEnd)
			ts.c.fail(name, reason, text[cs:stop])
			i = stop
			continue
		}
		if closed {
			e += len(hyCallEnd)
		}
		ts.c.add(name, args, text[cs:e])
		i = e
	}
}
