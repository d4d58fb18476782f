package nemogym_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/envs/nemogym"
	"github.com/rollout-rl/rollout/envs/protocol"
	"github.com/rollout-rl/rollout/internal/testkit/envservertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func serve(t *testing.T, opts envservertest.NeMoGymOptions) protocol.Endpoint {
	return envservertest.Endpoint(t, envservertest.NeMoGymHandler(opts), "nemo_gym test server")
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// row is a NeMo Gym dataset row in the shape of the session-state example.
func row(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	err := json.Unmarshal([]byte(`{"responses_create_params": {"input": [{"role": "developer", "content": "Count."},
		{"role": "user", "content": [{"type": "input_text", "text": "add 1 then add 2"}]}],
		"tools": [{"type": "function", "name": "increment_counter", "description": "add", "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}},
		{"type": "function", "name": "get_counter_value", "parameters": {"type": "object", "properties": {}}}]},
		"initial_count": 3, "expected_count": 6}`), &m)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestEpisode(t *testing.T) {
	p, err := protocol.New(nemogym.Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := p.(protocol.Prompter).Messages(row(t))
	if err != nil || len(msgs) != 2 || msgs[0].Role != "system" || msgs[1].Content != "add 1 then add 2" {
		t.Fatalf("messages %+v, %v", msgs, err)
	}
	ep := serve(t, envservertest.NeMoGymOptions{})
	s, err := p.Open(ctx(t), ep, protocol.Item{Data: row(t), RolloutID: "ro_1"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if n := len(s.Tools()); n != 2 {
		t.Fatalf("%d tools, want the row's 2", n)
	}
	// A second session has its own counter: the cookie keeps them apart.
	other, err := p.Open(ctx(t), ep, protocol.Item{Data: map[string]any{"responses_create_params": map[string]any{"input": "x"}, "initial_count": 100}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	call := func(s protocol.Session, name, args string) protocol.Step {
		st, err := s.Call(ctx(t), name, json.RawMessage(args))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return st
	}
	if st := call(s, "increment_counter", `{"count": "x"}`); !st.Failed || !strings.Contains(st.Text, "422") {
		t.Fatalf("bad arguments: %+v, want the 422 shown to the model", st)
	}
	for _, n := range []string{`{"count": 1}`, `{"count": 2}`} {
		if st := call(s, "increment_counter", n); st.Failed || !strings.Contains(st.Text, envservertest.NeMoGymMarker) {
			t.Fatalf("increment: %+v", st)
		}
	}
	if st := call(s, "get_counter_value", `{}`); !strings.Contains(st.Text, `"count":6`) {
		t.Fatalf("get: %+v, want 6", st)
	}
	if st := call(other, "get_counter_value", `{}`); !strings.Contains(st.Text, `"count":100`) {
		t.Fatalf("other session: %+v, want its own 100", st)
	}
	transcript := []openai.ChatCompletionMessage{msgs[0], msgs[1],
		{Role: "assistant", ToolCalls: []openai.ToolCall{{ID: "c1", Type: "function", Function: openai.FunctionCall{Name: "increment_counter", Arguments: `{"count":1}`}}}},
		{Role: "tool", ToolCallID: "c1", Content: `{"success":true}`},
		{Role: "assistant", Content: "done"}}
	sc, err := s.Score(ctx(t), transcript, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Value != 1 || sc.Components["count_matches"] != 1 || sc.Components["tool_calls"] != 3 || sc.Components["output_items"] != 3 {
		t.Fatalf("score %+v: want reward 1, 3 accepted tool calls, 3 output items", sc)
	}
	if sc, err := other.Score(ctx(t), nil, nil); err != nil || sc.Value != 0 {
		t.Fatalf("other score %+v, %v: want 0", sc, err)
	}
}

func TestFaults(t *testing.T) {
	p, _ := protocol.New(nemogym.Name, nil)
	open := func(t *testing.T, opts envservertest.NeMoGymOptions) protocol.Session {
		s, err := p.Open(ctx(t), serve(t, opts), protocol.Item{Data: row(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	if _, err := open(t, envservertest.NeMoGymOptions{FailVerify: true}).Score(ctx(t), nil, nil); !errors.Is(err, protocol.ErrUnreachable) || !strings.Contains(err.Error(), "nemo_gym test server") {
		t.Errorf("verify 500: %v, want ErrUnreachable naming the server", err)
	}
	if _, err := open(t, envservertest.NeMoGymOptions{NoReward: true}).Score(ctx(t), nil, nil); !errors.Is(err, protocol.ErrViolation) {
		t.Errorf("verify without reward: %v, want ErrViolation", err)
	}
	// A row the server's seed model refuses.
	bad := row(t)
	delete(bad, "initial_count")
	if _, err := p.Open(ctx(t), serve(t, envservertest.NeMoGymOptions{}), protocol.Item{Data: bad}); !errors.Is(err, protocol.ErrViolation) || !strings.Contains(err.Error(), "422") {
		t.Errorf("seed 422: %v", err)
	}
	if _, err := p.Open(ctx(t), serve(t, envservertest.NeMoGymOptions{}), protocol.Item{Data: map[string]any{"q": 1}}); !errors.Is(err, protocol.ErrConfig) {
		t.Errorf("not a row: %v, want ErrConfig", err)
	}
	// The server gone: unreachable.
	srv := httptest.NewServer(envservertest.NeMoGymHandler(envservertest.NeMoGymOptions{}))
	ep := protocol.Endpoint{Client: srv.Client(), BaseURL: srv.URL, Name: "gone"}
	s, err := p.Open(ctx(t), ep, protocol.Item{Data: row(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if _, err := s.Call(ctx(t), "get_counter_value", json.RawMessage(`{}`)); !errors.Is(err, protocol.ErrUnreachable) {
		t.Errorf("server gone: %v, want ErrUnreachable", err)
	}
	_ = s.Close(context.Background())
}

// A row without tools plays the tools the server declares in its
// /openapi.json (its POST routes but its own), references inlined.
func TestOpenAPITools(t *testing.T) {
	p, _ := protocol.New(nemogym.Name, nil)
	data := map[string]any{"responses_create_params": map[string]any{"input": "count"}, "initial_count": 1}
	s, err := p.Open(ctx(t), serve(t, envservertest.NeMoGymOptions{}), protocol.Item{Data: data})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	tl := s.Tools()
	if len(tl) != 2 || tl[0].Name != "get_counter_value" || tl[1].Name != "increment_counter" ||
		!strings.Contains(string(tl[1].Parameters), `"count"`) || strings.Contains(string(tl[1].Parameters), "$ref") || tl[1].Description != "Increment Counter" {
		t.Fatalf("tools %+v", tl)
	}
	if st, err := s.Call(ctx(t), "increment_counter", json.RawMessage(`{"count": 2}`)); err != nil || st.Failed {
		t.Fatalf("call: %+v, %v", st, err)
	}
}
