package anthropic

import (
	"encoding/json"
	"fmt"
	"net/http"
	"unicode/utf8"
)

// deltaRunes is the size of the text, thinking and input JSON deltas the
// door writes: the reply is whole when the door writes it, but clients'
// accumulators are exercised with several deltas as from a real server.
const deltaRunes = 64

type stream struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error // the first write error; later writes are skipped
}

func startStream(w http.ResponseWriter) *stream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
	s := &stream{w: w, rc: http.NewResponseController(w)}
	s.flush()
	return s
}

func (s *stream) flush() {
	if s.err == nil {
		if err := s.rc.Flush(); err != nil {
			s.err = err
		}
	}
}

func (s *stream) event(name string, v any) {
	if s.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		s.err = fmt.Errorf("encode %s event: %w", name, err)
		return
	}
	_, s.err = fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", name, b)
}

type (
	blockEvent struct {
		Type         string        `json:"type"`
		Index        int           `json:"index"`
		ContentBlock *contentBlock `json:"content_block,omitempty"`
		Delta        *delta        `json:"delta,omitempty"`
	}
	delta struct {
		Type        string  `json:"type"`
		Text        *string `json:"text,omitempty"`
		Thinking    *string `json:"thinking,omitempty"`
		Signature   *string `json:"signature,omitempty"`
		PartialJSON *string `json:"partial_json,omitempty"`
	}
)

// reply writes the event sequence of a whole message: message_start,
// each block's start, deltas and stop, message_delta, message_stop.
func (s *stream) reply(m messageObj) {
	start := m
	start.Content, start.StopReason = []contentBlock{}, nil
	start.Usage.OutputTokens = 0
	s.event("message_start", map[string]any{"type": "message_start", "message": start})
	for i, b := range m.Content {
		switch b.Type {
		case "thinking":
			s.event("content_block_start", blockEvent{Type: "content_block_start", Index: i, ContentBlock: &contentBlock{Type: "thinking", Thinking: ptr(""), Signature: ptr("")}})
			for _, c := range chunks(*b.Thinking, deltaRunes) {
				s.event("content_block_delta", blockEvent{Type: "content_block_delta", Index: i, Delta: &delta{Type: "thinking_delta", Thinking: ptr(c)}})
			}
			s.event("content_block_delta", blockEvent{Type: "content_block_delta", Index: i, Delta: &delta{Type: "signature_delta", Signature: b.Signature}})
		case "text":
			s.event("content_block_start", blockEvent{Type: "content_block_start", Index: i, ContentBlock: &contentBlock{Type: "text", Text: ptr("")}})
			for _, c := range chunks(*b.Text, deltaRunes) {
				s.event("content_block_delta", blockEvent{Type: "content_block_delta", Index: i, Delta: &delta{Type: "text_delta", Text: ptr(c)}})
			}
		case "tool_use":
			s.event("content_block_start", blockEvent{Type: "content_block_start", Index: i, ContentBlock: &contentBlock{Type: "tool_use", ID: b.ID, Name: b.Name, Input: json.RawMessage("{}")}})
			for _, c := range chunks(string(b.Input), deltaRunes) {
				s.event("content_block_delta", blockEvent{Type: "content_block_delta", Index: i, Delta: &delta{Type: "input_json_delta", PartialJSON: ptr(c)}})
			}
		}
		s.event("content_block_stop", blockEvent{Type: "content_block_stop", Index: i})
	}
	s.event("message_delta", map[string]any{
		"type":  "message_delta",
		"delta": map[string]any{"stop_reason": m.StopReason, "stop_sequence": nil},
		"usage": map[string]int{"input_tokens": m.Usage.InputTokens, "output_tokens": m.Usage.OutputTokens},
	})
	s.event("message_stop", map[string]string{"type": "message_stop"})
	s.flush()
}

func chunks(s string, n int) []string {
	var out []string
	for len(s) > 0 {
		i, k := 0, 0
		for i < len(s) && k < n {
			_, w := utf8.DecodeRuneInString(s[i:])
			i += w
			k++
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	return out
}
