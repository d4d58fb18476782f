package envs

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/tools"
)

// MathPython: questions with numeric answers, a `python` tool that runs
// code in the sandbox, and a reward that extracts the answer (last
// \boxed{}, else the last number) and compares it with tolerance.
type MathPython struct{ cfg mathConfig }

type mathConfig struct {
	Image        string  `yaml:"image"`
	SystemPrompt string  `yaml:"system_prompt"`
	MaxTurns     int     `yaml:"max_turns"`
	GroupSize    int     `yaml:"group_size"`
	RelTol       float64 `yaml:"rel_tol"`
	AbsTol       float64 `yaml:"abs_tol"`
}

const mathSystemPrompt = "You solve math problems. You may run Python code with the python tool. " +
	"Give the final answer as \\boxed{N}."

func init() {
	Register("math-python", func(node *yaml.Node) (Env, error) {
		c := mathConfig{Image: "rollout-sandbox:bookworm", SystemPrompt: mathSystemPrompt, MaxTurns: 6, GroupSize: 8, RelTol: 1e-6, AbsTol: 1e-9}
		if err := decodeStrict(node, &c); err != nil {
			return nil, err
		}
		return &MathPython{cfg: c}, nil
	})
}

var (
	_ Env    = (*MathPython)(nil)
	_ Solver = (*MathPython)(nil)
)

// Name implements Env.
func (e *MathPython) Name() string { return "math-python" }

// Defaults implements Env.
func (e *MathPython) Defaults() Defaults {
	return Defaults{
		Description: "Numeric math questions with a python tool in the sandbox; answer checked with tolerance (20 questions: 16 train, 4 eval)",
		GroupSize:   e.cfg.GroupSize, MaxTurns: e.cfg.MaxTurns, Toolsets: []string{"python"},
		Image: e.cfg.Image, Splits: []string{"train", "eval"},
	}
}

// Items implements Env.
func (e *MathPython) Items(_ context.Context, split string) ([]datasets.Item, error) {
	return embeddedItems("math_python.jsonl", split)
}

// Solution implements Solver.
func (e *MathPython) Solution(it datasets.Item) (json.RawMessage, bool) { return solution(it) }

// Task implements Env.
func (e *MathPython) Task(_ context.Context, it datasets.Item) (Task, error) {
	q, err := it.String("question")
	if err != nil {
		return Task{}, err
	}
	ans, err := it.String("answer")
	if err != nil {
		return Task{}, err
	}
	cat, _ := it.String("category")
	return Task{
		Messages: chat(e.cfg.SystemPrompt, q),
		Tools:    []tools.Tool{PythonTool()},
		Sandbox:  &sandbox.Spec{Image: e.cfg.Image, Workdir: "/workspace"},
		Answer:   ans,
		Category: cat,
	}, nil
}

// Reward implements Env.
func (e *MathPython) Reward(ctx context.Context, it datasets.Item, out Outcome, _ Sandbox) (rewards.Score, error) {
	ans, err := it.String("answer")
	if err != nil {
		return rewards.Score{}, err
	}
	return rewards.NumericMatch{RelTol: e.cfg.RelTol, AbsTol: e.cfg.AbsTol}.Score(ctx, rewards.Input{Answer: ans, Final: out.Final})
}

// PythonTool runs a Python program in the rollout's sandbox. The code is
// written to a file (never interpolated into a shell command) and run with
// python3; the result is JSON {"stdout", "stderr", "exit_code"}.
func PythonTool() tools.Tool {
	return tools.Tool{
		Name:        "python",
		Description: "Run a Python 3 program in the sandbox and return its stdout, stderr and exit code. Print what you need to see.",
		Parameters: json.RawMessage(`{"type":"object","properties":{` +
			`"code":{"type":"string","description":"The Python program to run."},` +
			`"timeout":{"type":"integer","description":"Seconds before the program is killed (default 30, max 120)."}},` +
			`"required":["code"]}`),
		Toolset: "python",
		Class:   tools.Exclusive,
		Handler: runPython,
	}
}

func runPython(ctx context.Context, rt *tools.Runtime, args tools.Args) (string, error) {
	code, _ := args["code"].(string)
	timeout := 30 * time.Second
	if n, ok := args["timeout"].(json.Number); ok {
		if s, err := n.Int64(); err == nil && s > 0 {
			timeout = time.Duration(min(s, 120)) * time.Second
		}
	}
	path := fmt.Sprintf("/tmp/rollout-python-%s.py", randomHex())
	if err := rt.Sandbox.WriteFile(ctx, path, []byte(code), 0o644); err != nil {
		return "", fmt.Errorf("write program: %w", err)
	}
	res, err := rt.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"python3", path}, Cwd: "/workspace", Timeout: timeout, OutputCap: 64 << 10})
	if err != nil {
		return "", fmt.Errorf("run python: %w", err)
	}
	out, _ := json.Marshal(map[string]any{"stdout": string(res.Stdout), "stderr": string(res.Stderr), "exit_code": res.ExitCode})
	return string(out), nil
}
