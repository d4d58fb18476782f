package demo

import (
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

// On-policy distillation end to end: rollouts in real sandboxes (busybox)
// and a multi-turn env, the simulator as both the student's server and the
// teacher (prompt_logprobs on the student's exact ids); the records carry
// the teacher's top-K on every trained token and nothing elsewhere, and the
// Atropos export carries them as distill_token_ids/distill_logprobs.
func TestDistillationEndToEnd(t *testing.T) {
	needImages(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const topK = 5
	specs := []struct {
		env   string
		image string
		hints bool
	}{{"terminal-tasks", "rollout-sandbox:busybox", false}, {"guess-number", "", false}, {"agentic-opd", "", false}, {"agentic-opd", "", true}}
	// The hint judge is the simulator too (the teacher's endpoint, the
	// default); with SuccessProb 1 it always finds a hint.
	scripts := []sim.Script{HintJudgeScript()}
	for _, s := range specs[:3] {
		env, err := envs.New(s.env, nil)
		if err != nil {
			t.Fatal(err)
		}
		items, err := env.Items(ctx, "train")
		if err != nil {
			t.Fatal(err)
		}
		sc, err := Scripts(ctx, env, items[:2])
		if err != nil {
			t.Fatal(err)
		}
		scripts = append(scripts, sc...)
	}
	srv, err := sim.Start(ctx, sim.Config{Family: "hermes", Seed: 9, SuccessProb: 1, Scripts: scripts})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dir := t.TempDir()
	for _, s := range specs {
		name := s.env
		if s.hints {
			name += "-hints"
		}
		t.Run(name, func(t *testing.T) {
			cfg := runner.Config{Env: s.env, Split: "train", Groups: 2, GroupSize: 2, Seed: 1,
				Inference: inference.Config{Backend: "vllm", Endpoints: []string{srv.URL}, Timeout: time.Minute},
				Sampling:  inference.Sampling{MaxTokens: 1024}, Parser: "hermes",
				RolloutTimeout: runner.Duration(3 * time.Minute),
				Output:         runner.Output{Dir: filepath.Join(dir, name)},
				Distill:        &inference.TeacherConfig{Endpoint: srv.URL, Model: "rollout-sim", TopK: topK}}
			cfg.Sandbox.Image = s.image
			if s.env == "agentic-opd" {
				// The env brings its own teacher (env_config.teacher).
				cfg.Distill = nil
				if err := cfg.EnvConfig.Encode(map[string]any{"hints": s.hints, "teacher": map[string]any{"endpoint": srv.URL, "model": "rollout-sim", "top_k": topK}}); err != nil {
					t.Fatal(err)
				}
			}
			j, err := assemble.Open(ctx, cfg, assemble.Options{Mode: assemble.ModeRun, Logger: quiet, SandboxInstance: testInstance()})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := j.Run(ctx); err != nil {
				t.Fatal(err)
			}
			recs := readRun(t, j.Dir)
			checkRecords(t, recs, 2, 2)
			scored, agree := 0, 0
			for _, r := range recs {
				if r.Status != trajectory.StatusOK {
					t.Fatalf("rollout %s/%d: %+v", r.GroupID, r.RolloutIndex, r.Failure)
				}
				if len(r.DistillTokenIDs) != len(r.Tokens) || len(r.DistillLogprobs) != len(r.Tokens) {
					t.Fatalf("distill %d/%d for %d tokens", len(r.DistillTokenIDs), len(r.DistillLogprobs), len(r.Tokens))
				}
				for p, m := range r.LossMask {
					n := len(r.DistillTokenIDs[p])
					switch {
					case m == 1 && (n != topK || len(r.DistillLogprobs[p]) != topK):
						t.Fatalf("trained position %d: %v %v", p, r.DistillTokenIDs[p], r.DistillLogprobs[p])
					case m == 0 && n != 0:
						t.Fatalf("untrained position %d scored: %v", p, r.DistillTokenIDs[p])
					case m == 1:
						scored++
						if r.DistillTokenIDs[p][0] == r.Tokens[p] {
							agree++
						}
					}
				}
			}
			if s.env == "agentic-opd" {
				for _, r := range recs {
					// The reference solution passes every test; the reward is
					// Hermes' blend of the components.
					c := r.RewardComponents
					if want := 0.7*c["correctness"] + 0.15*c["efficiency"] + 0.15*c["tool_usage"]; c["correctness"] != 1 || c["tool_usage"] == 0 || math.Abs(r.Reward-want) > 1e-9 {
						t.Errorf("agentic-opd reward %v components %v", r.Reward, r.RewardComponents)
					}
				}
			}
			for _, r := range recs {
				// Every assistant turn that something followed is judged,
				// and this judge always finds a hint; the answer is not.
				var hinted []int32
				for _, ev := range r.LoopEvents {
					if ev.Kind == agentloop.EventDistillHint {
						hinted = append(hinted, ev.Message)
						if ev.Detail != HintJudge || ev.Original != "3 of 3 votes" {
							t.Fatalf("hint event %+v", ev)
						}
					}
				}
				var msgs []openai.ChatCompletionMessage
				if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
					t.Fatal(err)
				}
				var want []int32
				for i, m := range msgs {
					if m.Role == openai.ChatMessageRoleAssistant && i+1 < len(msgs) {
						want = append(want, int32(i))
					}
				}
				if !s.hints {
					want = nil
				} else if len(want) == 0 {
					t.Fatal("no assistant turn with a next state to judge")
				}
				if !slices.Equal(hinted, want) {
					t.Fatalf("hints on messages %v, want %v", hinted, want)
				}
			}
			if scored == 0 || agree == 0 || agree == scored {
				t.Fatalf("teacher agrees with the student on %d of %d trained tokens", agree, scored)
			}
			groups, _, err := trajectory.AtroposGroups(recs, trajectory.AtroposOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range groups {
				if len(g.DistillTokenIDs) != len(g.Tokens) || len(g.DistillLogprobs) != len(g.Tokens) {
					t.Fatalf("atropos distill for %d of %d sequences", len(g.DistillTokenIDs), len(g.Tokens))
				}
				for i := range g.Tokens {
					if len(g.DistillTokenIDs[i]) != len(g.Tokens[i]) || len(g.DistillTokenIDs[i][0]) != topK {
						t.Fatalf("atropos distill shape [%d][%d][%d]", i, len(g.DistillTokenIDs[i]), len(g.DistillTokenIDs[i][0]))
					}
				}
			}
			t.Logf("%s: teacher top-1 = student token on %d of %d trained tokens", s.env, agree, scored)
		})
	}
	assertNoContainers(t)
}

// Hints without distillation have no teacher to rescore with: refused
// before anything starts.
func TestDemoHintsNeedDistill(t *testing.T) {
	if _, err := Run(context.Background(), Options{Hints: true, Specs: []Spec{{Env: "guess-number", Groups: 1}}}); err == nil || !strings.Contains(err.Error(), "--distill") {
		t.Fatalf("hints without --distill: %v", err)
	}
}
