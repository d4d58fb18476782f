package parsers

import "strings"

// DeepSeek special tokens use U+FF5C (｜) and U+2581 (▁), not ASCII.
const (
	dsCallsBegin = "<｜tool▁calls▁begin｜>"
	dsCallsEnd   = "<｜tool▁calls▁end｜>"
	dsCallBegin  = "<｜tool▁call▁begin｜>"
	dsCallEnd    = "<｜tool▁call▁end｜>"
	dsSep        = "<｜tool▁sep｜>"
)

// deepseekParser handles DeepSeek V3/R1 (fenced: type<sep>name ```json
// args ```) and V3.1 (name<sep>args). Arguments are validated (both
// upstreams pass them through raw) and may span lines (vLLM's v3 regex
// requires one line). A call whose begin token appears without the section
// token is still parsed.
type deepseekParser struct{ v31 bool }

var _ Parser = deepseekParser{}

func init() {
	Register("deepseek_v3", deepseekParser{})
	Register("deepseek_v3_1", deepseekParser{v31: true})
	Register("deepseek_v31", deepseekParser{v31: true})
}

func (p deepseekParser) Parse(text string, _ []ToolSchema) Result {
	var c collector
	first := strings.Index(text, dsCallsBegin)
	cb := strings.Index(text, dsCallBegin)
	if first < 0 || (cb >= 0 && cb < first) {
		first = cb
	}
	if first < 0 {
		return c.result(text, -1)
	}
	pos := first
	for pos < len(text) {
		k := strings.Index(text[pos:], dsCallBegin)
		if k < 0 {
			break
		}
		start := pos + k
		bs := start + len(dsCallBegin)
		closeAt, bodyEnd, closed := tagExtent(text, bs, dsCallBegin, dsCallEnd)
		body := text[bs:bodyEnd]
		raw := text[start:closeAt]
		if !closed {
			// The section end, when present, bounds an unclosed call.
			if e := strings.Index(body, dsCallsEnd); e >= 0 {
				body = body[:e]
			}
		}
		var name, args string
		var ok bool
		if p.v31 {
			name, args, ok = deepseekV31Body(&c, body, raw)
		} else {
			name, args, ok = deepseekV3Body(&c, body, raw)
		}
		if ok {
			norm, err := rawArgs(args, closed)
			switch {
			case err != nil && !closed:
				c.fail(name, "call is truncated (no <｜tool▁call▁end｜>): "+err.Error(), raw)
			case err != nil:
				c.fail(name, err.Error(), raw)
			default:
				c.ok(name, norm, raw)
			}
		}
		pos = closeAt
	}
	// Whatever precedes the first marker is content; a section begin with no
	// call at all is reported rather than silently returning nothing.
	if len(c.r.ToolCalls)+len(c.r.Errors) == 0 {
		c.fail("", "tool-call section opened but no call found", text[first:])
	}
	return c.result(text, first)
}

func deepseekV31Body(c *collector, body, raw string) (name, args string, ok bool) {
	sp := strings.Index(body, dsSep)
	if sp < 0 {
		c.fail("", "call has no <｜tool▁sep｜> (truncated or malformed)", raw)
		return "", "", false
	}
	name = strings.TrimSpace(body[:sp])
	if !isFuncName(name) {
		c.fail("", "call has no valid function name", raw)
		return "", "", false
	}
	return name, body[sp+len(dsSep):], true
}

func deepseekV3Body(c *collector, body, raw string) (name, args string, ok bool) {
	sp := strings.Index(body, dsSep)
	if sp < 0 {
		c.fail("", "call has no <｜tool▁sep｜> (truncated or malformed)", raw)
		return "", "", false
	}
	rest := body[sp+len(dsSep):]
	nameEnd := len(rest)
	for _, m := range []string{"\n", "```", "{"} {
		if k := strings.Index(rest, m); k >= 0 && k < nameEnd {
			nameEnd = k
		}
	}
	name = strings.TrimSpace(rest[:nameEnd])
	if !isFuncName(name) {
		c.fail("", "call has no valid function name", raw)
		return "", "", false
	}
	a := strings.TrimSpace(rest[nameEnd:])
	if !strings.HasPrefix(a, "```") {
		return name, a, true // fence missing: accept bare JSON
	}
	a = a[3:]
	if nl := strings.IndexByte(a, '\n'); nl >= 0 && !strings.Contains(a[:nl], "{") {
		a = a[nl+1:] // drop the "json" info string
	} else {
		a = strings.TrimPrefix(a, "json")
	}
	j := skipSpace(a, 0)
	end, err := scanValue(a, j)
	if err != nil {
		return name, a, true // normalizeArgs reports the error
	}
	tail := strings.TrimSpace(a[end:])
	if tail != "" && tail != "```" {
		c.fail(name, "unexpected text after the arguments", raw)
		return "", "", false
	}
	return name, a[j:end], true
}

// rawArgs validates the argument text of a token-delimited call. A closed
// call with nothing between the markers is a call without arguments (what a
// zero-parameter tool gets); an unclosed one is truncated.
func rawArgs(args string, closed bool) (string, error) {
	args = strings.TrimSpace(args)
	if closed && args == "" {
		return "{}", nil
	}
	return normalizeTrimmed(args)
}
