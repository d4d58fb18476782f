package parsers

import "strings"

// thinkParser separates a delimited reasoning block from the answer. The
// variations between model families are all switches on this one scanner:
// which markers delimit the block, whether a missing close marker means
// "still thinking" (the chat template opened the block in the prompt) or
// "no reasoning at all", whether enable_thinking=false is honoured, and
// which other markers end reasoning implicitly (a tool call started inside
// the thinking block).
//
// Nothing is dropped: text before the open marker stays in the content
// (vLLM discards it), so that reasoning + content always account for the
// whole output apart from the markers.
type thinkParser struct {
	starts, ends []string
	// noEndIsReasoning: without a close marker the whole text is reasoning
	// (DeepSeek-R1 rule: the template already opened <think>).
	noEndIsReasoning bool
	// honorDisabled: with ReasoningOptions.ThinkingDisabled and no close
	// marker, everything is content.
	honorDisabled bool
	// implicitEnds start the content when no close marker is present; they
	// stay in the content (they belong to the tool parser).
	implicitEnds []string
	// requireStart: without an open marker there is no reasoning, even if a
	// close marker appears (markers that are ordinary words, or models
	// whose template never opens the block in the prompt).
	requireStart bool
}

var _ ReasoningParser = (*thinkParser)(nil)

// NewThinkParser returns a reasoning parser for a model that wraps its
// reasoning in start … end. Text before start is content; a block opened
// but never closed (truncated output) is all reasoning; an output with
// neither marker has no reasoning; an output with only end (the template
// opened the block) has reasoning up to end.
func NewThinkParser(start, end string) ReasoningParser {
	return &thinkParser{starts: []string{start}, ends: []string{end}}
}

func init() {
	r1 := &thinkParser{starts: []string{"<think>"}, ends: []string{"</think>"}, noEndIsReasoning: true}
	RegisterReasoning("deepseek_r1", r1)
	qwen3 := &thinkParser{starts: []string{"<think>"}, ends: []string{"</think>"}, noEndIsReasoning: true,
		honorDisabled: true, implicitEnds: []string{"<tool_call>"}}
	RegisterReasoning("qwen3", qwen3)
	RegisterReasoning("mimo", qwen3)
	v3 := &thinkParser{starts: []string{"<think>"}, ends: []string{"</think>"}, noEndIsReasoning: true, honorDisabled: true}
	RegisterReasoning("deepseek_v3", v3)
	RegisterReasoning("deepseek_v4", v3)
	RegisterReasoning("glm45", v3)
	RegisterReasoning("kimi_k2", &thinkParser{starts: []string{"<think>"}, ends: []string{"</think>"}, honorDisabled: true,
		implicitEnds: []string{kimiSectionBegin, kimiSectionBeginAlt}})
	RegisterReasoning("seed_oss", &thinkParser{starts: []string{"<seed:think>"}, ends: []string{"</seed:think>"}, noEndIsReasoning: true})
	RegisterReasoning("mistral", &thinkParser{starts: []string{"[THINK]"}, ends: []string{"[/THINK]"}, requireStart: true})
	RegisterReasoning("granite", &thinkParser{
		starts:       []string{"Here is my thought process:", "Here's my thought process:"},
		ends:         []string{"Here is my response:", "Here's my response:"},
		requireStart: true,
	})
	RegisterReasoning("think", NewThinkParser("<think>", "</think>"))
}

// firstOf returns the earliest occurrence of any marker in s.
func firstOf(s string, markers []string) (at int, marker string) {
	at = -1
	for _, m := range markers {
		if k := strings.Index(s, m); k >= 0 && (at < 0 || k < at) {
			at, marker = k, m
		}
	}
	return at, marker
}

func (p *thinkParser) Extract(text string, opts ReasoningOptions) (*string, string) {
	before, body := "", text
	started := false
	if k, m := firstOf(text, p.starts); k >= 0 {
		before, body, started = text[:k], text[k+len(m):], true
	}
	if p.requireStart && !started {
		return nil, text
	}
	if e, m := firstOf(body, p.ends); e >= 0 {
		r := body[:e]
		return &r, before + body[e+len(m):]
	}
	if p.honorDisabled && opts.ThinkingDisabled {
		return nil, text
	}
	if k, _ := firstOf(body, p.implicitEnds); k >= 0 && (started || p.noEndIsReasoning) {
		r := body[:k]
		return &r, before + body[k:]
	}
	if started || p.noEndIsReasoning {
		r := body
		return &r, before
	}
	return nil, text
}

// Harmony (gpt-oss) markers.
const (
	harmonyStart   = "<|start|>"
	harmonyChannel = "<|channel|>"
	harmonyMessage = "<|message|>"
)

// harmonyParser takes the analysis-channel messages of a gpt-oss Harmony
// output as reasoning. Every other message (commentary tool calls, final
// answer) stays in the content with its markup, because the "openai" tool
// parser reads calls and the final answer from that markup.
type harmonyParser struct{}

var _ ReasoningParser = harmonyParser{}

func init() {
	RegisterReasoning("gpt_oss", harmonyParser{})
	RegisterReasoning("openai_gptoss", harmonyParser{})
}

func (harmonyParser) Extract(text string, _ ReasoningOptions) (*string, string) {
	var reasoning []string
	var content strings.Builder
	written, pos := 0, 0 // content is copied up to written; scanning is at pos
	for {
		k := strings.Index(text[pos:], harmonyChannel)
		if k < 0 {
			break
		}
		ch := pos + k
		ms := ch + len(harmonyChannel)
		mk := strings.Index(text[ms:], harmonyMessage)
		if mk < 0 {
			break
		}
		header := text[ms : ms+mk]
		bodyStart := ms + mk + len(harmonyMessage)
		bodyEnd, next := harmonyMessageEnd(text, bodyStart)
		if strings.TrimSpace(header) == "analysis" {
			// Drop the whole analysis message: its <|start|>role header, if
			// any, the channel header, the body and the end marker.
			msgStart := ch
			if s := strings.LastIndex(text[written:ch], harmonyStart); s >= 0 {
				msgStart = written + s
			}
			reasoning = append(reasoning, text[bodyStart:bodyEnd])
			content.WriteString(text[written:msgStart])
			written = next
		}
		pos = next
	}
	if reasoning == nil {
		return nil, text
	}
	content.WriteString(text[written:])
	r := strings.Join(reasoning, "\n")
	return &r, content.String()
}

// harmonyMessageEnd finds where a message body ends (<|end|>, <|call|>,
// <|return|>, the next <|start|>, or the end of the text) and where the
// next message starts.
func harmonyMessageEnd(text string, from int) (bodyEnd, next int) {
	bodyEnd, next = len(text), len(text)
	for _, m := range []string{"<|end|>", "<|call|>", "<|return|>", harmonyStart, harmonyChannel} {
		if k := strings.Index(text[from:], m); k >= 0 && from+k < bodyEnd {
			bodyEnd = from + k
			next = bodyEnd
			if m != harmonyStart && m != harmonyChannel {
				next += len(m)
			}
		}
	}
	return bodyEnd, next
}
