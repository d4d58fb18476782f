// Package gatewaytest is the gateway front doors' shared test scaffolding:
// a scripted Completer standing for the capture core, a door served over
// HTTP, golden files of decoded calls, a server-sent event reader, and a
// real capture core over the simulator for end-to-end session tests.
package gatewaytest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/gateway"
)

// Update is the -update flag of a door's tests: rewrite the golden files.
var Update = flag.Bool("update", false, "rewrite the golden files")

// Session is the session id Serve's base URL names.
const Session = "sess-1"

// Scripted stands for the capture core: it records each call and answers
// with its script. The feature under test is a door's wire translation.
type Scripted struct {
	Reply gateway.Reply
	Err   error
	// Release, when set, holds Complete until it is closed (or the
	// request ends).
	Release chan struct{}

	mu       sync.Mutex
	calls    []gateway.Call
	sessions []string
}

var _ gateway.Completer = (*Scripted)(nil)

// Complete implements gateway.Completer.
func (s *Scripted) Complete(ctx context.Context, session string, call gateway.Call) (gateway.Reply, error) {
	s.mu.Lock()
	s.calls = append(s.calls, call)
	s.sessions = append(s.sessions, session)
	s.mu.Unlock()
	if s.Release != nil {
		select {
		case <-s.Release:
		case <-ctx.Done():
			return gateway.Reply{}, ctx.Err()
		}
	}
	return s.Reply, s.Err
}

// Models implements gateway.Completer: one model, for Session only.
func (s *Scripted) Models(_ context.Context, session string) ([]gateway.Model, error) {
	if session != Session {
		return nil, gateway.Errorf(gateway.ErrSession, "", "no session %s", session)
	}
	return []gateway.Model{{ID: "qwen3-tools", ContextLength: 65536}}, nil
}

// Calls are the calls Complete was asked, in order.
func (s *Scripted) Calls() []gateway.Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]gateway.Call(nil), s.calls...)
}

// Sessions are the session ids of the calls, in order.
func (s *Scripted) Sessions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.sessions...)
}

// Last is the last call; the test fails when there was none.
func (s *Scripted) Last(t testing.TB) gateway.Call {
	t.Helper()
	calls := s.Calls()
	if len(calls) == 0 {
		t.Fatal("the Completer was not called")
	}
	return calls[len(calls)-1]
}

// Serve mounts door for c under /s/{session} on a test server and returns
// the base URL of Session (no trailing slash).
func Serve(t testing.TB, door gateway.FrontDoor, c gateway.Completer) string {
	t.Helper()
	mux := http.NewServeMux()
	door.Mount(mux, "/s/{session}", c)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts.URL + "/s/" + Session
}

// Post sends a JSON body to url with headers (name, value pairs); the
// response body is closed when the test ends.
func Post(t testing.TB, url, body string, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// GoldenView is a call as the golden files hold it: gateway.Message's
// embedded message marshals itself and would hide Ref.
func GoldenView(c gateway.Call) any {
	type msg struct {
		Ref     string                       `json:"ref,omitempty"`
		Message openai.ChatCompletionMessage `json:"message"`
	}
	msgs := make([]msg, len(c.Messages))
	for i, m := range c.Messages {
		msgs[i] = msg{Ref: m.Ref, Message: m.ChatCompletionMessage}
	}
	type view gateway.Call
	return struct {
		view
		Messages []msg
	}{view(c), msgs}
}

// Golden compares got, as indented JSON, with testdata/name (rewritten
// first under -update).
func Golden(t testing.TB, name string, got any) {
	t.Helper()
	b, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", name)
	if *Update {
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(bytes.TrimSpace(want), bytes.TrimSpace(b)) {
		t.Errorf("%s differs from the golden file:\n%s", name, b)
	}
}

// Event is one parsed server-sent event.
type Event struct {
	Name string
	Data map[string]any
	Raw  string
}

// ReadSSE reads a whole event stream: its events, whose data must be JSON,
// and its comment lines. Any other line, or a stream ending inside an
// event, fails the test.
func ReadSSE(t testing.TB, r io.Reader) (events []Event, comments []string) {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	var cur Event
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.Name != "" || cur.Raw != "" {
				if err := json.Unmarshal([]byte(cur.Raw), &cur.Data); err != nil {
					t.Fatalf("event %s: data is not JSON: %v", cur.Name, err)
				}
				events = append(events, cur)
			}
			cur = Event{}
		case strings.HasPrefix(line, ":"):
			comments = append(comments, strings.TrimSpace(line[1:]))
		case strings.HasPrefix(line, "event: "):
			cur.Name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			cur.Raw += line[len("data: "):]
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if cur.Name != "" {
		t.Fatalf("stream ended inside event %s", cur.Name)
	}
	return events, comments
}

// Num is a decoded JSON number as an int (0 when v is not a number).
func Num(v any) int { f, _ := v.(float64); return int(f) }
