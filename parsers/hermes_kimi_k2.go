package parsers

import "strings"

const (
	kimiSectionBegin    = "<|tool_calls_section_begin|>"
	kimiSectionBeginAlt = "<|tool_call_section_begin|>"
	kimiCallBegin       = "<|tool_call_begin|>"
	kimiArgBegin        = "<|tool_call_argument_begin|>"
	kimiCallEnd         = "<|tool_call_end|>"
)

// kimiK2Parser reads Kimi K2 calls. The model's id (functions.NAME:IDX) is
// the call id, as in vLLM, so multi-turn ids stay continuous. Deviations:
// arguments are validated; an id without ":IDX" is a CallError instead of
// a silently skipped call; a dotted name keeps its dots (upstream keeps
// only the last segment); calls whose section token is missing still count.
type kimiK2Parser struct{}

var _ Parser = kimiK2Parser{}

func init() { Register("kimi_k2", kimiK2Parser{}) }

func (kimiK2Parser) Parse(text string, _ []ToolSchema) Result {
	var c collector
	first := kimiFirstMarker(text)
	if first < 0 {
		return c.result(text, -1)
	}
	pos := first
	for pos < len(text) {
		k := strings.Index(text[pos:], kimiCallBegin)
		if k < 0 {
			break
		}
		start := pos + k
		bs := start + len(kimiCallBegin)
		ab, bodyEnd, closeAt, closed := kimiCallExtent(text, bs)
		raw := text[start:closeAt]
		pos = closeAt
		if ab < 0 {
			c.fail("", "call has no <|tool_call_argument_begin|> (truncated or malformed)", raw)
			continue
		}
		id := strings.TrimSpace(text[bs:ab])
		name, ok := kimiName(id)
		if !ok {
			c.fail("", "call id "+quoteShort(id)+" is not functions.NAME:IDX", raw)
			continue
		}
		args := text[ab+len(kimiArgBegin) : bodyEnd]
		if !closed {
			if e := strings.Index(args, "<|tool_calls_section_end|>"); e >= 0 {
				args = args[:e]
			}
		}
		norm, err := rawArgs(args, closed)
		switch {
		case err != nil && !closed:
			c.fail(name, "call is truncated (no <|tool_call_end|>): "+err.Error(), raw)
		case err != nil:
			c.fail(name, err.Error(), raw)
		default:
			c.okNative(id, name, norm, raw)
		}
	}
	if len(c.r.ToolCalls)+len(c.r.Errors) == 0 {
		c.fail("", "tool-call section opened but no call found", text[first:])
	}
	return c.result(text, first)
}

// kimiFirstMarker is the offset of the first section or call marker, or
// -1. The three markers share the prefix "<|tool_call", so one scan of the
// text finds the earliest of them (three strings.Index calls would each
// read the whole prose when a marker is absent).
func kimiFirstMarker(text string) int {
	const prefix = "<|tool_call"
	for from := 0; ; {
		k := strings.Index(text[from:], prefix)
		if k < 0 {
			return -1
		}
		at := text[from+k:]
		if strings.HasPrefix(at, kimiCallBegin) || strings.HasPrefix(at, kimiSectionBegin) || strings.HasPrefix(at, kimiSectionBeginAlt) {
			return from + k
		}
		from += k + 1
	}
}

// kimiCallExtent reads the call whose begin marker ends at bs. Like
// tagExtent, its body ends at the first end marker (closed) or at the next
// begin marker, else at the end of the text; ab is the first argument
// marker inside the body, or -1. Every marker starts with '<', which the
// id and the JSON rarely contain, so one walk over the '<' of the body
// finds all three instead of three searches of the text.
func kimiCallExtent(text string, bs int) (ab, bodyEnd, closeAt int, closed bool) {
	ab = -1
	for i := bs; ; i++ {
		k := strings.IndexByte(text[i:], '<')
		if k < 0 {
			return ab, len(text), len(text), false
		}
		i += k
		// No text starts with two of the markers, so the order of the
		// tests is free: the argument marker, met first, is tested first.
		switch at := text[i:]; {
		case ab < 0 && strings.HasPrefix(at, kimiArgBegin):
			ab = i
		case strings.HasPrefix(at, kimiCallEnd):
			return ab, i, i + len(kimiCallEnd), true
		case strings.HasPrefix(at, kimiCallBegin):
			return ab, i, i, false
		}
	}
}

// kimiName extracts NAME from "functions.NAME:IDX" (the prefix is optional).
func kimiName(id string) (string, bool) {
	colon := strings.LastIndexByte(id, ':')
	if colon < 0 || colon == len(id)-1 {
		return "", false
	}
	for i := colon + 1; i < len(id); i++ {
		if id[i] < '0' || id[i] > '9' {
			return "", false
		}
	}
	name := strings.TrimPrefix(id[:colon], "functions.")
	return name, isFuncName(name)
}

func quoteShort(s string) string {
	if len(s) > 60 {
		s = s[:60] + "…"
	}
	return "\"" + s + "\""
}
