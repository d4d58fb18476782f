// Package doorkit holds what the gateway's front doors share and no API
// shapes: reading a request body (bounded by the server, once), decode
// helpers, the JSON answer writer, the wait for a reply with keep-alive
// ticks, the server-sent event writer and the rune-bounded delta
// splitting. The contract package gateway
// stays types only; each door keeps its API's wire shapes and errors.
package doorkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/rollout-rl/rollout/gateway"
)

// DefaultKeepAlive is a door's keep-alive interval when its KeepAlive is 0.
const DefaultKeepAlive = 10 * time.Second

// DeltaRunes is the size, in runes, of the text and argument deltas a
// door writes: the reply is whole when the door writes it, but clients'
// stream accumulators are exercised with several deltas as from a real
// server.
const DeltaRunes = 64

// ReadBody reads r's body. The body's bound is the server's, one for
// every route (capture.Handler wraps each request in an
// http.MaxBytesReader of Options.MaxBodyBytes); TooLarge reports a body
// over it.
func ReadBody(r *http.Request) ([]byte, error) {
	return io.ReadAll(r.Body)
}

// TooLarge reports whether err is ReadBody's error for a body over the
// server's bound, and the bound.
func TooLarge(err error) (limit int64, ok bool) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return tooBig.Limit, true
	}
	return 0, false
}

// Marshal is v as JSON the way every door writes it: without HTML
// escaping (model text is full of <tool_call> and the like, which a
// client reads the same either way) and without a trailing newline.
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// WriteJSON writes v as a JSON answer with status and a closing newline
// (as json.Encoder ends a value), in one write with its Content-Length. An encoding failure (a door bug: its shapes are plain
// structs) is a 500 in no API's shape; a write failure means the client
// left, and is only logged at debug level.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := Marshal(v)
	if err != nil {
		http.Error(w, "encode the answer: "+err.Error(), http.StatusInternalServerError)
		return
	}
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	if _, err := w.Write(b); err != nil {
		slog.Debug("gateway: write answer", "err", err)
	}
}

// IsSet reports whether a raw field was given a value other than null.
func IsSet(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// Requested picks the fields of a request body named in keys, decoded,
// for Call.Requested: what the harness asked of the sampler, recorded
// and never applied. nil when none is present.
func Requested(fields map[string]json.RawMessage, keys []string) map[string]any {
	var out map[string]any
	for _, k := range keys {
		if raw, ok := fields[k]; ok {
			if out == nil {
				out = map[string]any{}
			}
			var v any
			_ = json.Unmarshal(raw, &v)
			out[k] = v
		}
	}
	return out
}

// KeepAlive is d, or DefaultKeepAlive when d is not positive.
func KeepAlive(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return DefaultKeepAlive
}

// Await asks c for the reply to call in session and waits for it. When
// tick is not nil and the reply takes longer than every (DefaultKeepAlive
// when 0), tick is called, then again every interval until the reply
// comes: a streaming door commits to its event stream on the first tick
// and writes a keep-alive. Complete runs under ctx, so a request whose
// client leaves ends it, and Await returns only once it has.
func Await(ctx context.Context, c gateway.Completer, session string, call gateway.Call, every time.Duration, tick func()) (gateway.Reply, error) {
	if tick == nil {
		return c.Complete(ctx, session, call)
	}
	type result struct {
		rep gateway.Reply
		err error
	}
	ch := make(chan result, 1)
	go func() {
		rep, err := c.Complete(ctx, session, call)
		ch <- result{rep, err}
	}()
	every = KeepAlive(every)
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case res := <-ch:
			return res.rep, res.err
		case <-timer.C:
			tick()
			timer.Reset(every)
		}
	}
}

// Chunks splits s into pieces of at most n runes (none for "").
func Chunks(s string, n int) []string {
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
