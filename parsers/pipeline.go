package parsers

import (
	"bytes"
	"encoding/json"
)

// Parsed is one model output split into reasoning, content and tool calls:
// what an OpenAI-compatible server would return as the assistant message.
type Parsed struct {
	Reasoning *string
	Content   *string
	ToolCalls []ToolCall
	Errors    []CallError
}

// Split runs reasoning separation (when rp is non-nil) and then tool-call
// parsing on what remains, in vLLM's order: the tool parser never sees the
// reasoning, so a call the model merely considered while thinking is not
// executed.
func Split(text string, tp Parser, rp ReasoningParser, tools []ToolSchema, opts ReasoningOptions) Parsed {
	var out Parsed
	content := text
	if rp != nil {
		out.Reasoning, content = rp.Extract(text, opts)
	}
	r := tp.Parse(content, tools)
	out.Content, out.ToolCalls, out.Errors = r.Content, r.ToolCalls, r.Errors
	return out
}

// MarshalJSON renders the OpenAI chat message shape:
// {"content","reasoning","tool_calls":[{"id","type":"function","function":{"name","arguments"}}],"errors"}.
// Lists are always arrays (never null) and text is not HTML-escaped.
func (p Parsed) MarshalJSON() ([]byte, error) {
	type fn struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	type call struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	msg := struct {
		Content   *string     `json:"content"`
		Reasoning *string     `json:"reasoning"`
		ToolCalls []call      `json:"tool_calls"`
		Errors    []CallError `json:"errors"`
	}{Content: p.Content, Reasoning: p.Reasoning, ToolCalls: []call{}, Errors: p.Errors}
	for _, c := range p.ToolCalls {
		msg.ToolCalls = append(msg.ToolCalls, call{ID: c.ID, Type: "function", Function: fn{c.Name, c.Arguments}})
	}
	if msg.Errors == nil {
		msg.Errors = []CallError{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(msg); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}
