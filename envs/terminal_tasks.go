package envs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
)

// TerminalTasks is the Hermes terminal-test env, extended: file-system and
// shell tasks checked by reading the sandbox after the episode.
type TerminalTasks struct{ cfg terminalConfig }

type terminalConfig struct {
	Image        string `yaml:"image"`
	SystemPrompt string `yaml:"system_prompt"`
	MaxTurns     int    `yaml:"max_turns"`
	GroupSize    int    `yaml:"group_size"`
}

func init() {
	Register("terminal-tasks", func(node *yaml.Node) (Env, error) {
		c := terminalConfig{Image: "rollout-sandbox:bookworm", SystemPrompt: DefaultSystemPrompt, MaxTurns: 10, GroupSize: 4}
		if err := decodeStrict(node, &c); err != nil {
			return nil, err
		}
		return &TerminalTasks{cfg: c}, nil
	})
}

var (
	_ Env    = (*TerminalTasks)(nil)
	_ Solver = (*TerminalTasks)(nil)
)

type terminalTask struct {
	ID          string `json:"id"`
	Split       string `json:"split"`
	Category    string `json:"category"`
	Instruction string `json:"instruction"`
	Setup       []struct {
		Path    string `json:"path"`
		Content string `json:"content"`
	} `json:"setup"`
	Checks []struct {
		Path    string `json:"path,omitempty"`
		Command string `json:"command,omitempty"`
		Want    string `json:"want"`
	} `json:"checks"`
	Solution json.RawMessage `json:"solution,omitempty"`
}

// Name implements Env.
func (e *TerminalTasks) Name() string { return "terminal-tasks" }

// Defaults implements Env.
func (e *TerminalTasks) Defaults() Defaults {
	return Defaults{
		Description: "File-system and shell tasks, checked by reading the sandbox (35 tasks: 30 train, 5 eval)",
		GroupSize:   e.cfg.GroupSize, MaxTurns: e.cfg.MaxTurns, Toolsets: []string{"terminal", "file"},
		Image: e.cfg.Image, Splits: []string{"train", "eval"},
	}
}

// Items implements Env.
func (e *TerminalTasks) Items(_ context.Context, split string) ([]datasets.Item, error) {
	return embeddedItems("terminal_tasks.jsonl", split)
}

// Solution implements Solver.
func (e *TerminalTasks) Solution(it datasets.Item) (json.RawMessage, bool) { return solution(it) }

// Task implements Env.
func (e *TerminalTasks) Task(_ context.Context, it datasets.Item) (Task, error) {
	var t terminalTask
	if err := decodeItem(it, &t); err != nil {
		return Task{}, err
	}
	if t.Instruction == "" || len(t.Checks) == 0 {
		return Task{}, fmt.Errorf("%w: %s row %d: a terminal task needs an instruction and checks", datasets.ErrInvalid, it.Source, it.Row)
	}
	spec := &sandbox.Spec{Image: e.cfg.Image, Workdir: "/workspace"}
	for _, f := range t.Setup {
		spec.Files = append(spec.Files, sandbox.File{Path: f.Path, Data: []byte(f.Content), Mode: 0o644})
	}
	return Task{
		Messages: chat(e.cfg.SystemPrompt, t.Instruction),
		Toolsets: []string{"terminal", "file"},
		Sandbox:  spec,
		Category: t.Category,
	}, nil
}

// Reward implements Env with Hermes' rule per check: the stripped output
// equal to the expected text scores 1, containing it 0.5, anything else
// (including a missing file) 0. The reward is the mean over checks.
func (e *TerminalTasks) Reward(ctx context.Context, it datasets.Item, _ Outcome, sb Sandbox) (rewards.Score, error) {
	var t terminalTask
	if err := decodeItem(it, &t); err != nil {
		return rewards.Score{}, err
	}
	if sb == nil {
		return rewards.Score{}, fmt.Errorf("%w: terminal-tasks needs the rollout's sandbox", rewards.ErrReward)
	}
	comps := map[string]float64{}
	total := 0.0
	for i, c := range t.Checks {
		got, ok, err := e.observe(ctx, sb, c.Path, c.Command)
		if err != nil {
			return rewards.Score{}, err
		}
		s := 0.0
		switch {
		case !ok:
		case strings.TrimSpace(got) == strings.TrimSpace(c.Want):
			s = 1
		case strings.Contains(got, strings.TrimSpace(c.Want)):
			s = 0.5
		}
		comps[fmt.Sprintf("check_%d", i)] = s
		total += s
	}
	return rewards.Score{Value: total / float64(len(t.Checks)), Components: comps}, nil
}

// observe reads a check's file, or runs its command; ok is false when the
// file is missing or the command failed.
func (e *TerminalTasks) observe(ctx context.Context, sb Sandbox, path, command string) (string, bool, error) {
	if path != "" {
		data, err := sb.ReadFile(ctx, path)
		if errors.Is(err, sandbox.ErrNotFound) {
			return "", false, nil
		}
		if err != nil {
			return "", false, fmt.Errorf("%w: read %s: %w", rewards.ErrReward, path, err)
		}
		return string(data), true, nil
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Command: command, Timeout: 30 * time.Second})
	if err != nil {
		return "", false, fmt.Errorf("%w: check %q: %w", rewards.ErrReward, command, err)
	}
	return string(res.Stdout), res.ExitCode == 0, nil
}

// EvalMetrics implements EvalMetricser: the pass rate of individual checks
// (partial progress that pass@k hides) and the turns a solved task took.
func (e *TerminalTasks) EvalMetrics(ros []ScoredRollout) map[string]float64 {
	checks, passed := 0, 0.0
	for _, r := range ros {
		for _, v := range r.Components {
			checks++
			passed += v
		}
	}
	out := solvedTurns(ros)
	if checks > 0 {
		out["check_pass_rate"] = passed / float64(checks)
	}
	return out
}

// solvedTurns is the mean number of turns of fully solved rollouts.
func solvedTurns(ros []ScoredRollout) map[string]float64 {
	n, turns := 0, 0
	for _, r := range ros {
		if r.Reward >= 1 {
			n++
			turns += r.Turns
		}
	}
	if n == 0 {
		return map[string]float64{}
	}
	return map[string]float64{"turns_when_solved_mean": float64(turns) / float64(n)}
}
