package parsers

import (
	"strings"
)

// mistralParser reads both Mistral formats after [TOOL_CALLS]:
//   - pre-v11: a JSON array (or one object) of {"name","arguments"};
//   - v11+:    name{json}, optionally name[CALL_ID]id[ARGS]{json}.
//
// The format is detected per segment from the text (vLLM decides from the
// tokenizer, which a client does not have). Each segment and each array
// element stands alone: one bad element does not discard the others, and
// v11 arguments are validated (vLLM and Hermes pass invalid JSON through).
type mistralParser struct{}

var _ Parser = mistralParser{}

func init() { Register("mistral", mistralParser{}) }

const (
	mistralToolCalls = "[TOOL_CALLS]"
	mistralArgs      = "[ARGS]"
	mistralCallID    = "[CALL_ID]"
)

// NewCallID makes the family's ids (CallIDMaker): 9 alphanumerics.
func (mistralParser) NewCallID() string { return NewMistralCallID() }

func (mistralParser) Parse(text string, _ []ToolSchema) Result {
	c := collector{newID: NewMistralCallID}
	first := -1
	pos := 0
	for pos < len(text) {
		k := strings.Index(text[pos:], mistralToolCalls)
		if k < 0 {
			break
		}
		start := pos + k
		bs := start + len(mistralToolCalls)
		segEnd := len(text)
		if n := strings.Index(text[bs:], mistralToolCalls); n >= 0 {
			segEnd = bs + n
		}
		seg := text[bs:segEnd]
		t := skipSpace(seg, 0)
		switch {
		case t < len(seg) && (seg[t] == '[' || seg[t] == '{'):
			if first < 0 {
				first = start
			}
			mistralList(&c, seg[t:], text[start:segEnd])
		case t == len(seg):
			if segEnd == len(text) {
				if first < 0 {
					first = start
				}
				c.fail("", "call is truncated (output ended after [TOOL_CALLS])", text[start:segEnd])
			}
		default:
			if mistralV11(&c, seg, text[start:segEnd]) && first < 0 {
				first = start
			}
		}
		pos = segEnd
	}
	return c.result(text, first)
}

// mistralList parses a pre-v11 payload element by element, so a truncated
// array still yields its complete calls.
func mistralList(c *collector, s, raw string) {
	if s[0] == '{' {
		end, err := scanValue(s, 0)
		if err != nil {
			c.fail(nameHint(s), describeScanErr(err, "call JSON"), raw)
			return
		}
		mistralElem(c, s[:end])
		return
	}
	i := skipSpace(s, 1)
	if i < len(s) && s[i] == ']' {
		return
	}
	for i < len(s) {
		end, err := scanValue(s, i)
		if err != nil {
			c.fail(nameHint(s[i:]), describeScanErr(err, "call JSON"), s[i:])
			return
		}
		if s[i] != '{' {
			c.fail("", "array element is not a call object", s[i:end])
		} else {
			mistralElem(c, s[i:end])
		}
		i = skipSpace(s, end)
		if i >= len(s) {
			c.fail("", "call list is truncated (no closing ']')", raw)
			return
		}
		switch s[i] {
		case ',':
			i = skipSpace(s, i+1)
		case ']':
			return
		default:
			c.fail("", "unexpected text in the call list", s[i:])
			return
		}
	}
}

func mistralElem(c *collector, obj string) {
	co := decodeCallObject(obj)
	switch {
	case co.argsErr != nil:
		c.fail(co.name, "arguments: "+co.argsErr.Error(), obj)
	case !co.hasName || co.name == "":
		c.fail("", `call object has no "name"`, obj)
	default:
		c.ok(co.name, co.args, obj)
	}
}

// mistralV11 parses one name{json} segment; it reports false when the
// segment is prose that merely follows the marker (no valid name).
func mistralV11(c *collector, seg, raw string) bool {
	nameEnd := mistralNameEnd(seg)
	name := strings.TrimSpace(seg[:nameEnd])
	if !isFuncName(name) {
		return false
	}
	rest := seg[nameEnd:]
	id := ""
	if strings.HasPrefix(rest, mistralCallID) {
		rest = rest[len(mistralCallID):]
		k := strings.Index(rest, mistralArgs)
		if k < 0 {
			k = strings.IndexByte(rest, '{')
		}
		if k < 0 {
			c.fail(name, "call is truncated (no arguments after [CALL_ID])", raw)
			return true
		}
		id = strings.TrimSpace(rest[:k])
		rest = rest[k:]
	}
	rest = strings.TrimPrefix(rest, mistralArgs)
	j := skipSpace(rest, 0)
	if j == len(rest) {
		c.fail(name, "call has no JSON arguments (truncated?)", raw)
		return true
	}
	if rest[j] != '{' {
		c.fail(name, "arguments are not a JSON object", raw)
		return true
	}
	_, args, err := scanCompact(rest, j)
	if err != nil {
		c.fail(name, describeScanErr(err, "arguments"), raw)
		return true
	}
	args = validUTF8(args)
	if id != "" {
		c.okNative(id, name, args, raw)
	} else {
		c.ok(name, args, raw)
	}
	return true
}

// mistralNameEnd is where the name of a v11 segment ends: at the first '{',
// [ARGS] or [CALL_ID], else at the end. The bracket markers matter only
// before the '{', so they are looked for in that short prefix instead of
// in the whole segment.
func mistralNameEnd(seg string) int {
	end := strings.IndexByte(seg, '{')
	if end < 0 {
		end = len(seg)
	}
	for i := 0; ; i++ {
		k := strings.IndexByte(seg[i:end], '[')
		if k < 0 {
			return end
		}
		i += k
		if strings.HasPrefix(seg[i:], mistralArgs) || strings.HasPrefix(seg[i:], mistralCallID) {
			return i
		}
	}
}
