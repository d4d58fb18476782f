// Package demo runs the main job end to end on an embedded default: the
// built-in vLLM simulator (in-process) follows the reference solutions of
// the built-in envs' items — correctly with a configurable probability, so
// groups have reward variance — while real Docker sandboxes execute every
// tool call and reward. `rollout demo`, the end-to-end tests and the
// runner benchmark use it.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/runner"
)

// EnvScripts are the simulator scripts that solve the items of a built-in
// env's splits (every split it offers when none is named), for a
// simulator whose policy should follow the env's reference solutions.
func EnvScripts(ctx context.Context, name string, splits ...string) ([]sim.Script, error) {
	env, err := envs.New(name, nil)
	if err != nil {
		return nil, err
	}
	if len(splits) == 0 {
		splits = env.Defaults().Splits
	}
	var items []datasets.Item
	for _, split := range splits {
		its, err := env.Items(ctx, split)
		if err != nil {
			return nil, fmt.Errorf("env %s split %s: %w", name, split, err)
		}
		items = append(items, its...)
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("env %s has no items", name)
	}
	return Scripts(ctx, env, items)
}

// Scripts turns the reference solutions of items into simulator scripts,
// matched on each task's first user message.
func Scripts(ctx context.Context, env envs.Env, items []datasets.Item) ([]sim.Script, error) {
	solver, ok := env.(envs.Solver)
	if !ok {
		return nil, fmt.Errorf("env %s has no reference solutions", env.Name())
	}
	var out []sim.Script
	for _, it := range items {
		raw, ok := solver.Solution(it)
		if !ok {
			continue
		}
		var s sim.Script
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("solution of %s: %w", it.ID, err)
		}
		task, err := env.Task(ctx, it)
		if err != nil {
			return nil, err
		}
		for _, m := range task.Messages {
			if m.Role == "user" {
				s.Match = m.Content
				break
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// Spec is one env of a demo.
type Spec struct {
	Env       string
	Groups    int
	GroupSize int
	Image     string // overrides the env's sandbox image when set
	// EnvConfig is the env's env_config as YAML (empty: the defaults).
	EnvConfig string
}

func (s Spec) env() (envs.Env, *yaml.Node, error) {
	var node *yaml.Node
	if s.EnvConfig != "" {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(s.EnvConfig), &doc); err != nil {
			return nil, nil, fmt.Errorf("demo %s: env_config: %w", s.Env, err)
		}
		if len(doc.Content) > 0 {
			node = doc.Content[0]
		}
	}
	cfg := runner.Config{Env: s.Env}
	if node != nil {
		cfg.EnvConfig = *node
	}
	e, err := assemble.OpenEnv(cfg)
	return e, node, err
}

// plan is how a spec runs: eval-only envs (terminal-bench) run as an
// evaluation over their eval split, the others as training collection
// over train.
func (s Spec) plan(env envs.Env) (mode, split string) {
	if env.Defaults().EvalOnly {
		return assemble.ModeEval, "eval"
	}
	return assemble.ModeRun, "train"
}

// Options configure a demo run.
type Options struct {
	Out         string // parent directory; each env writes Out/<env>
	Specs       []Spec
	Backend     string  // inference backend (default "vllm": token-exact)
	Family      string  // tool-call format (default "hermes")
	SuccessProb float64 // default 0.7
	Seed        int64
	Latency     sim.Latency
	Faults      sim.Faults
	Retries     int
	// RowsPerFile rotates Parquet part files (default: the writer's).
	RowsPerFile int64
	Logger      *slog.Logger
	Progress    func(env string, e runner.Event)
	// SandboxInstance labels the demo's containers (default: random), so
	// a caller can tell them from other backends' on the same engine.
	SandboxInstance string
	// NoJournal turns durability off (measurements only; assemble.Options).
	NoJournal bool
	// Distill makes the simulator the distillation teacher too (top-K 5):
	// every trained token gets its prompt_logprobs (docs/distillation.md).
	Distill bool
	// Hints (with Distill) turns on the hint-enhanced teacher context, the
	// simulator being the judge too (HintJudgeScript).
	Hints bool
	// Reuse runs the sandboxes with a read-only root and resets them in
	// place between rollouts (sandbox.reuse).
	Reuse bool
	// SandboxBackend is sandbox.backend: "" or docker, or runc.
	SandboxBackend string
	// GroupsInFlight is limits.groups_in_flight (0: the default).
	GroupsInFlight int
	// Shared, when set, is rollout serve's shared sandbox backend: the
	// jobs take their sandboxes through it (assemble.Options.Sandboxes), as a
	// server's jobs do, instead of a backend of their own.
	Shared *assemble.Shared
}

// Result is one env's outcome.
type Result struct {
	Env     string
	Dir     string
	Summary runner.Summary
}

// DefaultSpecs are the envs `rollout demo` runs.
func DefaultSpecs() []Spec {
	return []Spec{{Env: "terminal-tasks", Groups: 3, GroupSize: 4}, {Env: "swe-tests", Groups: 2, GroupSize: 4}}
}

// ParseSpecs reads name[:groups[:group_size]] specs (defaults 3 groups of
// the env's group size).
func ParseSpecs(in []string) ([]Spec, error) {
	var out []Spec
	for _, s := range in {
		parts := strings.Split(s, ":")
		if len(parts) > 3 || parts[0] == "" {
			return nil, fmt.Errorf("--env %q: want name[:groups[:group_size]]", s)
		}
		sp := Spec{Env: parts[0], Groups: 3}
		for i, dst := range []*int{&sp.Groups, &sp.GroupSize} {
			if len(parts) <= i+1 {
				break
			}
			n, err := strconv.Atoi(parts[i+1])
			if err != nil || n < 1 {
				return nil, fmt.Errorf("--env %q: %q is not a positive integer", s, parts[i+1])
			}
			*dst = n
		}
		out = append(out, sp)
	}
	return out, nil
}

// HintJudge is the hint the simulator writes as a distillation hint judge
// (HintJudgeScript) on its correct path; on its wrong path it finds none.
const HintJudge = "Read the failing test before you edit the code."

// HintJudgeScript makes the simulator a distillation hint judge: it
// recognises the judge's prompt by its fixed opening, and answers with a
// hint (\boxed{1}), or, with probability 1 - SuccessProb, without
// (\boxed{-1}). It must come before the envs' scripts: the judge's prompt
// quotes the task, which those match.
func HintJudgeScript() sim.Script {
	return sim.Script{Match: "You are reviewing one step of an AI agent's work",
		Steps: []sim.Step{{Final: "The output shows what to check. [HINT_START]" + HintJudge + "[HINT_END]\n\\boxed{1}"}},
		Wrong: []sim.Step{{Final: "Nothing here says the step should have gone otherwise. \\boxed{-1}"}}}
}

// Run starts the simulator with every spec's scripts and runs the specs one
// after another.
func Run(ctx context.Context, o Options) ([]Result, error) {
	if o.Backend == "" {
		o.Backend = "vllm"
	}
	if o.Family == "" {
		o.Family = "hermes"
	}
	if o.SuccessProb == 0 {
		o.SuccessProb = 0.7
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Hints && !o.Distill {
		return nil, errors.New("hints need distillation (--distill)")
	}
	var scripts []sim.Script
	if o.Hints {
		scripts = append(scripts, HintJudgeScript())
	}
	for _, s := range o.Specs {
		env, _, err := s.env()
		if err != nil {
			return nil, err
		}
		_, split := s.plan(env)
		items, err := env.Items(ctx, split)
		if err != nil {
			return nil, err
		}
		if s.Groups > 0 && len(items) > s.Groups {
			items = items[:s.Groups]
		}
		sc, err := Scripts(ctx, env, items)
		if err != nil {
			return nil, err
		}
		scripts = append(scripts, sc...)
	}
	srv, err := sim.Start(ctx, sim.Config{Family: o.Family, Seed: o.Seed, SuccessProb: o.SuccessProb, Scripts: scripts,
		Latency: o.Latency, Faults: o.Faults})
	if err != nil {
		return nil, fmt.Errorf("start simulator: %w", err)
	}
	defer srv.Close()
	var out []Result
	for _, s := range o.Specs {
		env, node, err := s.env()
		if err != nil {
			return out, err
		}
		mode, split := s.plan(env)
		cfg := runner.Config{
			Env: s.Env, Split: split, Groups: s.Groups, GroupSize: s.GroupSize, Seed: uint64(o.Seed),
			Inference: inference.Config{Backend: o.Backend, Endpoints: []string{srv.URL}, ChatTokenIDs: true,
				Timeout: 2 * time.Minute},
			Sampling:       inference.Sampling{MaxTokens: 1024},
			Parser:         o.Family,
			RolloutTimeout: runner.Duration(5 * time.Minute),
			Retries:        o.Retries,
			Output:         runner.Output{Dir: filepath.Join(o.Out, s.Env), MaxRowsPerFile: o.RowsPerFile},
		}
		cfg.Sandbox.Image = s.Image
		cfg.Sandbox.ReadOnlyRoot, cfg.Sandbox.Reuse = o.Reuse, o.Reuse
		cfg.Sandbox.Backend = o.SandboxBackend
		cfg.Limits.GroupsInFlight = o.GroupsInFlight
		if node != nil {
			cfg.EnvConfig = *node
		}
		if o.Distill {
			cfg.Distill = &inference.TeacherConfig{Endpoint: srv.URL, Model: "rollout-sim", TopK: 5}
			if o.Hints {
				cfg.Distill.Hints = &inference.HintConfig{}
			}
		}
		name := s.Env
		prog := func(e runner.Event) {
			if o.Progress != nil {
				o.Progress(name, e)
			}
		}
		jo := assemble.Options{Mode: mode, Logger: o.Logger, Progress: prog, SandboxInstance: o.SandboxInstance, NoJournal: o.NoJournal}
		if o.Shared != nil {
			jo.Sandboxes, jo.Images = o.Shared, o.Shared
		}
		j, err := assemble.Open(ctx, cfg, jo)
		if err != nil {
			return out, err
		}
		sum, err := j.Run(ctx)
		out = append(out, Result{Env: s.Env, Dir: j.Dir, Summary: sum})
		if err != nil {
			return out, fmt.Errorf("demo %s: %w", s.Env, err)
		}
	}
	return out, nil
}
