package envs

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/rewards"
)

// Distilled is implemented by envs that bring their own distillation
// teacher (agentic-opd's teacher config). The run config's distill block,
// when set, wins.
type Distilled interface {
	Teacher() *inference.TeacherConfig
}

// Hinted is implemented by envs that may ask for the hint-enhanced
// teacher context (agentic-opd's hints: true); the teacher in use, the
// env's or the run config's, then judges every turn for a hint.
type Hinted interface {
	DistillHints() bool
}

// AgenticOPD ports Hermes' agentic on-policy distillation env: coding
// tasks with hidden tests (swe-tests' tasks), scored with Hermes' blend
// clamp(0.7·correctness + 0.15·efficiency + 0.15·tool_usage), and a
// teacher endpoint that scores every trained token of each rollout
// (docs/distillation.md). Correctness is the fraction of the hidden tests
// passing (Hermes grades one test script's exit status and output).
type AgenticOPD struct {
	cfg opdConfig
	swe *SWETests
}

type opdConfig struct {
	Image        string        `yaml:"image" json:"image"`
	SystemPrompt string        `yaml:"system_prompt" json:"system_prompt"`
	MaxTurns     int           `yaml:"max_turns" json:"max_turns"`
	GroupSize    int           `yaml:"group_size" json:"group_size"`
	TestTimeout  time.Duration `yaml:"test_timeout" json:"test_timeout"`
	// Teacher is the distillation teacher (vLLM with prompt_logprobs);
	// unset = no distillation unless the run config has a distill block.
	Teacher *inference.TeacherConfig `yaml:"teacher,omitempty" json:"teacher,omitempty"`
	// Hints: Hermes' hint-enhanced teacher context (a judge extracts a hint
	// from each turn's next state; the teacher scores that turn with the
	// hint in its context), with default settings unless the teacher's
	// config has a hints block (docs/distillation.md).
	Hints bool `yaml:"hints,omitempty" json:"hints,omitempty"`
}

func init() {
	Register("agentic-opd", func(node *yaml.Node) (Env, error) {
		c := opdConfig{Image: "rollout-sandbox:bookworm", SystemPrompt: DefaultSystemPrompt, MaxTurns: 15, GroupSize: 4, TestTimeout: 2 * time.Minute}
		if err := decodeStrict(node, &c); err != nil {
			return nil, err
		}
		if c.MaxTurns < 1 || c.GroupSize < 1 {
			return nil, fmt.Errorf("%w: max_turns and group_size must be positive", ErrConfig)
		}
		if t := c.Teacher; t != nil && (t.Endpoint == "" || t.Model == "") {
			return nil, fmt.Errorf("%w: teacher: endpoint and model are required", ErrConfig)
		}
		swe := &SWETests{cfg: sweConfig{Image: c.Image, SystemPrompt: c.SystemPrompt, MaxTurns: c.MaxTurns, GroupSize: c.GroupSize, TestTimeout: c.TestTimeout}}
		return &AgenticOPD{cfg: c, swe: swe}, nil
	})
}

var (
	_ Env       = (*AgenticOPD)(nil)
	_ Solver    = (*AgenticOPD)(nil)
	_ Distilled = (*AgenticOPD)(nil)
	_ Hinted    = (*AgenticOPD)(nil)
)

// Name implements Env.
func (e *AgenticOPD) Name() string { return "agentic-opd" }

// Config implements Configurable.
func (e *AgenticOPD) Config() any { return e.cfg }

// Teacher implements Distilled.
func (e *AgenticOPD) Teacher() *inference.TeacherConfig { return e.cfg.Teacher }

// DistillHints implements Hinted.
func (e *AgenticOPD) DistillHints() bool { return e.cfg.Hints }

// Defaults implements Env.
func (e *AgenticOPD) Defaults() Defaults {
	return Defaults{
		Description: "Hermes' agentic on-policy distillation: coding tasks with hidden tests, reward 0.7 correctness + 0.15 efficiency + 0.15 tool use; a teacher (env_config.teacher or distill:) scores every trained token (8 tasks: 6 train, 2 eval)",
		GroupSize:   e.cfg.GroupSize, MaxTurns: e.cfg.MaxTurns, Toolsets: []string{"terminal", "file"},
		Image: e.cfg.Image, Splits: []string{"train", "eval"},
	}
}

// Items implements Env.
func (e *AgenticOPD) Items(ctx context.Context, split string) ([]datasets.Item, error) {
	return e.swe.Items(ctx, split)
}

// Solution implements Solver.
func (e *AgenticOPD) Solution(it datasets.Item) (json.RawMessage, bool) { return e.swe.Solution(it) }

// Task implements Env.
func (e *AgenticOPD) Task(ctx context.Context, it datasets.Item) (Task, error) {
	t, err := e.swe.Task(ctx, it)
	t.MaxTurns = e.cfg.MaxTurns
	return t, err
}

// Reward implements Env: Hermes' blend.
func (e *AgenticOPD) Reward(ctx context.Context, it datasets.Item, out Outcome, sb Sandbox) (rewards.Score, error) {
	tests, err := e.swe.Reward(ctx, it, out, sb)
	if err != nil {
		return rewards.Score{}, err
	}
	correct := tests.Value
	eff := opdEfficiency(out.Turns, e.cfg.MaxTurns)
	use := opdToolUsage(out)
	v := min(1, max(0, 0.7*correct+0.15*eff+0.15*use))
	return rewards.Score{Value: v, Components: map[string]float64{"correctness": correct, "efficiency": eff, "tool_usage": use}}, nil
}

// opdEfficiency: ≤ 3 turns → 1; ≤ max/2 → 0.8; ≤ 3·max/4 → 0.5; else 0.2.
func opdEfficiency(turns, maxTurns int) float64 {
	switch {
	case turns <= 3:
		return 1
	case float64(turns) <= float64(maxTurns)/2:
		return 0.8
	case float64(turns) <= 0.75*float64(maxTurns):
		return 0.5
	}
	return 0.2
}

// opdToolUsage: terminal and (write_file or patch) → 1; terminal only →
// 0.6; any other tool → 0.3; none → 0.
func opdToolUsage(out Outcome) float64 {
	used := map[string]bool{}
	for _, m := range out.Messages {
		for _, c := range m.ToolCalls {
			used[c.Function.Name] = true
		}
	}
	switch {
	case used["terminal"] && (used["write_file"] || used["patch"]):
		return 1
	case used["terminal"]:
		return 0.6
	case len(used) > 0:
		return 0.3
	}
	return 0
}
