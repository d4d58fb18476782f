package anthropic

import (
	"encoding/json"
	"net/http"

	"github.com/rollout-rl/rollout/gateway/doorkit"
)

// stream writes the Messages event sequence: each event is named by its
// type.
type stream struct{ *doorkit.Stream }

func startStream(w http.ResponseWriter) *stream { return &stream{doorkit.StartStream(w)} }

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
	s.Event("message_start", map[string]any{"type": "message_start", "message": start})
	for i, b := range m.Content {
		switch b.Type {
		case "thinking":
			s.Event("content_block_start", blockEvent{Type: "content_block_start", Index: i, ContentBlock: &contentBlock{Type: "thinking", Thinking: ptr(""), Signature: ptr("")}})
			for _, c := range doorkit.Chunks(*b.Thinking, doorkit.DeltaRunes) {
				s.Event("content_block_delta", blockEvent{Type: "content_block_delta", Index: i, Delta: &delta{Type: "thinking_delta", Thinking: ptr(c)}})
			}
			s.Event("content_block_delta", blockEvent{Type: "content_block_delta", Index: i, Delta: &delta{Type: "signature_delta", Signature: b.Signature}})
		case "text":
			s.Event("content_block_start", blockEvent{Type: "content_block_start", Index: i, ContentBlock: &contentBlock{Type: "text", Text: ptr("")}})
			for _, c := range doorkit.Chunks(*b.Text, doorkit.DeltaRunes) {
				s.Event("content_block_delta", blockEvent{Type: "content_block_delta", Index: i, Delta: &delta{Type: "text_delta", Text: ptr(c)}})
			}
		case "tool_use":
			s.Event("content_block_start", blockEvent{Type: "content_block_start", Index: i, ContentBlock: &contentBlock{Type: "tool_use", ID: b.ID, Name: b.Name, Input: json.RawMessage("{}")}})
			for _, c := range doorkit.Chunks(string(b.Input), doorkit.DeltaRunes) {
				s.Event("content_block_delta", blockEvent{Type: "content_block_delta", Index: i, Delta: &delta{Type: "input_json_delta", PartialJSON: ptr(c)}})
			}
		}
		s.Event("content_block_stop", blockEvent{Type: "content_block_stop", Index: i})
	}
	s.Event("message_delta", map[string]any{
		"type":  "message_delta",
		"delta": map[string]any{"stop_reason": m.StopReason, "stop_sequence": nil},
		"usage": map[string]int{"input_tokens": m.Usage.InputTokens, "output_tokens": m.Usage.OutputTokens},
	})
	s.Event("message_stop", map[string]string{"type": "message_stop"})
	s.Flush()
}
