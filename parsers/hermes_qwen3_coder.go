package parsers

import "strings"

const (
	qcToolOpen   = "<tool_call>"
	qcToolClose  = "</tool_call>"
	qcFuncOpen   = "<function="
	qcFuncClose  = "</function>"
	qcParamOpen  = "<parameter="
	qcParamClose = "</parameter>"
)

// qwen3CoderParser reads the Qwen3-Coder XML format:
// <tool_call><function=NAME><parameter=K>V</parameter>…</function></tool_call>.
// Values are typed from the tool schema with the shared §4.1 coercion
// (vLLM's rule; Hermes types schema-blind, so "123" for a string parameter
// became 123). Like vLLM it tolerates a missing </parameter> and a missing
// <tool_call> wrapper, and several functions in one wrapper. Unlike both
// upstreams, a <function=…> without the wrapper is a call only when it is
// closed or has parameters (prose "<function=foo>" is text), a malformed
// name is a CallError, and a call cut off before </function> is a CallError
// rather than a call with possibly-truncated values.
type qwen3CoderParser struct{}

var _ Parser = qwen3CoderParser{}

func init() { Register("qwen3_coder", qwen3CoderParser{}) }

func (qwen3CoderParser) Parse(text string, tools []ToolSchema) Result {
	var c collector
	first := -1
	pos := 0
	for pos < len(text) {
		tk := strings.Index(text[pos:], qcToolOpen)
		fk := strings.Index(text[pos:], qcFuncOpen)
		if tk < 0 && fk < 0 {
			break
		}
		if tk >= 0 && (fk < 0 || tk < fk) {
			start := pos + tk
			bs := start + len(qcToolOpen)
			j := skipSpace(text, bs)
			switch {
			case strings.HasPrefix(text[j:], qcFuncOpen):
				if first < 0 {
					first = start
				}
				pos = qwenFunctions(&c, text, start, j, tools)
			case j < len(text) && text[j] == '{':
				if first < 0 {
					first = start
				}
				pos = parseTaggedJSON(&c, text, start, j, qcToolOpen, qcToolClose)
			case strings.HasPrefix(qcFuncOpen, text[j:]):
				// The output ends inside (or right before) "<function=".
				if first < 0 {
					first = start
				}
				c.fail("", "call is truncated (output ended after <tool_call>)", text[start:])
				pos = len(text)
			case strings.HasPrefix(text[j:], qcToolClose):
				pos = j + len(qcToolClose)
			default:
				pos = bs // prose mentioning the tag
			}
			continue
		}
		start := pos + fk
		next, attempted := qwenFunction(&c, text, start, start, false, tools)
		if attempted && first < 0 {
			first = start
		}
		pos = next
	}
	return c.result(text, first)
}

// qwenFunctions parses the functions of one <tool_call> wrapper starting at
// the first <function= (j) and returns where scanning resumes.
func qwenFunctions(c *collector, text string, start, j int, tools []ToolSchema) int {
	for {
		next, _ := qwenFunction(c, text, start, j, true, tools)
		k := skipSpace(text, next)
		switch {
		case strings.HasPrefix(text[k:], qcToolClose):
			return k + len(qcToolClose)
		case strings.HasPrefix(text[k:], qcFuncOpen) && next > j:
			start, j = k, k
		default:
			return next
		}
	}
}

// qwenFunction parses <function=NAME>…</function> at fs. callStart is where
// the raw call text starts (the wrapper, if any). It returns the resume
// position and whether this was a call attempt.
func qwenFunction(c *collector, text string, callStart, fs int, wrapped bool, tools []ToolSchema) (int, bool) {
	ns := fs + len(qcFuncOpen)
	window := text[ns:min(len(text), ns+512)]
	gt := strings.IndexByte(window, '>')
	if gt < 0 || !isFuncName(strings.TrimSpace(window[:gt])) {
		if !wrapped {
			return ns, false
		}
		end := qwenResync(text, ns)
		if gt < 0 && end == len(text) && len(window) == len(text)-ns {
			c.fail("", "call is truncated inside <function=…>", text[callStart:end])
		} else {
			c.fail("", "malformed function name after <function=", text[callStart:end])
		}
		return end, true
	}
	name := strings.TrimSpace(window[:gt])
	i := ns + gt + 1
	var args argsBuilder
	for {
		i = skipSpace(text, i)
		rest := text[i:]
		switch {
		case strings.HasPrefix(rest, qcFuncClose):
			end := i + len(qcFuncClose)
			c.ok(name, args.String(), text[callStart:end])
			return end, true
		case wrapped && strings.HasPrefix(rest, qcToolClose):
			// </function> forgotten but the wrapper closed: the call is
			// complete (vLLM accepts this too). Leave the close tag to the
			// caller.
			c.ok(name, args.String(), text[callStart:i])
			return i, true
		case strings.HasPrefix(rest, qcParamOpen):
			ps := i + len(qcParamOpen)
			pw := text[ps:min(len(text), ps+512)]
			pgt := strings.IndexByte(pw, '>')
			if pgt < 0 {
				if ps+len(pw) == len(text) {
					c.fail(name, "call is truncated inside <parameter=…>", text[callStart:])
					return len(text), true
				}
				end := qwenResync(text, ps)
				c.fail(name, "malformed <parameter=…> tag", text[callStart:end])
				return end, true
			}
			key := strings.TrimSpace(pw[:pgt])
			vs := ps + pgt + 1
			ve, next, ok := qwenValueEnd(text, vs)
			if !ok {
				c.fail(name, "call is truncated (no </function>) in parameter "+quoteShort(key), text[callStart:])
				return len(text), true
			}
			v := text[vs:ve]
			v = strings.TrimPrefix(v, "\n")
			v = strings.TrimSuffix(v, "\n")
			args.addCoerced(key, v, paramTypes(tools, name, key))
			i = next
		case rest == "":
			if !wrapped && args.len() == 0 {
				return fs + len(qcFuncOpen), false
			}
			c.fail(name, "call is truncated (no </function>)", text[callStart:])
			return len(text), true
		default:
			// Stray text between parameters: vLLM's regex ignores it, so do
			// we, up to the next tag of this call.
			k := strings.IndexByte(rest, '<')
			if k <= 0 {
				if k == 0 { // an unknown tag
					k = 1
				} else {
					k = len(rest)
				}
			}
			i += k
		}
	}
}

// qwenValueEnd finds where a parameter value starting at vs ends:
// </parameter>, or (tolerated) the next <parameter= or </function>. next is
// where parsing continues. ok is false when the text ends first.
func qwenValueEnd(text string, vs int) (ve, next int, ok bool) {
	rest := text[vs:]
	pe := strings.Index(rest, qcParamClose)
	limit := rest
	if pe >= 0 {
		limit = rest[:pe]
	}
	cut := -1
	for _, m := range []string{qcParamOpen, qcFuncClose, qcToolClose} {
		if k := strings.Index(limit, m); k >= 0 && (cut < 0 || k < cut) {
			cut = k
		}
	}
	switch {
	case cut >= 0:
		return vs + cut, vs + cut, true
	case pe >= 0:
		return vs + pe, vs + pe + len(qcParamClose), true
	}
	return 0, 0, false
}

// qwenResync finds where to resume after a malformed call: after the next
// </tool_call> or </function>, or at the end.
func qwenResync(text string, at int) int {
	best := len(text)
	for _, m := range []string{qcToolClose, qcFuncClose} {
		if k := strings.Index(text[at:], m); k >= 0 && at+k+len(m) < best {
			best = at + k + len(m)
		}
	}
	return best
}
