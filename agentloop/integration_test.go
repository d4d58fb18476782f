package agentloop

// Integration tests: the loop against the real vLLM simulator (over HTTP,
// through the real inference backends) and real Docker sandboxes.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/sandbox/host"
	"github.com/rollout-rl/rollout/tools"
)

const itImage = "rollout-sandbox:bookworm"

var (
	dockerOnce sync.Once
	itDocker   *docker.Docker
	itErr      error
)

func needDocker(t *testing.T) *docker.Docker {
	t.Helper()
	dockerOnce.Do(func() {
		itDocker, itErr = docker.New(context.Background(), docker.Options{Options: host.Options{Instance: "looptest", ReapInterval: -1}})
	})
	if itErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and Docker is not usable: %v", itErr)
		}
		t.Skipf("Docker not usable (CI=true makes this a failure): %v", itErr)
	}
	return itDocker
}

type episodeSetup struct {
	sb     sandbox.Sandbox
	env    *tools.Runtime
	set    *tools.Set
	policy inference.Policy
	srv    *sim.Server
}

// setupEpisode starts a simulator with the scripts, a sandbox and the
// built-in tools.
func setupEpisode(t *testing.T, backend string, simCfg sim.Config) *episodeSetup {
	t.Helper()
	d := needDocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if simCfg.Family == "" {
		simCfg.Family = "hermes"
	}
	srv, err := sim.Start(context.Background(), simCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	pol, err := inference.New(inference.Config{Backend: backend, Endpoints: []string{srv.URL}, ChatTokenIDs: backend == "chat", Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := pol.(interface{ Close() error }); ok {
		t.Cleanup(func() { c.Close() })
	}
	sb, err := d.Create(ctx, sandbox.Spec{Image: itImage})
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	set, err := tools.Default().Resolve(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &episodeSetup{sb: sb, env: tools.NewRuntime(sb, t.Name()), set: set, policy: pol, srv: srv}
}

func (e *episodeSetup) run(ctx context.Context, task string, mod func(*Config), policy inference.Policy) (Result, error) {
	cfg := Config{ID: "it", Messages: []openai.ChatCompletionMessage{{Role: "system", Content: "You are a coding agent."}, {Role: "user", Content: task}},
		Tools: e.set, Parser: "hermes", MaxTurns: 12}
	if mod != nil {
		mod(&cfg)
	}
	if policy == nil {
		policy = e.policy
	}
	return Run(ctx, cfg, Deps{Policy: policy, Runtime: e.env})
}

func simStep(calls ...sim.Call) sim.Step { return sim.Step{ToolCalls: calls} }

func simCall(name string, args map[string]any) sim.Call { return sim.Call{Name: name, Arguments: args} }

func toolResult(t *testing.T, res Result, i int) map[string]any {
	t.Helper()
	var n int
	for _, m := range res.Messages {
		if m.Role == "tool" {
			if n == i {
				var v map[string]any
				if err := json.Unmarshal([]byte(m.Content), &v); err != nil {
					t.Fatalf("tool result %d is not JSON: %s", i, m.Content)
				}
				return v
			}
			n++
		}
	}
	t.Fatalf("no tool result %d", i)
	return nil
}

func TestEpisodeEditsFilesAndRunsTests(t *testing.T) {
	calc := "def add(a, b):\n    return a - b\n"
	test := "import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\nif __name__ == '__main__':\n    unittest.main()\n"
	script := sim.Script{Match: "fix calc", Steps: []sim.Step{
		simStep(simCall("write_file", map[string]any{"path": "/workspace/calc.py", "content": calc}),
			simCall("write_file", map[string]any{"path": "/workspace/test_calc.py", "content": test})),
		simStep(simCall("terminal", map[string]any{"command": "cd /workspace && python3 -m unittest -q test_calc 2>&1 | tail -3"})),
		simStep(simCall("patch", map[string]any{"mode": "replace", "path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"})),
		simStep(simCall("terminal", map[string]any{"command": "python3 -m unittest -q test_calc"})),
		simStep(simCall("read_file", map[string]any{"path": "calc.py"}), simCall("search_files", map[string]any{"pattern": "def add", "path": "/workspace"})),
		{Final: "The test passes now."},
	}}
	for _, backend := range []string{"vllm", "chat"} {
		t.Run(backend, func(t *testing.T) {
			e := setupEpisode(t, backend, sim.Config{Scripts: []sim.Script{script}, Reasoning: true})
			mod := func(c *Config) {
				if backend == "vllm" {
					c.ReasoningParser = "qwen3"
				}
			}
			res, err := e.run(context.Background(), "Please fix calc.py", mod, nil)
			if err != nil || res.StopReason != StopFinished || !res.FinishedNaturally || res.TurnsUsed != 6 {
				t.Fatalf("stop %s err %v turns %d errors %+v", res.StopReason, err, res.TurnsUsed, res.ToolErrors)
			}
			if len(res.ToolErrors) != 0 {
				t.Fatalf("tool errors: %+v", res.ToolErrors)
			}
			if r := toolResult(t, res, 2); !strings.Contains(r["output"].(string), "FAILED") {
				t.Fatalf("first test run should fail: %v", r)
			}
			if r := toolResult(t, res, 3); r["success"] != true || !strings.Contains(r["diff"].(string), "+    return a + b") {
				t.Fatalf("patch: %v", r)
			}
			if r := toolResult(t, res, 4); r["exit_code"] != float64(0) || !strings.Contains(r["output"].(string), "OK") {
				t.Fatalf("second test run should pass (cwd persisted): %v", r)
			}
			if r := toolResult(t, res, 5); !strings.Contains(r["content"].(string), "     2|    return a + b") {
				t.Fatalf("read_file: %v", r)
			}
			if !res.Turns[0].Parallel || !res.Turns[4].Parallel || res.Turns[1].Parallel {
				t.Fatalf("parallelism per turn: %+v", res.Turns)
			}
			got, err := e.sb.ReadFile(context.Background(), "/workspace/calc.py")
			if err != nil || string(got) != "def add(a, b):\n    return a + b\n" {
				t.Fatalf("calc.py in sandbox: %q %v", got, err)
			}
			if res.ReasoningPerTurn[0] == nil || res.Messages[2].ReasoningContent == "" {
				t.Fatalf("reasoning lost: %v", res.ReasoningPerTurn)
			}
			seq := res.Sequence
			if len(seq.Tokens) == 0 || len(seq.Mask) != len(seq.Tokens) || len(seq.Logprobs) != len(seq.Tokens) {
				t.Fatalf("sequence: %d tokens, %d mask, %d logprobs", len(seq.Tokens), len(seq.Mask), len(seq.Logprobs))
			}
			if res.Counters.CompletionTokens == 0 {
				t.Fatal("no token accounting")
			}
		})
	}
}

func TestInvalidCallsAgainstSimulator(t *testing.T) {
	malformed := "Let me run it.\n<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \n</tool_call>"
	script := sim.Script{Match: "bad calls", Steps: []sim.Step{
		{Final: malformed},
		simStep(simCall("browse", map[string]any{"url": "x"})),
		simStep(simCall("terminal", map[string]any{"command": "echo coerced", "timeout": "5"})),
		{Final: "ok"},
	}}
	e := setupEpisode(t, "vllm", sim.Config{Scripts: []sim.Script{script}})
	res, err := e.run(context.Background(), "bad calls please", nil, nil)
	if err != nil || res.StopReason != StopFinished || res.TurnsUsed != 4 {
		t.Fatalf("stop %s err %v turns %d", res.StopReason, err, res.TurnsUsed)
	}
	if len(res.ToolErrors) != 2 || res.ToolErrors[0].Kind != tools.InvalidParse || res.ToolErrors[1].Kind != tools.InvalidUnknownTool {
		t.Fatalf("tool errors %+v", res.ToolErrors)
	}
	if r := toolResult(t, res, 0); !strings.Contains(r["error"].(string), "Could not parse tool call") {
		t.Fatalf("parse error result: %v", r)
	}
	if r := toolResult(t, res, 1); !strings.HasPrefix(r["error"].(string), "Unknown tool 'browse'. Available tools: ['patch', 'process'") {
		t.Fatalf("unknown tool result: %v", r)
	}
	if r := toolResult(t, res, 2); r["output"] != "coerced" {
		t.Fatalf("coerced call: %v", r)
	}
}

func TestToolTimeoutAndBudgetSpill(t *testing.T) {
	script := sim.Script{Match: "slow", Steps: []sim.Step{
		simStep(simCall("terminal", map[string]any{"command": "echo before; sleep 30", "timeout": 1})),
		simStep(simCall("terminal", map[string]any{"command": "seq 1 3000"})),
		{Final: "done"},
	}}
	e := setupEpisode(t, "vllm", sim.Config{Scripts: []sim.Script{script}})
	res, err := e.run(context.Background(), "slow things", func(c *Config) { c.Budget.Overrides = map[string]int{"terminal": 2000} }, nil)
	if err != nil || res.StopReason != StopFinished {
		t.Fatalf("stop %s err %v", res.StopReason, err)
	}
	var first map[string]any
	json.Unmarshal([]byte(findTool(res, 0).Content), &first)
	// The first result is small enough to stay; it is the timeout.
	if first["exit_code"] != float64(124) || !strings.Contains(first["output"].(string), "before\n[Command timed out after 1s]") {
		t.Fatalf("timeout: %v", first)
	}
	spilled := findTool(res, 1)
	if !strings.HasPrefix(spilled.Content, "<persisted-output>") {
		t.Fatalf("not spilled: %.300s", spilled.Content)
	}
	file := "/tmp/hermes-results/" + spilled.ToolCallID + ".txt"
	if !strings.Contains(spilled.Content, "Full output saved to: "+file) {
		t.Fatalf("spill note: %.300s", spilled.Content)
	}
	data, err := e.sb.ReadFile(context.Background(), file)
	if err != nil {
		t.Fatalf("spill file not in the sandbox: %v", err)
	}
	var full map[string]any
	if err := json.Unmarshal(data, &full); err != nil || !strings.HasSuffix(full["output"].(string), "2999\n3000") {
		t.Fatalf("spill file content: %.200s (%v)", data, err)
	}
}

func findTool(res Result, i int) openai.ChatCompletionMessage {
	n := 0
	for _, m := range res.Messages {
		if m.Role == "tool" {
			if n == i {
				return m
			}
			n++
		}
	}
	return openai.ChatCompletionMessage{}
}

// hookPolicy runs a hook before each generation of the wrapped policy.
type hookPolicy struct {
	inner  inference.Policy
	before func(ctx context.Context, n int)
}

type hookEpisode struct {
	inference.Episode
	p *hookPolicy
	n int
}

func (h *hookPolicy) Start(ctx context.Context, spec inference.EpisodeSpec) (inference.Episode, error) {
	ep, err := h.inner.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &hookEpisode{Episode: ep, p: h}, nil
}

func (h *hookEpisode) Generate(ctx context.Context, m []openai.ChatCompletionMessage) (inference.Turn, error) {
	h.n++
	h.p.before(ctx, h.n)
	return h.Episode.Generate(ctx, m)
}

func TestSandboxKilledMidEpisode(t *testing.T) {
	script := sim.Script{Match: "kill", Steps: []sim.Step{
		simStep(simCall("terminal", map[string]any{"command": "echo alive"})),
		simStep(simCall("terminal", map[string]any{"command": "echo never"})),
		{Final: "unreachable"},
	}}
	e := setupEpisode(t, "vllm", sim.Config{Scripts: []sim.Script{script}})
	d := needDocker(t)
	hook := &hookPolicy{inner: e.policy, before: func(ctx context.Context, n int) {
		if n == 2 {
			if _, err := d.Client().ContainerKill(context.Background(), e.sb.ID(), client.ContainerKillOptions{Signal: "KILL"}); err != nil {
				t.Errorf("kill: %v", err)
			}
		}
	}}
	res, err := e.run(context.Background(), "kill the box", nil, hook)
	if res.StopReason != StopSandboxErr || !errors.Is(err, sandbox.ErrUnavailable) || !res.StopReason.Failed() {
		t.Fatalf("stop %s err %v", res.StopReason, err)
	}
	if res.TurnsUsed != 2 || toolResult(t, res, 0)["output"] != "alive" {
		t.Fatalf("turns %d", res.TurnsUsed)
	}
	t.Logf("stop error: %v", err)
}

func TestMaxTurnsAgainstSimulator(t *testing.T) {
	var steps []sim.Step
	for i := 0; i < 10; i++ {
		steps = append(steps, simStep(simCall("terminal", map[string]any{"command": fmt.Sprintf("echo %d", i)})))
	}
	e := setupEpisode(t, "vllm", sim.Config{Scripts: []sim.Script{{Match: "loop", Steps: steps}}})
	res, err := e.run(context.Background(), "loop forever", func(c *Config) { c.MaxTurns = 3; c.BudgetWarnings = true }, nil)
	if err != nil || res.StopReason != StopMaxTurns || res.TurnsUsed != 3 || res.Messages[len(res.Messages)-1].Role != "tool" {
		t.Fatalf("stop %s err %v turns %d", res.StopReason, err, res.TurnsUsed)
	}
	if len(res.Sequence.Tokens) == 0 {
		t.Fatal("a max_turns episode still has its token sequence")
	}
}

func TestCancellationAgainstSimulator(t *testing.T) {
	t.Run("mid-generation", func(t *testing.T) {
		e := setupEpisode(t, "vllm", sim.Config{Latency: sim.Latency{TTFT: time.Minute}})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		hook := &hookPolicy{inner: e.policy, before: func(context.Context, int) {
			// Cancel while the request is in flight.
			go func() { time.Sleep(200 * time.Millisecond); cancel() }()
		}}
		res, err := e.run(ctx, "hello", nil, hook)
		if res.StopReason != StopCancelled || !errors.Is(err, context.Canceled) {
			t.Fatalf("stop %s err %v", res.StopReason, err)
		}
	})
	t.Run("mid-tool", func(t *testing.T) {
		script := sim.Script{Match: "sleepy", Steps: []sim.Step{simStep(simCall("terminal", map[string]any{"command": "touch /tmp/started; sleep 120"}))}}
		e := setupEpisode(t, "vllm", sim.Config{Scripts: []sim.Script{script}})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			// Cancel once the command is running in the sandbox.
			for ctx.Err() == nil {
				if _, err := e.sb.ReadFile(context.Background(), "/tmp/started"); err == nil {
					cancel()
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		res, err := e.run(ctx, "sleepy task", nil, nil)
		if res.StopReason != StopCancelled || !errors.Is(err, context.Canceled) {
			t.Fatalf("stop %s err %v", res.StopReason, err)
		}
		// The sandbox is still usable and the command was killed.
		r, err := e.sb.Exec(context.Background(), sandbox.ExecRequest{Command: "ps -eo comm | grep -c '^sleep' || true"})
		if err != nil || strings.TrimSpace(string(r.Stdout)) != "0" {
			t.Fatalf("sleep still running: %q %v", r.Stdout, err)
		}
	})
}

// A Mistral model in tokens mode: the loop re-renders every turn through
// /tokenize, whose Mistral tokenizer refuses tool-call ids that are not 9
// alphanumerics (the simulator copies the check; vLLM's chat route
// shortens longer ids, /tokenize does not). Parsed calls without a
// [CALL_ID] and the answers to unparsable calls get ids of that shape.
func TestMistralToolCallIDsRender(t *testing.T) {
	malformed := "Let me look.[TOOL_CALLS][{\"name\": \"terminal\", \"arguments\": {\"command\": "
	script := sim.Script{Match: "mistral ids", Steps: []sim.Step{
		{Final: malformed},
		simStep(simCall("terminal", map[string]any{"command": "echo one"}), simCall("terminal", map[string]any{"command": "echo two"})),
		{Final: "done"},
	}}
	for _, backend := range []string{"vllm", "chat"} {
		t.Run(backend, func(t *testing.T) {
			e := setupEpisode(t, backend, sim.Config{Family: "mistral", Scripts: []sim.Script{script}})
			res, err := e.run(context.Background(), "mistral ids please", func(c *Config) { c.Parser = "mistral" }, nil)
			if err != nil || res.StopReason != StopFinished || res.TurnsUsed != 3 {
				t.Fatalf("stop %s err %v turns %d errors %+v", res.StopReason, err, res.TurnsUsed, res.ToolErrors)
			}
			if len(res.ToolErrors) != 1 || res.ToolErrors[0].Kind != tools.InvalidParse {
				t.Fatalf("tool errors %+v", res.ToolErrors)
			}
			var ids []string
			for _, m := range res.Messages {
				for _, tc := range m.ToolCalls {
					ids = append(ids, tc.ID)
				}
				if m.Role == "tool" {
					ids = append(ids, m.ToolCallID)
				}
			}
			if len(ids) != 5 { // the unparsable call's answer, two calls, their two answers
				t.Fatalf("ids %q, want 5", ids)
			}
			for _, id := range ids {
				if len(id) != 9 || strings.Trim(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") != "" {
					t.Fatalf("id %q is not 9 alphanumerics (all: %q)", id, ids)
				}
			}
			if r := toolResult(t, res, 2); r["output"] != "two" {
				t.Fatalf("second call: %v", r)
			}
		})
	}
}
