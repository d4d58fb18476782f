package envs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
)

// SWETests: write or fix code until hidden tests pass. The tests are
// uploaded only after the episode, into a fresh directory with a random
// name, and run with an isolated interpreter, so the agent can neither read
// nor tamper with them. Reward = fraction of tests passing (pytest JUnit
// XML).
type SWETests struct{ cfg sweConfig }

type sweConfig struct {
	Image        string        `yaml:"image"`
	SystemPrompt string        `yaml:"system_prompt"`
	MaxTurns     int           `yaml:"max_turns"`
	GroupSize    int           `yaml:"group_size"`
	TestTimeout  time.Duration `yaml:"test_timeout"`
}

func init() {
	Register("swe-tests", func(node *yaml.Node) (Env, error) {
		c := sweConfig{Image: "rollout-sandbox:bookworm", SystemPrompt: DefaultSystemPrompt, MaxTurns: 15, GroupSize: 4, TestTimeout: 2 * time.Minute}
		if err := decodeStrict(node, &c); err != nil {
			return nil, err
		}
		return &SWETests{cfg: c}, nil
	})
}

var (
	_ Env    = (*SWETests)(nil)
	_ Solver = (*SWETests)(nil)
)

type sweTask struct {
	ID          string            `json:"id"`
	Category    string            `json:"category"`
	Instruction string            `json:"instruction"`
	Files       map[string]string `json:"files"` // placed in /workspace before the episode
	Tests       map[string]string `json:"tests"` // hidden until the reward
}

// Name implements Env.
func (e *SWETests) Name() string { return "swe-tests" }

// Defaults implements Env.
func (e *SWETests) Defaults() Defaults {
	return Defaults{
		Description: "Write or fix Python code until hidden pytest tests pass; reward = fraction passing (8 tasks: 6 train, 2 eval)",
		GroupSize:   e.cfg.GroupSize, MaxTurns: e.cfg.MaxTurns, Toolsets: []string{"terminal", "file"},
		Image: e.cfg.Image, Splits: []string{"train", "eval"},
	}
}

// Items implements Env.
func (e *SWETests) Items(_ context.Context, split string) ([]datasets.Item, error) {
	return embeddedItems("swe_tests.jsonl", split)
}

// Solution implements Solver.
func (e *SWETests) Solution(it datasets.Item) (json.RawMessage, bool) { return solution(it) }

func (e *SWETests) decode(it datasets.Item) (sweTask, error) {
	var t sweTask
	if err := decodeItem(it, &t); err != nil {
		return t, err
	}
	if t.Instruction == "" || len(t.Tests) == 0 {
		return t, fmt.Errorf("%w: %s row %d: a swe task needs an instruction and tests", datasets.ErrInvalid, it.Source, it.Row)
	}
	return t, nil
}

// Task implements Env.
func (e *SWETests) Task(_ context.Context, it datasets.Item) (Task, error) {
	t, err := e.decode(it)
	if err != nil {
		return Task{}, err
	}
	spec := &sandbox.Spec{Image: e.cfg.Image, Workdir: "/workspace"}
	names := make([]string, 0, len(t.Files))
	for n := range t.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		spec.Files = append(spec.Files, sandbox.File{Path: path.Join("/workspace", n), Data: []byte(t.Files[n]), Mode: 0o644})
	}
	return Task{
		Messages: chat(e.cfg.SystemPrompt, t.Instruction+"\n\nThe code is in /workspace. Hidden tests will be run with pytest after you finish."),
		Toolsets: []string{"terminal", "file"},
		Sandbox:  spec,
		Category: t.Category,
	}, nil
}

// Reward implements Env.
func (e *SWETests) Reward(ctx context.Context, it datasets.Item, _ Outcome, sb Sandbox) (rewards.Score, error) {
	t, err := e.decode(it)
	if err != nil {
		return rewards.Score{}, err
	}
	if sb == nil {
		return rewards.Score{}, fmt.Errorf("%w: swe-tests needs the rollout's sandbox", rewards.ErrReward)
	}
	dir := "/tmp/rollout-tests-" + randomHex()
	files := map[string]string{
		// The code under test is imported from /workspace; conftest adds it
		// after pytest has started, so nothing the agent left there can
		// replace pytest itself.
		"conftest.py": "import sys\nsys.path.insert(0, '/workspace')\n",
	}
	for n, body := range t.Tests {
		files[n] = body
	}
	tarball, err := tarOf(files, 0o644)
	if err != nil {
		return rewards.Score{}, fmt.Errorf("%w: pack tests: %w", rewards.ErrReward, err)
	}
	if err := sb.Upload(ctx, dir, bytes.NewReader(tarball)); err != nil {
		return rewards.Score{}, fmt.Errorf("%w: upload tests: %w", rewards.ErrReward, err)
	}
	report := dir + "/junit.xml"
	return rewards.TestsPassed{
		Command: fmt.Sprintf("python3 -I -m pytest -q -p no:cacheprovider --rootdir=%s --junitxml=%s %s", dir, report, dir),
		Cwd:     dir,
		Report:  report,
		Timeout: e.cfg.TestTimeout,
	}.Score(ctx, rewards.Input{Box: sb})
}

func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// EvalMetrics implements EvalMetricser: the turns a fully solved task took.
func (e *SWETests) EvalMetrics(ros []ScoredRollout) map[string]float64 { return solvedTurns(ros) }
