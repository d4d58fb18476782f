package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/rewards"
)

// funcPolicy answers each generation with gen(history) and finishes with
// seq.
type funcPolicy struct {
	gen  func(msgs []openai.ChatCompletionMessage) (inference.Turn, error)
	seq  inference.Sequence
	gens atomic.Int64
}

func (p *funcPolicy) Start(context.Context, inference.EpisodeSpec) (inference.Episode, error) {
	return p, nil
}

func (p *funcPolicy) Generate(_ context.Context, msgs []openai.ChatCompletionMessage) (inference.Turn, error) {
	p.gens.Add(1)
	return p.gen(msgs)
}

func (p *funcPolicy) Finish(context.Context, []openai.ChatCompletionMessage) (inference.Sequence, error) {
	return p.seq, nil
}

func answer(content, finish string) func([]openai.ChatCompletionMessage) (inference.Turn, error) {
	return func([]openai.ChatCompletionMessage) (inference.Turn, error) {
		return inference.Turn{Parsed: true, Content: content, FinishReason: finish}, nil
	}
}

func runWith(t *testing.T, cfg Config, pol inference.Policy, reward func(envs.Outcome) (rewards.Score, error)) (Summary, []Rollout) {
	t.Helper()
	if reward == nil {
		reward = func(envs.Outcome) (rewards.Score, error) { return rewards.Score{Value: 1}, nil }
	}
	env := &scoreEnv{items: items(1), reward: reward}
	sink := &memSink{}
	r, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: pol, Sinks: []Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ros []Rollout
	for _, g := range sink.groups {
		ros = append(ros, g.Rollouts...)
	}
	if len(ros) == 0 {
		t.Fatal("no rollouts")
	}
	return sum, ros
}

// No silent empties: when the backend promises token ids, an ok rollout
// has them, aligned, with trained positions.
func TestNoSilentEmpties(t *testing.T) {
	good := inference.Sequence{Tokens: []int32{1, 2, 3}, Mask: []int8{0, 1, 1}, Logprobs: []float32{1, -0.1, -0.2}}
	for _, tc := range []struct {
		name    string
		backend string
		ids     bool
		seq     inference.Sequence
		want    string // "" = ok, else a substring of the failure message
	}{
		{"tokens mode, no ids", inference.BackendVLLM, false, inference.Sequence{}, "server returned no token ids"},
		{"chat with token ids, none returned", inference.BackendChat, true, inference.Sequence{}, "server returned no token ids"},
		{"misaligned logprobs", inference.BackendVLLM, false, inference.Sequence{Tokens: []int32{1, 2}, Mask: []int8{0, 1}}, "misaligned"},
		{"prompt only, nothing sampled", inference.BackendSGLang, false, inference.Sequence{Tokens: []int32{1, 2}, Mask: []int8{0, 0}, Logprobs: []float32{1, 1}}, "none trained"},
		{"tokens mode, ids", inference.BackendVLLM, false, good, ""},
		{"chat without token ids", inference.BackendChat, false, inference.Sequence{}, ""},
		{"own policy, no backend named", "", false, inference.Sequence{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.Retries = -1
			cfg.GroupSize = 2
			cfg.Inference.Backend, cfg.Inference.ChatTokenIDs = tc.backend, tc.ids
			pol := &funcPolicy{gen: answer("done", "stop"), seq: tc.seq}
			sum, ros := runWith(t, cfg, pol, nil)
			for _, ro := range ros {
				if tc.want == "" {
					if ro.Status != StatusOK {
						t.Fatalf("rollout failed: %+v", ro.Failure)
					}
					continue
				}
				if ro.Status != StatusInfraFailed || ro.Failure.Kind != FailInference || !strings.Contains(ro.Failure.Message, tc.want) {
					t.Fatalf("status %s failure %+v, want kind %s with %q", ro.Status, ro.Failure, FailInference, tc.want)
				}
			}
			if tc.want != "" && sum.FailuresByKind[FailInference] != len(ros) {
				t.Fatalf("summary %+v", sum)
			}
		})
	}
}

// A request the server refuses because of what it contains is
// inference_rejected and not retried: the same conversation would be
// refused again.
func TestRejectedRequestNotRetried(t *testing.T) {
	cfg := baseConfig()
	cfg.Retries = 3
	pol := &funcPolicy{gen: func([]openai.ChatCompletionMessage) (inference.Turn, error) {
		return inference.Turn{}, &inference.Error{Class: inference.ErrRequest, Status: 500, Msg: "Failed to parse tool call arguments as JSON"}
	}}
	sum, ros := runWith(t, cfg, pol, nil)
	for _, ro := range ros {
		if ro.Status != StatusInfraFailed || ro.Failure.Kind != FailRejected || ro.Attempts != 1 {
			t.Fatalf("rollout %+v (attempts %d)", ro.Failure, ro.Attempts)
		}
	}
	if sum.Retries != 0 || pol.gens.Load() != int64(len(ros)) {
		t.Fatalf("retried: summary %+v, %d generations for %d rollouts", sum, pol.gens.Load(), len(ros))
	}
	// A plain wrapped ErrRequest (any new class that wraps it) maps the same way.
	if k := loopFailure(agentloop.StopInferenceErr, fmt.Errorf("x: %w", inference.ErrRequest)); k != FailRejected {
		t.Fatalf("kind %s", k)
	}
}

