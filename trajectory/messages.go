package trajectory

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// chatMessage is the subset of an OpenAI chat message the exports read.
type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       string          `json:"name,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	ToolCalls  []chatToolCall  `json:"tool_calls,omitempty"`
	// Reasoning as vLLM (reasoning_content) and OpenRouter-style APIs
	// (reasoning) return it.
	ReasoningContent string `json:"reasoning_content,omitempty"`
	Reasoning        string `json:"reasoning,omitempty"`
}

type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func (m *chatMessage) reasoning() string {
	if m.ReasoningContent != "" {
		return m.ReasoningContent
	}
	return m.Reasoning
}

// text returns the content as plain text: a string, or the concatenated text
// parts of a content-part list; null is empty.
func (m *chatMessage) text() string {
	c := bytes.TrimSpace(m.Content)
	if len(c) == 0 || string(c) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(c, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(c, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return string(c)
}

// recordRef names a record in error messages.
func recordRef(r *Record) string {
	if r.Branch > 0 {
		return fmt.Sprintf("run %q group %q rollout %d branch %d", r.RunID, r.GroupID, r.RolloutIndex, r.Branch)
	}
	return fmt.Sprintf("run %q group %q rollout %d", r.RunID, r.GroupID, r.RolloutIndex)
}

func parseMessages(r *Record) ([]chatMessage, error) {
	if strings.TrimSpace(r.Messages) == "" {
		return nil, nil
	}
	var msgs []chatMessage
	if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
		return nil, fmt.Errorf("%s: messages column is not a JSON list of chat messages: %w", recordRef(r), err)
	}
	return msgs, nil
}

// rawMessages returns the messages column as a list of raw JSON objects, so
// exports pass every field (tool calls, reasoning) through unchanged.
func rawMessages(r *Record) ([]json.RawMessage, error) {
	if strings.TrimSpace(r.Messages) == "" {
		return []json.RawMessage{}, nil
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
		return nil, fmt.Errorf("%s: messages column is not a JSON list: %w", recordRef(r), err)
	}
	return msgs, nil
}

func rawTools(r *Record) (json.RawMessage, error) {
	t := strings.TrimSpace(r.Tools)
	if t == "" || t == "null" || t == "[]" {
		return nil, nil
	}
	if !json.Valid([]byte(t)) {
		return nil, fmt.Errorf("%s: tools column is not JSON", recordRef(r))
	}
	return json.RawMessage(t), nil
}

// pyJSON re-serialises JSON with Python json.dumps spacing (", " and ": "),
// keeping key order and number text, without HTML escaping: the form Hermes
// training data uses inside <tool_call> and <tool_response>.
func pyJSON(raw []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	type frame struct {
		obj   bool
		n     int
		isKey bool
	}
	var stack []frame
	writeStr := func(s string) {
		var sb bytes.Buffer
		enc := json.NewEncoder(&sb)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		b.Write(bytes.TrimRight(sb.Bytes(), "\n"))
	}
	before := func() {
		if len(stack) == 0 {
			return
		}
		f := &stack[len(stack)-1]
		if f.obj {
			if f.isKey {
				if f.n > 0 {
					b.WriteString(", ")
				}
			} else {
				b.WriteString(": ")
			}
		} else if f.n > 0 {
			b.WriteString(", ")
		}
	}
	after := func() {
		if len(stack) == 0 {
			return
		}
		f := &stack[len(stack)-1]
		if f.obj {
			if f.isKey {
				f.isKey = false
			} else {
				f.isKey = true
				f.n++
			}
		} else {
			f.n++
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", err
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				before()
				b.WriteRune(rune(v))
				stack = append(stack, frame{obj: v == '{', isKey: v == '{'})
			case '}', ']':
				stack = stack[:len(stack)-1]
				b.WriteRune(rune(v))
				after()
			}
		case string:
			before()
			writeStr(v)
			after()
		case json.Number:
			before()
			b.WriteString(v.String())
			after()
		case bool:
			before()
			fmt.Fprint(&b, v)
			after()
		case nil:
			before()
			b.WriteString("null")
			after()
		}
	}
	return b.String(), nil
}

// marshalNoEscape encodes v as one JSON line without HTML escaping (so
// <tool_call> stays readable in the output files).
func marshalNoEscape(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
