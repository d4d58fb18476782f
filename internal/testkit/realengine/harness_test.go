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

	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
	"github.com/rollout-rl/rollout/trajectory"
)

// harnessImage is the task image of harness envs (sandbox/image recipe
// "harness"): Debian sid's python3-openai and python3-anthropic.
const harnessImage = "rollout-harness:sid"

// harnessCase is one item of the harness env: which harness, its flags,
// its budget, and what the test expects of its rows.
type harnessCase struct {
	id, script, flags, budget string
	stop                      string // the rollout's stop reason
	branches                  int    // rows per rollout (-1: any number)
	streamed                  bool
	calls                     int  // with branches 0 or a call limit: the calls recorded
	parallel                  bool // every reply holds 2 tool calls, each answered by the harness
}

// parallelGrammar forces every reply into two well-formed Hermes calls of
// the harnesses' terminal tool (the tiny random model's own calls are
// nearly always malformed): a reply with parallel tool calls, whose
// commands the harness runs in its sandbox.
const parallelGrammar = `root ::= call "\n" call
call ::= "<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"" cmd "\"}}\n</tool_call>"
cmd ::= "ls" | "pwd" | "echo hi"
`

// harnessCallLimit is the parallel run's harness.max_calls: its looping
// case asks for more calls and is stopped at this many.
const harnessCallLimit = 3

// TestHarnessEnvs runs `rollout run` of a harness YAML env against the
// real llama.cpp engine with the suite's tool-call-biased model: the
// project's two harnesses (examples/harnesses, on the official OpenAI and
// Anthropic SDKs) run in rollout-harness:sid sandboxes and call their
// gateway sessions through the sandbox tunnel, streamed and not; one
// compacts its history (two branches), one crashes, one hangs past its
// budget, one overflows the context, one never calls the model; one
// speaks the Responses API. A second run, its sampler constrained by a
// grammar to two well-formed calls per reply, has every API (streamed
// and not) handle parallel tool calls, and a harness that loops stopped
// by the env's call limit. Every rollout is ok (misbehaviour is data,
// with its stop reason), the reward is computed in the sandbox, and every
// trained id of every branch re-scores against the server.
func TestHarnessEnvs(t *testing.T) {
	if err := run("docker", "image", "inspect", harnessImage); err != nil {
		t.Skipf("%s not built (rollout sandbox image --name harness): %v", harnessImage, err)
	}
	e := startEngine(t)
	vocab := llamacpptest.NVocab(t, e)
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
	biased := map[string]any{"temperature": 1.0, "max_tokens": 48,
		"extra_body": map[string]any{"logit_bias": collectionBias(t, e)}}
	recs := runHarnessEnv(t, e, harnessRun{name: "proof", cases: cases, groupSize: 2, sampling: biased})
	start := time.Now()
	checked, trained := checkHarnessRows(t, e, vocab, recs, cases, 2)
	rescoring := time.Since(start)

	// Parallel tool calls: two calls per reply, forced by the grammar;
	// max_tokens leaves room for both even spelt byte by byte (the
	// grammar lets the random model pick any tokenisation of the text).
	callBytes := len(llamacpptest.CallTemplate) + len("echo hi")
	parallel := []harnessCase{
		{id: "par-chat", script: "openai_agent.py", flags: "--calls 2", budget: "5m", stop: "harness_exit", branches: 1, parallel: true},
		{id: "par-chat-stream", script: "openai_agent.py", flags: "--stream --calls 2", budget: "5m", stop: "harness_exit", branches: 1, streamed: true, parallel: true},
		{id: "par-responses", script: "openai_agent.py", flags: "--responses --calls 2", budget: "5m", stop: "harness_exit", branches: 1, parallel: true},
		{id: "par-anthropic", script: "anthropic_agent.py", flags: "--calls 2", budget: "5m", stop: "harness_exit", branches: 1, parallel: true},
		{id: "par-anthropic-stream", script: "anthropic_agent.py", flags: "--stream --calls 2", budget: "5m", stop: "harness_exit", branches: 1, streamed: true, parallel: true},
		// A harness that loops: its call past harness.max_calls is refused
		// (the SDK raises, the harness dies), the stop reason says why.
		{id: "call-limit", script: "openai_agent.py", flags: "--calls 10", budget: "5m", stop: "harness_call_limit", branches: 1, calls: harnessCallLimit, parallel: true},
	}
	grammar := map[string]any{"temperature": 1.0, "max_tokens": 2*callBytes + 8,
		"extra_body": map[string]any{"grammar": parallelGrammar}}
	recs = runHarnessEnv(t, e, harnessRun{name: "parallel", cases: parallel, groupSize: 1, sampling: grammar, maxCalls: harnessCallLimit})
	start = time.Now()
	c, tr := checkHarnessRows(t, e, vocab, recs, parallel, 1)
	rescoring += time.Since(start)
	checked, trained = checked+c, trained+tr

	// The same SDKs through the gateway rendering in-process from the
	// engine's own GGUF (inference.local_render), never differing from
	// the server's renders: the same rows, every trained id re-scored.
	local := []harnessCase{cases[0], cases[1], cases[3], cases[6]}
	recs = runHarnessEnv(t, e, harnessRun{name: "local-render", cases: local, groupSize: 2, sampling: biased,
		localRender: e.CopyFile(t, "/models/tiny-qwen3.gguf", t.TempDir()), forbid: "differs from the"})
	start = time.Now()
	c, tr = checkHarnessRows(t, e, vocab, recs, local, 2)
	rescoring += time.Since(start)
	checked, trained = checked+c, trained+tr
	if checked == 0 || checked != trained {
		t.Fatalf("%d of %d trained ids re-scored, want all", checked, trained)
	}
	t.Logf("%d trained ids, all re-scored against the server in %s", trained, rescoring.Round(time.Millisecond))
}

