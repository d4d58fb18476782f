package realengine

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
	"github.com/rollout-rl/rollout/trajectory"
)

// harnessImage is the task image of harness envs (sandbox/image recipe
// "harness"): Debian sid's python3-openai and python3-anthropic.
const harnessImage = "rollout-harness:sid"

// rescorePerBranch is how many trained ids of each branch are re-scored.
const rescorePerBranch = 8

// harnessCase is one item of the harness env: which harness, its flags,
// its budget, and what the test expects of its rows.
type harnessCase struct {
	id, script, flags, budget string
	stop                      string // the rollout's stop reason
	branches                  int    // rows per rollout (-1: any number)
	streamed                  bool
	calls                     int // with branches 0: the calls recorded (all failed)
}

// TestHarnessEnvs runs `rollout run` of a harness YAML env against the
// real llama.cpp engine with the suite's tool-call-biased model: the
// project's two harnesses (examples/harnesses, on the official OpenAI and
// Anthropic SDKs) run in rollout-harness:sid sandboxes and call their
// gateway sessions through the sandbox tunnel, streamed and not; one
// compacts its history (two branches), one crashes, one hangs past its
// budget, one overflows the context, one never calls the model; one
// speaks the Responses API. Every rollout is ok (misbehaviour is
// data, with its stop reason), the reward is computed in the sandbox, and
// every branch's trained ids re-score against the server.
func TestHarnessEnvs(t *testing.T) {
	if err := run("docker", "image", "inspect", harnessImage); err != nil {
		t.Skipf("%s not built (rollout sandbox image --name harness): %v", harnessImage, err)
	}
	e := startEngine(t)
	dir := t.TempDir()
	cases := []harnessCase{
		{id: "openai", script: "openai_agent.py", flags: "--calls 3", budget: "5m", stop: "harness_exit", branches: 1},
		{id: "openai-stream-compact", script: "openai_agent.py", flags: "--stream --calls 4 --compact-after 2", budget: "5m", stop: "harness_exit", branches: 2, streamed: true},
		{id: "anthropic", script: "anthropic_agent.py", flags: "--calls 3", budget: "5m", stop: "harness_exit", branches: 1},
		{id: "anthropic-stream", script: "anthropic_agent.py", flags: "--stream --calls 3", budget: "5m", stop: "harness_exit", branches: 1, streamed: true},
		{id: "crash", script: "openai_agent.py", flags: "--crash-after 1", budget: "5m", stop: "harness_crash", branches: 1},
		// Killed by its budget after its first call, or during it (then
		// the call failed and left no branch): either way, a status.
		{id: "timeout", script: "openai_agent.py", flags: "--hang-after 1", budget: "10s", stop: "harness_timeout", branches: -1},
		{id: "responses", script: "openai_agent.py", flags: "--responses --calls 3", budget: "5m", stop: "harness_exit", branches: 1},
		// A prompt past the context: the API's context-length error, which
		// the SDK raises and the harness dies of: data, not infrastructure.
		{id: "overflow", script: "openai_agent.py", flags: "--pad 20000", budget: "5m", stop: "harness_crash", branches: 0, calls: 1},
		{id: "no-call", script: "openai_agent.py", flags: "--no-call", budget: "5m", stop: "harness_no_calls"},
	}
	_, self, _, _ := runtime.Caller(0)
	examples := filepath.Join(filepath.Dir(self), "..", "..", "..", "examples", "harnesses")
	var files []map[string]any
	for _, name := range []string{"openai_agent.py", "anthropic_agent.py"} {
		b, err := os.ReadFile(filepath.Join(examples, name))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, map[string]any{"path": "/tmp/harness/" + name, "content": string(b), "mode": 0o755})
	}
	var items []map[string]any
	for _, c := range cases {
		items = append(items, map[string]any{"id": c.id, "script": c.script, "flags": c.flags, "budget": c.budget})
	}
	env := map[string]any{
		"name": "harness-proof", "prompt": "List the files in the working directory, then say how many there are.",
		"sandbox": map[string]any{"image": harnessImage, "workdir": "/workspace", "files": files},
		"harness": map[string]any{"command": "python3 /tmp/harness/{{.script}} {{.flags}}", "apis": []string{"openai", "anthropic"},
			"budget": "{{.budget}}"},
		"items": items,
		// Computed in the sandbox after the harness: did it leave its answer file.
		"rewards":    []map[string]any{{"type": "exit_code", "command": "test -f /workspace/answer.txt"}},
		"group_size": 2,
	}
	envPath := filepath.Join(dir, "harness.yaml")
	if err := os.WriteFile(envPath, []byte(mustJSON(env)), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	cfg := map[string]any{
		"env": envPath, "groups": len(cases), "group_size": 2, "seed": 35,
		"inference": map[string]any{"backend": "llamacpp", "endpoints": []string{e.URL}, "retries": 3, "timeout": "2m"},
		"sampling": map[string]any{"temperature": 1.0, "max_tokens": 48,
			"extra_body": map[string]any{"logit_bias": collectionBias(t, e)}},
		"parser": "hermes", "reasoning_parser": "qwen3", "rollout_timeout": "5m",
		"limits":  map[string]any{"rollouts_in_flight": slots, "groups_in_flight": slots / 2, "sandboxes": slots},
		"sandbox": map[string]any{"warm_pool": -1},
		"output":  map[string]any{"dir": out},
	}
	cfgPath := filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(cfgPath, []byte(mustJSON(cfg)), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stdout, stderr, code := runRollout(t, suiteCtx(t), "run", "-c", cfgPath)
	t.Logf("rollout run of the harness env: %d items × 2 in %s\n%s", len(cases), time.Since(start).Round(time.Second), stdout)
	if code != 0 {
		t.Fatalf("rollout run: exit %d\nstdout:\n%s\nstderr (tail):\n%s\nserver log:\n%s", code, stdout, tail(stderr, 40), e.LogTail(30))
	}
	run, err := trajectory.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	vocab := llamacpptest.NVocab(t, e)
	type key struct {
		item string
		idx  int32
	}
	rows := map[key][]*trajectory.Record{}
	for i := range recs {
		r := &recs[i]
		rows[key{r.ItemID, r.RolloutIndex}] = append(rows[key{r.ItemID, r.RolloutIndex}], r)
	}
	checked, trained := 0, 0
	for _, c := range cases {
		for idx := int32(0); idx < 2; idx++ {
			rs := rows[key{c.id, idx}]
			name := fmt.Sprintf("%s/%d", c.id, idx)
			if len(rs) == 0 {
				t.Errorf("%s: no rows", name)
				continue
			}
			main := rs[0]
			if main.Status != "ok" {
				t.Errorf("%s: status %s (%+v): misbehaviour must be data", name, main.Status, main.Failure)
				continue
			}
			if main.StopReason != c.stop {
				t.Errorf("%s: stop reason %s, want %s (events %+v)", name, main.StopReason, c.stop, main.LoopEvents)
			}
			if len(main.LoopEvents) == 0 || main.LoopEvents[0].Kind != "harness" {
				t.Errorf("%s: no harness event with the reason: %+v", name, main.LoopEvents)
			}
			wantReward := 0.0
			if c.stop == "harness_exit" {
				wantReward = 1 // the harness wrote its answer file: read by the reward in the sandbox
			}
			if main.Reward != wantReward {
				t.Errorf("%s: reward %v, want %v", name, main.Reward, wantReward)
			}
			if c.branches >= 0 && max(c.branches, 1) != len(rs) {
				t.Errorf("%s: %d rows (branches), want %d", name, len(rs), max(c.branches, 1))
			}
			if c.branches == 0 {
				var calls []struct {
					Status string `json:"status"`
					Reason string `json:"reason"`
				}
				if main.Calls != "" {
					if err := json.Unmarshal([]byte(main.Calls), &calls); err != nil {
						t.Errorf("%s: calls column: %v", name, err)
					}
				}
				if len(calls) != c.calls || len(main.Tokens) != 0 {
					t.Errorf("%s: %d calls %q, %d tokens; want %d calls, no tokens", name, len(calls), main.Calls, len(main.Tokens), c.calls)
				}
				for _, cl := range calls {
					if cl.Status != "error" || !strings.Contains(cl.Reason, "context") {
						t.Errorf("%s: call %+v, want a context-length error", name, cl)
					}
				}
				continue
			}
			if c.branches < 0 && len(main.Tokens) == 0 {
				continue // no answered call: nothing to re-score
			}
			var calls []struct {
				Status string `json:"status"`
				Stream bool   `json:"stream"`
				API    string `json:"api"`
			}
			if err := json.Unmarshal([]byte(main.Calls), &calls); err != nil || len(calls) == 0 {
				t.Errorf("%s: calls column %q: %v", name, main.Calls, err)
				continue
			}
			for _, cl := range calls {
				if cl.Stream != c.streamed {
					t.Errorf("%s: a call streamed %v, want %v", name, cl.Stream, c.streamed)
				}
			}
			for _, r := range rs {
				if r.SessionID != main.SessionID || r.Reward != main.Reward {
					t.Errorf("%s branch %d: session %s reward %v, main row's %s %v", name, r.Branch, r.SessionID, r.Reward, main.SessionID, r.Reward)
				}
				n := len(r.Tokens)
				if n == 0 || len(r.LossMask) != n || len(r.Logprobs) != n {
					t.Errorf("%s branch %d: %d tokens, %d mask, %d logprobs", name, r.Branch, n, len(r.LossMask), len(r.Logprobs))
					continue
				}
				// The suite's check: trained ids re-scored against the
				// server (the first, the last and a spread of the rest).
				var pos []int
				for j, m := range r.LossMask {
					if m == 1 {
						pos = append(pos, j)
					}
				}
				trained += len(pos)
				if len(pos) == 0 && c.stop == "harness_exit" {
					t.Errorf("%s branch %d: no trained token", name, r.Branch)
				}
				if len(pos) > rescorePerBranch {
					step := float64(len(pos)-1) / float64(rescorePerBranch-1)
					pick := make([]int, rescorePerBranch)
					for k := range pick {
						pick[k] = pos[int(math.Round(float64(k)*step))]
					}
					pos = pick
				}
				for _, j := range pos {
					want := llamacpptest.Rescore(t, e, vocab, r.Tokens[:j], r.Tokens[j])
					checked++
					if got := float64(r.Logprobs[j]); math.Abs(got-want) > logprobTolerance {
						t.Errorf("%s branch %d token %d: recorded logprob %.4f, the server's %.4f", name, r.Branch, j, got, want)
						break
					}
				}
			}
			if c.branches == 2 && (rs[1].Branch != 1 || rs[1].ParentBranch != 0 || rs[1].SplitCall < 1) {
				t.Errorf("%s: second branch %d parent %d split %d", name, rs[1].Branch, rs[1].ParentBranch, rs[1].SplitCall)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no trained id re-scored")
	}
	t.Logf("%d rows; %d trained ids, %d re-scored against the server", len(recs), trained, checked)
}

func run(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
