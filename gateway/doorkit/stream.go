package doorkit

import (
	"fmt"
	"net/http"
)

// Stream writes server-sent events on a response a door has committed to
// a 200 event stream. The first write error is kept and later writes are
// skipped: the client is gone, and the door finishes its handler quietly.
type Stream struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error
}

// StartStream sends the event stream's header and flushes it.
func StartStream(w http.ResponseWriter) *Stream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
	s := &Stream{w: w, rc: http.NewResponseController(w)}
	s.Flush()
	return s
}

// Err is the first error a write or flush met (nil while all went out).
func (s *Stream) Err() error { return s.err }

// Flush sends what was written.
func (s *Stream) Flush() {
	if s.err == nil {
		if err := s.rc.Flush(); err != nil {
			s.err = err
		}
	}
}

// Event writes one event named name whose data is v as JSON.
func (s *Stream) Event(name string, v any) {
	if s.err != nil {
		return
	}
	b, err := Marshal(v)
	if err != nil {
		s.err = fmt.Errorf("encode %s event: %w", name, err)
		return
	}
	_, s.err = fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", name, b)
}

// Data writes one unnamed event whose data is v as JSON (OpenAI Chat's
// chunks carry no event name).
func (s *Stream) Data(v any) {
	if s.err != nil {
		return
	}
	b, err := Marshal(v)
	if err != nil {
		s.err = fmt.Errorf("encode an event: %w", err)
		return
	}
	s.DataText(string(b))
}

// DataText writes one unnamed event whose data is text as it is (OpenAI
// Chat's closing "[DONE]").
func (s *Stream) DataText(text string) {
	if s.err != nil {
		return
	}
	_, s.err = fmt.Fprintf(s.w, "data: %s\n\n", text)
}

// Comment writes an SSE comment line (clients ignore it; it keeps an
// idle connection alive) and flushes.
func (s *Stream) Comment(text string) {
	if s.err != nil {
		return
	}
	_, s.err = fmt.Fprintf(s.w, ": %s\n\n", text)
	s.Flush()
}