// TestHarnessDistillTeacherVocabulary: distillation of a harness env whose
// sessions generate on the real llama.cpp engine, with a teacher of
// another vocabulary. No teacher that serves prompt_logprobs can run here
// (llama-server has none: docs/real-engines.md), so the simulator is the
// teacher, and its 305 ids cannot score llama.cpp's: the teacher refuses
// the session's first branch, the rollout is an infrastructure failure of
// kind distill naming the refusal (after its retries), its rows are
// written with no teacher columns, and the run exits 3 — never a success
// without its distillation. The scoring itself is proven with the
// simulator as student and teacher (server TestHarnessDistillBranches).
func TestHarnessDistillTeacherVocabulary(t *testing.T) {
	if err := run("docker", "image", "inspect", harnessImage); err != nil {
		t.Skipf("%s not built (rollout sandbox image --name harness): %v", harnessImage, err)
	}
	e := startEngine(t)
	teacher, err := sim.Start(suiteCtx(t), sim.Config{Family: "hermes", Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer teacher.Close()
	cases := []harnessCase{{id: "distill-compact", script: "openai_agent.py", flags: "--calls 4 --compact-after 2", budget: "5m"}}
	biased := map[string]any{"temperature": 1.0, "max_tokens": 48,
		"extra_body": map[string]any{"logit_bias": collectionBias(t, e)}}
	recs := runHarnessEnv(t, e, harnessRun{name: "distill", cases: cases, groupSize: 1, sampling: biased, exit: 3,
		distill: map[string]any{"endpoint": teacher.URL, "model": "rollout-sim", "top_k": 2}})
	if len(recs) == 0 {
		t.Fatal("no rows written")
	}
	for _, r := range recs {
		if r.Status != trajectory.StatusInfraFailed || r.Failure == nil || r.Failure.Kind != "distill" ||
			!strings.Contains(r.Failure.Message, "out of vocabulary") || len(r.DistillTokenIDs) != 0 || r.Advantage != nil {
			t.Fatalf("branch %d: status %s, failure %+v, %d distill positions, advantage %v", r.Branch, r.Status, r.Failure, len(r.DistillTokenIDs), r.Advantage)
		}
	}
}

// harnessRun is one `rollout run` of a harness env: its cases (groupSize
// rollouts each), the run's sampling, the env's harness.max_calls (0: the
// gateway's), the run's distill block (nil: none) and the exit code it
// must end with.
type harnessRun struct {
	name      string
	cases     []harnessCase
	groupSize int
	sampling  map[string]any
	maxCalls  int
	distill   map[string]any
	exit      int
	// localRender is inference.local_render; forbid, a text the run's
	// log must not contain.
	localRender, forbid string
}

// runHarnessEnv makes the run hr and returns its records.
func runHarnessEnv(t *testing.T, e *llamacpptest.Engine, hr harnessRun) []trajectory.Record {
	t.Helper()
	name, cases, groupSize, maxCalls := hr.name, hr.cases, hr.groupSize, hr.maxCalls
	dir := t.TempDir()
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
	harness := map[string]any{"command": "python3 /tmp/harness/{{.script}} {{.flags}}", "apis": []string{"openai", "anthropic"},
		"budget": "{{.budget}}"}
	if maxCalls > 0 {
		harness["max_calls"] = maxCalls
	}
	env := map[string]any{
		"name": "harness-" + name, "prompt": "List the files in the working directory, then say how many there are.",
		"sandbox": map[string]any{"image": harnessImage, "workdir": "/workspace", "files": files},
		"harness": harness,
		"items":   items,
		// Computed in the sandbox after the harness: did it leave its answer file.
		"rewards":    []map[string]any{{"type": "exit_code", "command": "test -f /workspace/answer.txt"}},
		"group_size": groupSize,
	}
	envPath := filepath.Join(dir, "harness.yaml")
	if err := os.WriteFile(envPath, []byte(mustJSON(env)), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	cfg := map[string]any{
		"env": envPath, "groups": len(cases), "group_size": groupSize, "seed": 35,
		"inference": map[string]any{"backend": "llamacpp", "endpoints": []string{e.URL}, "retries": 3, "timeout": "2m"},
		"sampling":  hr.sampling,
		"parser":    "hermes", "reasoning_parser": "qwen3", "rollout_timeout": "5m",
		"limits":  map[string]any{"rollouts_in_flight": slots, "groups_in_flight": slots / 2, "sandboxes": slots},
		"sandbox": map[string]any{"warm_pool": -1},
		"output":  map[string]any{"dir": out},
	}
	if hr.localRender != "" {
		cfg["inference"].(map[string]any)["local_render"] = hr.localRender
	}
	if hr.distill != nil {
		cfg["distill"] = hr.distill
	}
	cfgPath := filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(cfgPath, []byte(mustJSON(cfg)), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stdout, stderr, code := runRollout(t, suiteCtx(t), "run", "-c", cfgPath)
	t.Logf("rollout run of the %s harness env: %d items × %d in %s\n%s", name, len(cases), groupSize, time.Since(start).Round(time.Second), stdout)
	if code != hr.exit {
		t.Fatalf("rollout run: exit %d, want %d\nstdout:\n%s\nstderr (tail):\n%s\nserver log:\n%s", code, hr.exit, stdout, tail(stderr, 40), e.LogTail(30))
	}
	if hr.forbid != "" && strings.Contains(stderr, hr.forbid) {
		t.Fatalf("rollout run logged %q:\n%s", hr.forbid, tail(stderr, 40))
	}
	run, err := trajectory.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// checkHarnessRows asserts the cases' rows and re-scores every trained id
// of every branch against the server, in batches (the suite's check:
// the recorded logprob is the server's for that id after that prefix).
// It returns the ids re-scored and the ids trained.
func checkHarnessRows(t *testing.T, e *llamacpptest.Engine, vocab int, recs []trajectory.Record, cases []harnessCase, groupSize int) (checked, trained int) {
	t.Helper()
	type key struct {
		item string
		idx  int32
	}
	rows := map[key][]*trajectory.Record{}
	for i := range recs {
		r := &recs[i]
		rows[key{r.ItemID, r.RolloutIndex}] = append(rows[key{r.ItemID, r.RolloutIndex}], r)
	}
	for _, c := range cases {
		for idx := int32(0); idx < int32(groupSize); idx++ {
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
			var calls []struct {
				Status string `json:"status"`
				Reason string `json:"reason"`
				Stream bool   `json:"stream"`
			}
			if main.Calls != "" {
				if err := json.Unmarshal([]byte(main.Calls), &calls); err != nil {
					t.Errorf("%s: calls column: %v", name, err)
				}
			}
			if c.calls > 0 && len(calls) != c.calls {
				t.Errorf("%s: %d calls recorded, want %d", name, len(calls), c.calls)
			}
			if c.branches == 0 {
				if len(main.Tokens) != 0 {
					t.Errorf("%s: %d tokens; want none", name, len(main.Tokens))
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
			if len(calls) == 0 {
				t.Errorf("%s: no calls in %q", name, main.Calls)
				continue
			}
			for _, cl := range calls {
				if cl.Stream != c.streamed {
					t.Errorf("%s: a call streamed %v, want %v", name, cl.Stream, c.streamed)
				}
			}
			if c.parallel {
				checkParallel(t, name, main)
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
				want := llamacpptest.RescoreMany(t, e, vocab, r.Tokens, pos)
				checked += len(pos)
				for k, j := range pos {
					if got := float64(r.Logprobs[j]); math.Abs(got-want[k]) > logprobTolerance {
						t.Errorf("%s branch %d token %d: recorded logprob %.4f, the server's %.4f", name, r.Branch, j, got, want[k])
						break
					}
				}
			}
			if c.branches == 2 && (rs[1].Branch != 1 || rs[1].ParentBranch != 0 || rs[1].SplitCall < 1) {
				t.Errorf("%s: second branch %d parent %d split %d", name, rs[1].Branch, rs[1].ParentBranch, rs[1].SplitCall)
			}
		}
	}
	return checked, trained
}

// checkParallel asserts a grammar-forced session's conversation: every
// reply carries two well-formed calls, each answered by a tool result the
// harness produced by running its command in the sandbox, and the echoes
// extended one branch.
func checkParallel(t *testing.T, name string, r *trajectory.Record) {
	t.Helper()
	var msgs []message
	if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
		t.Errorf("%s: messages: %v", name, err)
		return
	}
	replies := 0
	answered := map[string]bool{}
	for _, m := range msgs {
		switch m.Role {
		case "assistant":
			replies++
			if len(m.ToolCalls) != 2 {
				t.Errorf("%s: a reply with %d tool calls, want 2 (grammar-forced): content %v", name, len(m.ToolCalls), m.Content)
			}
			for _, c := range m.ToolCalls {
				var args map[string]any
				if c.Function.Name != "terminal" || json.Unmarshal([]byte(c.Function.Arguments), &args) != nil || args["command"] == nil {
					t.Errorf("%s: call %s(%s) is not a well-formed terminal call", name, c.Function.Name, c.Function.Arguments)
				}
			}
		case "tool":
			// The harness ran the command (ls, pwd, echo): its output,
			// never an error.
			b, _ := json.Marshal(m.Content)
			if s := string(b); s == `""` || s == "null" || strings.Contains(s, "error") {
				t.Errorf("%s: tool result %s", name, s)
			}
			answered[m.ToolCallID] = true
		}
	}
	if replies == 0 {
		t.Errorf("%s: no reply in the branch's messages", name)
	}
	// Every call but the last reply's (the harness ran those and stopped,
	// or its next call was refused) is answered in the history.
	seen := 0
	for _, m := range msgs {
		if m.Role != "assistant" {
			continue
		}
		if seen++; seen == replies {
			break
		}
		for _, c := range m.ToolCalls {
			if !answered[c.ID] {
				t.Errorf("%s: call %s has no tool result in the history", name, c.ID)
			}
		}
	}
}

func run(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