// Truncation is a model outcome: the rollout is ok, scored, with stop
// reason "length" and finished_naturally false.
func TestLengthIsAModelOutcome(t *testing.T) {
	var seen atomic.Value
	_, ros := runWith(t, baseConfig(), &funcPolicy{gen: answer("The answer is", "length")}, func(out envs.Outcome) (rewards.Score, error) {
		seen.Store(out.StopReason)
		return rewards.Score{Value: 0.5}, nil
	})
	for _, ro := range ros {
		if ro.Status != StatusOK || ro.Result.StopReason != agentloop.StopLength || ro.Result.FinishedNaturally {
			t.Fatalf("status %s stop %s natural %v", ro.Status, ro.Result.StopReason, ro.Result.FinishedNaturally)
		}
	}
	if seen.Load() != "length" {
		t.Fatalf("the reward saw stop reason %v", seen.Load())
	}
	sum, _ := runWith(t, baseConfig(), &funcPolicy{gen: answer("The answer is", "length")}, nil)
	if sum.StopReasons["length"] != sum.RolloutsOK || sum.RolloutsOK == 0 || len(sum.StopReasons) != 1 {
		t.Fatalf("summary stop reasons %v (ok %d)", sum.StopReasons, sum.RolloutsOK)
	}
}

// The loop's knobs are reachable from the run config.
func TestLoopKnobsReachTheLoop(t *testing.T) {
	cfg, err := ParseConfig([]byte(`env: unit
inference: {endpoints: ["http://127.0.0.1:1"]}
loop:
  on_truncation: tool_error
  budget_warnings: true
  grace_turn: true
  empty_reply_nudges: 2
  repair_tool_names: true
  max_calls_per_turn: 4
`))
	if err != nil {
		t.Fatal(err)
	}
	want := LoopConfig{OnTruncation: "tool_error", BudgetWarnings: true, GraceTurn: true, EmptyReplyNudges: 2, RepairToolNames: true, MaxCallsPerTurn: 4}
	if cfg.Loop != want {
		t.Fatalf("loop %+v", cfg.Loop)
	}
	if _, err := ParseConfig([]byte("env: unit\nloop: {nudge: 1}\n")); err == nil || !strings.Contains(err.Error(), "field nudge not found") {
		t.Fatalf("unknown loop key: %v", err)
	}
	for _, tc := range []struct {
		loop LoopConfig
		want string
	}{
		{LoopConfig{OnTruncation: "continue"}, "loop.on_truncation"},
		{LoopConfig{EmptyReplyNudges: -1}, "loop.empty_reply_nudges"},
		{LoopConfig{MaxCallsPerTurn: -1}, "loop.max_calls_per_turn"},
	} {
		c := baseConfig()
		c.Loop = tc.loop
		if err := c.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v", tc.loop, err)
		}
	}

	// empty_reply_nudges reaches the loop: the first reply is empty, the
	// nudge is inserted and recorded, the second reply finishes.
	c := baseConfig()
	c.Loop.EmptyReplyNudges = 1
	pol := &funcPolicy{gen: func(msgs []openai.ChatCompletionMessage) (inference.Turn, error) {
		if msgs[len(msgs)-1].Content == agentloop.EmptyReplyNudgeText {
			return inference.Turn{Parsed: true, Content: "done", FinishReason: "stop"}, nil
		}
		return inference.Turn{Parsed: true, FinishReason: "stop"}, nil
	}}
	_, ros := runWith(t, c, pol, nil)
	for _, ro := range ros {
		res := ro.Result
		if ro.Status != StatusOK || res.StopReason != agentloop.StopFinished || res.Counters.InsertedMessages != 1 ||
			len(res.Events) != 1 || res.Events[0].Kind != agentloop.EventMessageInserted {
			t.Fatalf("status %s stop %s events %+v", ro.Status, res.StopReason, res.Events)
		}
	}
	// Off by default: an empty reply finishes.
	_, ros = runWith(t, baseConfig(), &funcPolicy{gen: answer("", "stop")}, nil)
	for _, ro := range ros {
		if ro.Result.StopReason != agentloop.StopFinished || len(ro.Result.Events) != 0 || ro.Result.TurnsUsed != 1 {
			t.Fatalf("stop %s events %+v", ro.Result.StopReason, ro.Result.Events)
		}
	}
}

// A config without loop: hashes as before the block existed.
func TestLoopBlockKeepsOldConfigHashes(t *testing.T) {
	c := baseConfig()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"loop"`) {
		t.Fatalf("an unset loop block is in the hashed JSON: %s", b)
	}
	c.Loop.GraceTurn = true
	if c.Hash() == baseConfig().Hash() {
		t.Fatal("the loop block does not change the config hash")
	}
}
