package parsers

import (
	"encoding/json"
	"strings"
)

const (
	glmOpen       = "<tool_call>"
	glmClose      = "</tool_call>"
	glmKeyOpen    = "<arg_key>"
	glmKeyClose   = "</arg_key>"
	glmValueOpen  = "<arg_value>"
	glmValueClose = "</arg_value>"
)

// glmParser reads GLM-4.5/4.6/4.7 calls:
// <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>…</tool_call>.
// One scanner serves glm45 and glm47: the 4.7 relaxations (no newline after
// the name, zero-argument calls, a literal "\n" between key and value) are
// accepted for 4.5 too, which is what upstream vLLM later did by pointing
// glm45 at the glm47 parser.
//
// The call is read sequentially, so a value that mentions <tool_call> does
// not split it. An unclosed call is truncated output and a CallError (vLLM
// turns the whole output into text; Hermes requires the close tag).
type glmParser struct{}

var _ Parser = glmParser{}

func init() {
	Register("glm45", glmParser{})
	Register("glm47", glmParser{})
}

func (glmParser) Parse(text string, tools []ToolSchema) Result {
	var c collector
	first := -1
	pos := 0
	for pos < len(text) {
		k := strings.Index(text[pos:], glmOpen)
		if k < 0 {
			break
		}
		start := pos + k
		bs := start + len(glmOpen)
		j := skipSpace(text, bs)
		if j < len(text) && text[j] == '{' {
			// Hermes-style JSON inside a GLM tag: read it as such instead of
			// producing a call with an empty name.
			if first < 0 {
				first = start
			}
			pos = parseTaggedJSON(&c, text, start, j, glmOpen, glmClose)
			continue
		}
		next, attempted := glmCall(&c, text, start, bs, tools)
		if attempted && first < 0 {
			first = start
		}
		pos = next
	}
	return c.result(text, first)
}

// glmCall parses one call whose open tag ends at bs. It returns where to
// resume and whether the text was a call attempt (false: prose mentioning
// the tag).
func glmCall(c *collector, text string, start, bs int, tools []ToolSchema) (int, bool) {
	window := text[bs:min(len(text), bs+512)]
	nameEnd := len(window)
	for _, m := range []string{"\n", glmKeyOpen, glmClose, `\n`} {
		if k := strings.Index(window, m); k >= 0 && k < nameEnd {
			nameEnd = k
		}
	}
	name := strings.TrimSpace(window[:nameEnd])
	i := bs + nameEnd
	if name == "" {
		if strings.HasPrefix(text[skipSpace(text, bs):], glmClose) {
			return skipSpace(text, bs) + len(glmClose), false // empty call: nothing to run
		}
		if skipSpace(text, bs) == len(text) {
			c.fail("", "call is truncated (output ended after <tool_call>)", text[start:])
			return len(text), true
		}
		return bs, false
	}
	if !isFuncName(name) {
		return bs, false
	}
	var args argsBuilder
	for {
		i = skipGLMSpace(text, i)
		rest := text[i:]
		switch {
		case strings.HasPrefix(rest, glmClose):
			end := i + len(glmClose)
			c.ok(name, args.String(), text[start:end])
			return end, true
		case rest == "":
			c.fail(name, "call is truncated (no </tool_call>)", text[start:])
			return len(text), true
		case strings.HasPrefix(rest, glmKeyOpen):
			ks := i + len(glmKeyOpen)
			ke := strings.Index(text[ks:], glmKeyClose)
			if ke < 0 {
				return glmBad(c, text, start, ks, name, "unterminated <arg_key>"), true
			}
			key := strings.TrimSpace(text[ks : ks+ke])
			i = skipGLMSpace(text, ks+ke+len(glmKeyClose))
			if !strings.HasPrefix(text[i:], glmValueOpen) {
				if i == len(text) {
					c.fail(name, "call is truncated (no <arg_value> for "+quoteShort(key)+")", text[start:])
					return len(text), true
				}
				return glmBad(c, text, start, i, name, "<arg_key> "+quoteShort(key)+" is not followed by <arg_value>"), true
			}
			vs := i + len(glmValueOpen)
			ve := strings.Index(text[vs:], glmValueClose)
			if ve < 0 {
				return glmBad(c, text, start, vs, name, "unterminated <arg_value> for "+quoteShort(key)), true
			}
			glmAdd(&args, tools, name, key, text[vs:vs+ve])
			i = vs + ve + len(glmValueClose)
		default:
			return glmBad(c, text, start, i, name, "unexpected text in call: "+quoteShort(firstLine(rest))), true
		}
	}
}

// glmBad records a malformed call and resumes after its close tag (or at
// the next call, or at the end).
func glmBad(c *collector, text string, start, at int, name, reason string) int {
	closeAt, _, closed := tagExtent(text, at, glmOpen, glmClose)
	if !closed && closeAt == len(text) {
		reason = "call is truncated: " + reason
	}
	c.fail(name, reason, text[start:closeAt])
	return closeAt
}

// skipGLMSpace skips whitespace and the literal two-character "\n" that
// GLM-4.7 sometimes emits between tags.
func skipGLMSpace(s string, i int) int {
	for i < len(s) {
		if isJSONSpace(s[i]) {
			i++
		} else if s[i] == '\\' && i+1 < len(s) && s[i+1] == 'n' {
			i += 2
		} else {
			break
		}
	}
	return i
}

func firstLine(s string) string {
	if k := strings.IndexByte(s, '\n'); k >= 0 {
		s = s[:k]
	}
	return s
}

// glmAdd types a value as vLLM's glm4_moe parser does, with the shared
// §4.1 coercion where a schema gives types: a string-only parameter keeps
// the value byte for byte (whitespace included); without a schema, JSON
// values and Python literals are recognised, anything else is a string.
func glmAdd(args *argsBuilder, tools []ToolSchema, fn, key, raw string) {
	if types, known := schemaParamTypes(tools, fn, key); known {
		if len(types) == 1 && types[0] == "string" {
			args.addString(key, raw)
			return
		}
		args.addCoerced(key, raw, types)
		return
	}
	args.add(key, literalValue(raw))
}

// literalValue reads an untyped value: JSON, then the Python literals a
// model trained on Python tools writes, then a trimmed string.
func literalValue(raw string) json.RawMessage {
	v := strings.TrimSpace(raw)
	if v == "" {
		return appendJSONString(nil, v)
	}
	switch v {
	case "True":
		return json.RawMessage("true")
	case "False":
		return json.RawMessage("false")
	case "None":
		return json.RawMessage("null")
	}
	if c := v[0]; c == '{' || c == '[' || c == '"' || c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n' {
		if end, err := scanValue(v, 0); err == nil && end == len(v) {
			if out, err := compactJSON(v); err == nil {
				return json.RawMessage(out)
			}
		}
	}
	return appendJSONString(nil, v)
}

// schemaParamTypes is paramTypes that also says whether the schema knew the
// parameter at all.
func schemaParamTypes(tools []ToolSchema, fn, param string) ([]string, bool) {
	for i := range tools {
		if tools[i].Name != fn {
			continue
		}
		t, ok := propertyTypes(tools[i].Parameters)[param]
		return t, ok
	}
	return nil, false
}
