package runner

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/envs"
	_ "github.com/rollout-rl/rollout/envs/protocol/builtin"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/testkit/envservertest"
)

// runEnvServer runs one group of two rollouts of a YAML env whose episodes
// are played on an OpenEnv server at a URL, with a policy that calls its
// add tool every turn.
func runEnvServer(t *testing.T, opts envservertest.OpenEnvOptions) []Rollout {
	t.Helper()
	srv := httptest.NewServer(envservertest.OpenEnvHandler(opts))
	t.Cleanup(srv.Close)
	env, err := envs.NewYAMLEnv(envs.YAMLSpec{Name: "counter", Prompt: "Count.", MaxTurns: 5,
		Items:     []map[string]any{{"id": "a", "seed": 2}},
		EnvServer: &envs.YAMLEnvServer{Protocol: "openenv", URL: srv.URL}}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pol := &funcPolicy{gen: func([]openai.ChatCompletionMessage) (inference.Turn, error) {
		return inference.Turn{Parsed: true, FinishReason: "tool_calls", ToolCalls: []openai.ToolCall{{ID: "c", Type: "function",
			Function: openai.FunctionCall{Name: "add", Arguments: `{"n": 2}`}}}}, nil
	}}
	cfg := baseConfig()
	cfg.Env, cfg.GroupSize, cfg.Retries = "counter", 2, -1
	sink := &memSink{}
	r, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: pol, Sinks: []Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	var ros []Rollout
	for _, g := range sink.groups {
		ros = append(ros, g.Rollouts...)
	}
	if len(ros) != 2 {
		t.Fatalf("%d rollouts", len(ros))
	}
	return ros
}

// The runner opens a session per rollout: the reset observation follows
// the prompt, the server's tools are the rollout's, done ends the episode
// (env_done) and the step rewards are the turn rewards and the reward.
func TestEnvServerEpisode(t *testing.T) {
	for _, ro := range runEnvServer(t, envservertest.OpenEnvOptions{StepsToDone: 2}) {
		if ro.Status != StatusOK {
			t.Fatalf("rollout %s: %+v", ro.ID, ro.Failure)
		}
		res := ro.Result
		if res.StopReason != agentloop.StopEnvDone || res.TurnsUsed != 2 {
			t.Errorf("stop %s after %d turns, want env_done after 2", res.StopReason, res.TurnsUsed)
		}
		if len(res.TurnRewards) != 2 || res.TurnRewards[0] != 0.25 || res.TurnRewards[1] != 1.25 || ro.Score.Value != 1.5 {
			t.Errorf("turn rewards %v, reward %v: want [0.25 1.25] and 1.5", res.TurnRewards, ro.Score.Value)
		}
		if len(ro.Tools) != 2 {
			t.Errorf("tools offered %d, want the server's add and peek", len(ro.Tools))
		}
		if !strings.Contains(res.Messages[1].Content, "starts at 2") {
			t.Errorf("second message %+v: want the reset observation", res.Messages[1])
		}
		tools := 0
		for _, m := range res.Messages {
			if m.Role == openai.ChatMessageRoleTool && strings.HasPrefix(m.Content, envservertest.OpenEnvMarker) {
				tools++
			}
		}
		if tools != 2 {
			t.Errorf("%d tool results from the server, want 2", tools)
		}
	}
}

// A server that dies mid-episode fails the rollout as a sandbox
// infrastructure failure naming it; capacity refused at open, likewise.
func TestEnvServerFailures(t *testing.T) {
	for name, opts := range map[string]envservertest.OpenEnvOptions{
		"dies mid-episode": {DieAfterSteps: 1},
		"bad json":         {BadJSONAfterSteps: 1},
	} {
		for _, ro := range runEnvServer(t, opts) {
			if ro.Status != StatusInfraFailed || ro.Failure.Kind != FailSandbox || !strings.Contains(ro.Failure.Message, "openenv server http://127.0.0.1") {
				t.Errorf("%s: status %s, failure %+v: want a sandbox failure naming the server", name, ro.Status, ro.Failure)
			}
		}
	}
}
