package responses

import (
	"net/http"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/doorkit"
)

// stream writes the Responses server-sent events: each event is named by
// its type and carries a sequence_number counting from 0.
type stream struct {
	*doorkit.Stream
	seq int
}

func startStream(w http.ResponseWriter) *stream { return &stream{Stream: doorkit.StartStream(w)} }

// event writes one event: fields plus its type and sequence number.
func (s *stream) event(typ string, fields map[string]any) {
	if s.Err() != nil {
		return
	}
	fields["type"] = typ
	fields["sequence_number"] = s.seq
	s.seq++
	s.Event(typ, fields)
}

// reply writes the whole event sequence of a successful reply.
func (s *stream) reply(resp response, rep gateway.Reply, encrypted bool) {
	s.event("response.created", map[string]any{"response": resp})
	s.event("response.in_progress", map[string]any{"response": resp})
	for i, it := range items(rep, encrypted) {
		switch it := it.(type) {
		case reasoningItem:
			added := it
			added.Content, added.EncryptedContent, added.Status = []textPart{}, nil, "in_progress"
			s.event("response.output_item.added", map[string]any{"output_index": i, "item": added})
			s.textPart(it.ID, i, textPart{Type: "reasoning_text"}, "response.reasoning_text", rep.Reasoning)
			s.event("response.output_item.done", map[string]any{"output_index": i, "item": it})
		case messageItem:
			added := it
			added.Status, added.Content = "in_progress", []textPart{}
			s.event("response.output_item.added", map[string]any{"output_index": i, "item": added})
			s.textPart(it.ID, i, outText(""), "response.output_text", rep.Content)
			s.event("response.output_item.done", map[string]any{"output_index": i, "item": it})
		case functionCallItem:
			added := it
			added.Status, added.Arguments = "in_progress", ""
			s.event("response.output_item.added", map[string]any{"output_index": i, "item": added})
			for _, d := range doorkit.Chunks(it.Arguments, doorkit.DeltaRunes) {
				s.event("response.function_call_arguments.delta", map[string]any{"item_id": it.ID, "output_index": i, "delta": d})
			}
			s.event("response.function_call_arguments.done", map[string]any{"item_id": it.ID, "output_index": i, "name": it.Name, "arguments": it.Arguments})
			s.event("response.output_item.done", map[string]any{"output_index": i, "item": it})
		}
	}
	finish(&resp, rep, encrypted)
	if resp.Status == "incomplete" {
		s.event("response.incomplete", map[string]any{"response": resp})
	} else {
		s.event("response.completed", map[string]any{"response": resp})
	}
	s.Flush()
}

// textPart writes a content part's added, delta…, done and part done
// events; kind is the delta events' type prefix.
func (s *stream) textPart(itemID string, index int, empty textPart, kind, text string) {
	s.event("response.content_part.added", map[string]any{"item_id": itemID, "output_index": index, "content_index": 0, "part": empty})
	for _, d := range doorkit.Chunks(text, doorkit.DeltaRunes) {
		ev := map[string]any{"item_id": itemID, "output_index": index, "content_index": 0, "delta": d}
		if kind == "response.output_text" {
			ev["logprobs"] = []any{}
		}
		s.event(kind+".delta", ev)
	}
	done := map[string]any{"item_id": itemID, "output_index": index, "content_index": 0, "text": text}
	if kind == "response.output_text" {
		done["logprobs"] = []any{}
	}
	s.event(kind+".done", done)
	full := empty
	full.Text = text
	s.event("response.content_part.done", map[string]any{"item_id": itemID, "output_index": index, "content_index": 0, "part": full})
}

// failed ends a stream that had started when the Completer failed.
func (s *stream) failed(resp response, err error) {
	resp.Status = "failed"
	resp.Error = &respError{Code: failureCode(err), Message: err.Error()}
	s.event("response.failed", map[string]any{"response": resp})
	s.Flush()
}
