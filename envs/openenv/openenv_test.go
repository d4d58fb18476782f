package openenv_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/envs/openenv"
	"github.com/rollout-rl/rollout/envs/protocol"
	"github.com/rollout-rl/rollout/internal/testkit/envservertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func serve(t *testing.T, opts envservertest.OpenEnvOptions) protocol.Endpoint {
	return envservertest.Endpoint(t, envservertest.OpenEnvHandler(opts), "openenv test server")
}

func newProto(t *testing.T, options string) protocol.Protocol {
	t.Helper()
	var node *yaml.Node
	if options != "" {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(options), &doc); err != nil {
			t.Fatal(err)
		}
		node = doc.Content[0]
	}
	p, err := protocol.New(openenv.Name, node)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func open(t *testing.T, p protocol.Protocol, ep protocol.Endpoint, data map[string]any) protocol.Session {
	t.Helper()
	s, err := p.Open(ctx(t), ep, protocol.Item{Data: data, RolloutID: "ro_test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func call(t *testing.T, s protocol.Session, name, args string) protocol.Step {
	t.Helper()
	st, err := s.Call(ctx(t), name, json.RawMessage(args))
	if err != nil {
		t.Fatalf("call %s %s: %v", name, args, err)
	}
	return st
}

// An MCP env: reset with the item's seed, the env's tools, rewarded
// steps, done, and the episode's reward summed from the steps.
func TestMCPEpisode(t *testing.T) {
	s := open(t, newProto(t, ""), serve(t, envservertest.OpenEnvOptions{}), map[string]any{"seed": int64(13)})
	if !strings.Contains(s.Opening(), "starts at 3") {
		t.Fatalf("opening %q: want the reset observation with seed 13 → 3", s.Opening())
	}
	var names []string
	for _, tl := range s.Tools() {
		names = append(names, tl.Name)
	}
	if strings.Join(names, ",") != "add,peek" {
		t.Fatalf("tools %v, want add,peek", names)
	}
	bad := call(t, s, "add", `{"n": 7}`)
	if !bad.Failed || !strings.Contains(bad.Text, "invalid_args") || bad.Reward != nil {
		t.Fatalf("add 7: %+v, want a failed step without reward", bad)
	}
	// The refused add counted as the game's first step: two more end it,
	// the last with the final reward on top of the step's.
	var steps []protocol.Step
	for i, want := range []float64{0.25, 1.25} {
		st := call(t, s, "add", `{"n": 2}`)
		if st.Failed || st.Reward == nil || *st.Reward != want || st.Done != (i == 1) || !strings.HasPrefix(st.Text, envservertest.OpenEnvMarker) {
			t.Fatalf("add 2 (#%d): %+v, want reward %v", i, st, want)
		}
		steps = append(steps, st)
	}
	if last := steps[1]; !strings.Contains(last.Text, "counter is now 7") {
		t.Fatalf("third step %+v: want counter 7", last)
	}
	sc, err := s.Score(ctx(t), nil, append([]protocol.Step{bad}, steps...))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Value != 1.5 || sc.Components["env_rewarded_steps"] != 2 || sc.Components["env_reward_last"] != 1.25 {
		t.Fatalf("score %+v, want 0.25 + 1.25 over 2 rewarded steps", sc)
	}
}

// Action mode: one tool whose schema is the env's action (without
// OpenEnv's metadata); a validation error is the model's, shown to it.
func TestActionMode(t *testing.T) {
	s := open(t, newProto(t, "{tools: action, action_tool: act, reward: last}"), serve(t, envservertest.OpenEnvOptions{StepsToDone: 2}),
		map[string]any{"reset": map[string]any{"start": int64(40)}})
	tl := s.Tools()
	if len(tl) != 1 || tl[0].Name != "act" || strings.Contains(string(tl[0].Parameters), "metadata") || !strings.Contains(string(tl[0].Parameters), `"value"`) {
		t.Fatalf("tools %+v: want one act tool with the action schema minus metadata", tl)
	}
	if !strings.Contains(s.Opening(), "starts at 40") {
		t.Fatalf("opening %q: want the reset argument start=40", s.Opening())
	}
	if st := call(t, s, "act", `{}`); !st.Failed || !strings.Contains(st.Text, "field required") {
		t.Fatalf("act {}: %+v, want the validation error", st)
	}
	if st := call(t, s, "act", `{"value": 9}`); !st.Failed {
		t.Fatalf("act 9: %+v, want the env's execution error", st)
	}
	st := call(t, s, "act", `{"value": 3}`)
	if st.Failed || !st.Done || *st.Reward != 1.25 || !strings.Contains(st.Text, "43") {
		t.Fatalf("act 3: %+v", st)
	}
	sc, err := s.Score(ctx(t), nil, []protocol.Step{st})
	if err != nil || sc.Value != 1.25 {
		t.Fatalf("score %+v, %v: want the last reward", sc, err)
	}
}

func TestServerFaults(t *testing.T) {
	p := newProto(t, "")
	t.Run("dies mid-episode", func(t *testing.T) {
		s := open(t, p, serve(t, envservertest.OpenEnvOptions{DieAfterSteps: 2}), nil)
		call(t, s, "peek", `{}`)
		_, err := s.Call(ctx(t), "add", json.RawMessage(`{"n":1}`))
		if !errors.Is(err, protocol.ErrUnreachable) || !strings.Contains(err.Error(), "openenv test server") {
			t.Fatalf("err %v: want ErrUnreachable naming the server", err)
		}
		if _, err := s.Call(ctx(t), "peek", json.RawMessage(`{}`)); !errors.Is(err, protocol.ErrUnreachable) {
			t.Fatalf("call after the break: %v", err)
		}
	})
	t.Run("bad JSON", func(t *testing.T) {
		s := open(t, p, serve(t, envservertest.OpenEnvOptions{BadJSONAfterSteps: 1}), nil)
		_, err := s.Call(ctx(t), "peek", json.RawMessage(`{}`))
		if !errors.Is(err, protocol.ErrViolation) || !strings.Contains(err.Error(), "not JSON") {
			t.Fatalf("err %v: want a protocol violation", err)
		}
	})
	t.Run("capacity", func(t *testing.T) {
		ep := serve(t, envservertest.OpenEnvOptions{MaxSessions: 1})
		open(t, p, ep, nil)
		_, err := p.Open(ctx(t), ep, protocol.Item{})
		if !errors.Is(err, protocol.ErrUnreachable) || !strings.Contains(err.Error(), "CAPACITY_REACHED") {
			t.Fatalf("second session: %v, want CAPACITY_REACHED as unreachable", err)
		}
	})
	t.Run("not an MCP env", func(t *testing.T) {
		// A plain HTTP server: /ws is no WebSocket.
		srv := httptest.NewServer(envservertest.NeMoGymHandler(envservertest.NeMoGymOptions{}))
		t.Cleanup(srv.Close)
		_, err := p.Open(ctx(t), protocol.Endpoint{Client: srv.Client(), BaseURL: srv.URL, Name: "x"}, protocol.Item{})
		if !errors.Is(err, protocol.ErrViolation) && !errors.Is(err, protocol.ErrUnreachable) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("bad seed", func(t *testing.T) {
		_, err := p.Open(ctx(t), serve(t, envservertest.OpenEnvOptions{}), protocol.Item{Data: map[string]any{"seed": "x"}})
		if !errors.Is(err, protocol.ErrConfig) {
			t.Fatalf("err %v: want ErrConfig", err)
		}
	})
}

func TestOptions(t *testing.T) {
	for _, o := range []string{"{tools: both}", "{reward: max}", "{action_tool: 'a b'}", "{nope: 1}"} {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(o), &doc); err != nil {
			t.Fatal(err)
		}
		if _, err := protocol.New(openenv.Name, doc.Content[0]); !errors.Is(err, protocol.ErrConfig) {
			t.Errorf("options %s: %v, want ErrConfig", o, err)
		}
	}
}
