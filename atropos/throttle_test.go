package atropos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/testkit/atropostest"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/runner"
)

// tokenPolicy answers every episode with one turn "n" (n counts episodes)
// and a token-exact sequence with logprobs, as a tokens-mode backend does.
type tokenPolicy struct {
	starts    atomic.Int64
	cancelled atomic.Int64
}

func (p *tokenPolicy) Start(context.Context, inference.EpisodeSpec) (inference.Episode, error) {
	return &tokenEpisode{p: p, n: p.starts.Add(1)}, nil
}

type tokenEpisode struct {
	p *tokenPolicy
	n int64
}

func (e *tokenEpisode) Generate(ctx context.Context, _ []openai.ChatCompletionMessage) (inference.Turn, error) {
	if ctx.Err() != nil {
		e.p.cancelled.Add(1)
		return inference.Turn{}, ctx.Err()
	}
	s := strconv.FormatInt(e.n, 10)
	return inference.Turn{Parsed: true, Text: s, Content: s, FinishReason: "stop", CompletionIDs: []int32{int32(e.n), 2}, Logprobs: []float32{-0.5, -0.1}}, nil
}

func (e *tokenEpisode) Finish(context.Context, []openai.ChatCompletionMessage) (inference.Sequence, error) {
	return inference.Sequence{
		Tokens: []int32{1, 5, 7, int32(e.n), 2}, Mask: []int8{0, 0, 0, 1, 1},
		Logprobs: []float32{1, 1, 1, -0.5, -0.1}, PromptLen: 3,
	}, nil
}

// countEnv rewards a rollout with its episode number, so no group has equal
// scores.
type countEnv struct{ items []datasets.Item }

func (e *countEnv) Name() string            { return "count" }
func (e *countEnv) Defaults() envs.Defaults { return envs.Defaults{GroupSize: testG, MaxTurns: 1} }
func (e *countEnv) Items(context.Context, string) ([]datasets.Item, error) {
	return e.items, nil
}
func (e *countEnv) Task(_ context.Context, it datasets.Item) (envs.Task, error) {
	return envs.Task{Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "count " + it.ID}}}, nil
}
func (e *countEnv) Reward(_ context.Context, _ datasets.Item, out envs.Outcome, _ envs.Sandbox) (rewards.Score, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(out.Final), 64)
	if err != nil {
		return rewards.Score{}, fmt.Errorf("final %q: %w", out.Final, err)
	}
	return rewards.Score{Value: v}, nil
}

// The runner, the bridge and the API together: with a trainer batch of two
// groups and MaxBatchesOffPolicy 1, the API's queue never holds more than
// two groups; while it is full no group starts (intake pauses) and no
// rollout is cancelled; each batch the trainer takes lets two more in.
func TestThrottlePausesRunnerIntake(t *testing.T) {
	api := atropostest.New(t)
	startTrainer(t, api, 2*testG)
	b := newBridge(t, api, func(o *Options) { o.MaxBatchesOffPolicy = 1 })

	const groups = 10
	its := make([]datasets.Item, groups)
	for i := range its {
		its[i] = datasets.Item{ID: fmt.Sprintf("q%d", i)}
	}
	pol := &tokenPolicy{}
	cfg := runner.Config{Env: "count", GroupSize: testG, Inference: inference.Config{Endpoints: []string{"http://127.0.0.1:1"}}}
	cfg.Limits.GroupsInFlight = 4
	r, err := runner.New(cfg, runner.Deps{Env: &countEnv{items: its}, Policy: pol, Sinks: []runner.Sink{b}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		sum runner.Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, err := r.Run(context.Background())
		done <- result{sum, err}
	}()

	served := 0
	for served < groups {
		// Wait until the API's queue is full (two groups) or, at the end,
		// holds what is left.
		left := groups - served
		eventually(t, "a full trainer queue", func() bool {
			api.Mu.Lock()
			defer api.Mu.Unlock()
			return len(api.Queue) == min(2, left)
		})
		started := pol.starts.Load()
		if left > 2 {
			if !b.Stats().Throttled {
				t.Fatalf("queue full but not throttled: %+v", b.Stats())
			}
			// Several more polls: still paused, nothing new started.
			api.Mu.Lock()
			polls := api.StatusEnvGets
			api.Mu.Unlock()
			eventually(t, "more polls", func() bool {
				api.Mu.Lock()
				defer api.Mu.Unlock()
				return api.StatusEnvGets >= polls+5
			})
			if now := pol.starts.Load(); now != started {
				t.Fatalf("%d rollouts started while intake was paused", now-started)
			}
			if want := int64(testG * (served + 2)); started != want {
				t.Fatalf("%d rollouts started with %d groups served, want %d", started, served, want)
			}
		}
		n := api.TrainerBatch(t)
		if n != 2 {
			t.Fatalf("trainer batch of %d groups, want 2", n)
		}
		served += n
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.sum.Groups != groups || res.sum.RolloutsOK != groups*testG || res.sum.InfraFailed != 0 || pol.cancelled.Load() != 0 {
		t.Fatalf("summary %+v, %d cancelled generations", res.sum, pol.cancelled.Load())
	}
	got, _ := api.Snapshot()
	api.Mu.Lock()
	maxQueue := api.MaxQueue
	api.Mu.Unlock()
	if len(got) != groups || maxQueue > 2 {
		t.Fatalf("received %d groups (want %d); the queue peaked at %d groups (bound 2)", len(got), groups, maxQueue)
	}
	seen := map[int]bool{}
	for _, g := range got {
		for i := range g.Tokens {
			if seen[g.Tokens[i][3]] {
				t.Fatalf("sequence %d delivered twice", g.Tokens[i][3])
			}
			seen[g.Tokens[i][3]] = true
			if fmt.Sprint(g.Masks[i]) != fmt.Sprintf("[-100 -100 -100 %d 2]", g.Tokens[i][3]) {
				t.Errorf("masks %v", g.Masks[i])
			}
		}
	}
}
