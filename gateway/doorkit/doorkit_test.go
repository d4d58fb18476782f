package doorkit

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/gateway"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestChunks(t *testing.T) {
	if got := Chunks("", 4); got != nil {
		t.Fatalf("Chunks(\"\") = %q, want none", got)
	}
	s := strings.Repeat("é✓a", 30) // 90 runes of 1 to 3 bytes
	got := Chunks(s, 64)
	if len(got) != 2 || strings.Join(got, "") != s {
		t.Fatalf("Chunks: %d pieces, joined equal %v", len(got), strings.Join(got, "") == s)
	}
	for i, c := range got {
		if !utf8.ValidString(c) {
			t.Errorf("piece %d splits a character: %q", i, c)
		}
	}
	if n := utf8.RuneCountInString(got[0]); n != 64 {
		t.Errorf("first piece has %d runes, want 64", n)
	}
}

func TestIsSet(t *testing.T) {
	for raw, want := range map[string]bool{"": false, "null": false, " null ": false, "0": true, `""`: true, "{}": true} {
		if got := IsSet(json.RawMessage(raw)); got != want {
			t.Errorf("IsSet(%q) = %v, want %v", raw, got, want)
		}
	}
}

func TestRequested(t *testing.T) {
	fields := map[string]json.RawMessage{"temperature": json.RawMessage("0.7"), "stop": json.RawMessage(`["x"]`), "model": json.RawMessage(`"m"`)}
	got := Requested(fields, []string{"temperature", "stop", "seed"})
	want := map[string]any{"temperature": 0.7, "stop": []any{"x"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Requested = %v, want %v", got, want)
	}
	if got := Requested(fields, []string{"seed"}); got != nil {
		t.Fatalf("Requested of absent keys = %v, want nil", got)
	}
}

func TestKeepAlive(t *testing.T) {
	if KeepAlive(0) != DefaultKeepAlive || KeepAlive(-1) != DefaultKeepAlive || KeepAlive(time.Second) != time.Second {
		t.Fatal("KeepAlive: want the default for 0 and below, else the value")
	}
}

func TestReadBody(t *testing.T) {
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"a":1}`))
	if b, err := ReadBody(r); err != nil || string(b) != `{"a":1}` {
		t.Fatalf("ReadBody = %q, %v", b, err)
	}
	// The server's bound (capture.Handler's MaxBytesReader) is the one.
	r = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat("x", 101)))
	r.Body = http.MaxBytesReader(w, r.Body, 100)
	_, err := ReadBody(r)
	if limit, ok := TooLarge(err); !ok || limit != 100 {
		t.Fatalf("ReadBody over the bound: err %v, TooLarge = %d, %v", err, limit, ok)
	}
	if _, ok := TooLarge(errors.New("other")); ok {
		t.Fatal("TooLarge of another error is true")
	}
}

func TestWriteJSON(t *testing.T) {
	w := httptest.NewRecorder()
	WriteJSON(w, http.StatusTeapot, map[string]string{"text": "<tool_call>&"})
	if w.Code != http.StatusTeapot || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", w.Code, w.Header().Get("Content-Type"))
	}
	if got, want := w.Body.String(), `{"text":"<tool_call>&"}`+"\n"; got != want {
		t.Fatalf("body %q, want %q (no HTML escaping)", got, want)
	}
	if w.Header().Get("Content-Length") != "24" {
		t.Fatalf("Content-Length %q", w.Header().Get("Content-Length"))
	}
	w = httptest.NewRecorder()
	WriteJSON(w, http.StatusOK, func() {})
	if w.Code != http.StatusInternalServerError {
		t.Fatalf("unencodable answer: status %d, want 500", w.Code)
	}
}

func TestStream(t *testing.T) {
	w := httptest.NewRecorder()
	s := StartStream(w)
	s.Event("ping", map[string]string{"type": "ping"})
	s.Comment("keep-alive")
	s.Data(map[string]string{"t": "<x>"})
	s.DataText("[DONE]")
	s.Flush()
	if s.Err() != nil {
		t.Fatal(s.Err())
	}
	if ct := w.Header().Get("Content-Type"); ct != "text/event-stream" || w.Code != http.StatusOK || !w.Flushed {
		t.Fatalf("header: %d %q flushed %v", w.Code, ct, w.Flushed)
	}
	want := "event: ping\ndata: {\"type\":\"ping\"}\n\n: keep-alive\n\ndata: {\"t\":\"<x>\"}\n\ndata: [DONE]\n\n"
	if got := w.Body.String(); got != want {
		t.Fatalf("body %q, want %q", got, want)
	}
}

// failing fails every write after the first.
type failing struct {
	*httptest.ResponseRecorder
	writes int
}

func (f *failing) Write(b []byte) (int, error) {
	f.writes++
	if f.writes > 1 {
		return 0, errors.New("connection reset")
	}
	return f.ResponseRecorder.Write(b)
}

func TestStreamLatchesTheFirstError(t *testing.T) {
	f := &failing{ResponseRecorder: httptest.NewRecorder()}
	s := StartStream(f)
	s.Event("a", 1)
	s.Event("b", 2)
	if s.Err() == nil || !strings.Contains(s.Err().Error(), "connection reset") {
		t.Fatalf("Err = %v, want the write error", s.Err())
	}
	s.Event("c", 3)
	s.Comment("keep-alive")
	if f.writes != 2 {
		t.Fatalf("%d writes, want none after the failed one", f.writes)
	}
	if got := f.Body.String(); got != "event: a\ndata: 1\n\n" {
		t.Fatalf("body %q", got)
	}

	s = StartStream(httptest.NewRecorder())
	s.Event("bad", math.NaN())
	if s.Err() == nil || !strings.Contains(s.Err().Error(), "encode bad event") {
		t.Fatalf("Err = %v, want the encode error", s.Err())
	}
}

// completer answers once released.
type completer struct {
	release chan struct{}
	err     error
	mu      sync.Mutex
	session string
}

func (c *completer) Complete(ctx context.Context, session string, call gateway.Call) (gateway.Reply, error) {
	c.mu.Lock()
	c.session = session
	c.mu.Unlock()
	if c.release != nil {
		select {
		case <-c.release:
		case <-ctx.Done():
			return gateway.Reply{}, ctx.Err()
		}
	}
	return gateway.Reply{ID: "R1", Model: call.Model}, c.err
}

func (c *completer) Models(context.Context, string) ([]gateway.Model, error) { return nil, nil }

func TestAwait(t *testing.T) {
	ctx := context.Background()
	c := &completer{}
	rep, err := Await(ctx, c, "s1", gateway.Call{Model: "m"}, 0, nil)
	if err != nil || rep.ID != "R1" || rep.Model != "m" || c.session != "s1" {
		t.Fatalf("Await = %+v, %v (session %q)", rep, err, c.session)
	}

	// A reply that waits for the third tick: ticks come until it does.
	c = &completer{release: make(chan struct{}), err: gateway.Errorf(gateway.ErrOverloaded, "", "busy")}
	ticks := 0
	_, err = Await(ctx, c, "s1", gateway.Call{}, time.Millisecond, func() {
		ticks++
		if ticks == 3 {
			close(c.release)
		}
	})
	if gateway.KindOf(err) != gateway.ErrOverloaded {
		t.Fatalf("err %v, want the Completer's", err)
	}
	if ticks < 3 {
		t.Fatalf("%d ticks, want at least 3", ticks)
	}

	// A cancelled request ends the Completer's call.
	cctx, cancel := context.WithCancel(ctx)
	c = &completer{release: make(chan struct{})}
	_, err = Await(cctx, c, "s1", gateway.Call{}, time.Millisecond, cancel)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}

// A DecodeCache decodes each distinct form once, never caches an error,
// and starts afresh when full.
func TestDecodeCache(t *testing.T) {
	c := DecodeCache[string]{Max: 2}
	calls := 0
	dec := func(raw []byte) (string, error) {
		calls++
		if string(raw) == "bad" {
			return "", errors.New("bad")
		}
		return "v" + string(raw), nil
	}
	for _, k := range []string{"a", "a", "b", "bad", "bad", "a", "c", "a"} {
		v, err := c.Get([]byte(k), dec)
		if k == "bad" {
			if err == nil {
				t.Fatal("an error was cached or lost")
			}
			continue
		}
		if err != nil || v != "v"+k {
			t.Fatalf("Get(%s) = %q, %v", k, v, err)
		}
	}
	// a, b, bad, bad, c (full: afresh), a.
	if calls != 6 {
		t.Fatalf("%d decodes, want 6", calls)
	}
}
