package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

// guess-number end to end on the simulator, token-exact: the simulated
// policy plays the reference binary search, the env answers each turn, the
// episode ends with env_done and the record carries the turn rewards.
func TestGuessNumberEndToEnd(t *testing.T) {
	out := t.TempDir()
	specs := []Spec{{Env: "guess-number", Groups: 3, GroupSize: 3}}
	res, err := Run(context.Background(), Options{SandboxInstance: testInstance(), Out: out, Specs: specs, Seed: 5, SuccessProb: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	recs := readRun(t, res[0].Dir)
	checkRecords(t, recs, 3, 3)
	for _, r := range recs {
		if r.Status != trajectory.StatusOK || r.StopReason != "env_done" || r.RewardComponents["solved"] != 1 {
			t.Fatalf("rollout %s/%d: status %s stop %s components %v failure %+v", r.GroupID, r.RolloutIndex, r.Status, r.StopReason, r.RewardComponents, r.Failure)
		}
		if want := 1 - 0.05*float64(r.Turns-1); r.Reward < want-1e-9 || r.Reward > want+1e-9 || r.Turns > 7 {
			t.Errorf("reward %v after %d turns, want %v", r.Reward, r.Turns, want)
		}
		if len(r.TurnRewards) != int(r.Turns) || r.TurnRewards[len(r.TurnRewards)-1] != 1 {
			t.Errorf("turn rewards %v over %d turns", r.TurnRewards, r.Turns)
		}
		var msgs []struct{ Role, Content string }
		if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
			t.Fatal(err)
		}
		if last := msgs[len(msgs)-1]; last.Role != "user" || !strings.HasPrefix(last.Content, "Correct!") {
			t.Errorf("last message %+v", last)
		}
		envMsgs := 0
		for _, e := range r.LoopEvents {
			if e.Kind == "env_message" {
				envMsgs++
			}
		}
		if envMsgs != int(r.Turns) {
			t.Errorf("%d env messages over %d turns", envMsgs, r.Turns)
		}
	}
}

// A YAML env with a sandbox (busybox) and a scripted responder, and one
// with an LLM user simulator, end to end: the simulator plays both the
// policy and the simulated user.
func TestYAMLFeedbackEnvsEndToEnd(t *testing.T) {
	needImages(t, false)
	dir := t.TempDir()
	const quiz = "Find the code in /workspace/code.txt and tell me."
	const desk = "Hi, I need a flight (desk test)."
	scripts := []sim.Script{
		{Match: quiz, Steps: []sim.Step{
			{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "cat /workspace/code.txt"}}}},
			{Final: "The code is 1111."},
			{Final: "The code is 4242."},
		}},
		// The policy's side of the travel desk.
		{Match: desk, Steps: []sim.Step{{Final: "Where to (desk agent)?"}, {Final: "Booked: Paris on Friday."}}},
		// The simulated user's side: its first "user" line is the agent's
		// first reply; its step index counts its own earlier lines.
		{Match: "Where to (desk agent)?", Steps: []sim.Step{{Final: "-"}, {Final: "Paris, Friday."}, {Final: "Great, thanks! [DONE]"}}},
	}
	srv, err := sim.Start(context.Background(), sim.Config{Family: "hermes", Seed: 2, SuccessProb: 1, Scripts: scripts})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	files := map[string]string{
		"quiz.yaml": `name: code-quiz
prompt: "` + quiz + `"
toolsets: [terminal]
max_turns: 6
sandbox:
  image: rollout-sandbox:busybox
  files:
    - {path: /workspace/code.txt, content: "{{.code}}"}
items: [{code: "4242"}]
answer: "{{.code}}"
rewards: [{type: numeric_match}]
responder:
  scripted:
    rules:
      - {match: "{{.code}}", reply: "Correct.", done: true, reward: 1}
    otherwise: "That is not the code. Look again."
    otherwise_reward: -0.25
`,
		"desk.yaml": `name: travel-desk
prompt: "` + desk + `"
max_turns: 4
items: [{persona: "a traveller"}]
rewards: [{type: format, regex: "Booked"}]
responder:
  user_simulator:
    base_url: ` + srv.URL + `
    model: rollout-sim
    system: "You are {{.persona}}. Say [DONE] when booked."
    done_marker: "[DONE]"
    timeout: 1m
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		file, stop     string
		reward         float64
		turnRewards    string
		lastEnvMessage string
	}{
		{"quiz.yaml", "env_done", 1, "[0 -0.25 1]", "Correct."},
		{"desk.yaml", "env_done", 1, "[]", "Great, thanks!"},
	} {
		t.Run(c.file, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cfg := runner.Config{Env: filepath.Join(dir, c.file), Groups: 1, GroupSize: 2, Seed: 1,
				Inference: inference.Config{Backend: "vllm", Endpoints: []string{srv.URL}, Timeout: time.Minute},
				Sampling:  inference.Sampling{MaxTokens: 512}, Parser: "hermes",
				RolloutTimeout: runner.Duration(3 * time.Minute),
				Output:         runner.Output{Dir: filepath.Join(dir, "out-"+c.file)}}
			j, err := assemble.Open(ctx, cfg, assemble.Options{Mode: assemble.ModeRun, Logger: quiet, SandboxInstance: testInstance()})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := j.Run(ctx); err != nil {
				t.Fatal(err)
			}
			recs := readRun(t, j.Dir)
			if len(recs) != 2 {
				t.Fatalf("%d records", len(recs))
			}
			for _, r := range recs {
				if r.Status != trajectory.StatusOK || r.StopReason != c.stop || r.Reward != c.reward {
					t.Fatalf("status %s stop %s reward %v failure %+v", r.Status, r.StopReason, r.Reward, r.Failure)
				}
				if got := fmt.Sprint(r.TurnRewards); got != c.turnRewards {
					t.Errorf("turn rewards %s, want %s", got, c.turnRewards)
				}
				var msgs []struct{ Role, Content string }
				if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
					t.Fatal(err)
				}
				if last := msgs[len(msgs)-1]; last.Role != "user" || last.Content != c.lastEnvMessage {
					t.Errorf("last message %+v", last)
				}
				if r.Validate() != nil || len(r.Tokens) == 0 {
					t.Errorf("record: %v, %d tokens", r.Validate(), len(r.Tokens))
				}
			}
		})
	}
	assertNoContainers(t)
}
