// Package rewards holds reusable reward functions: exit code, file content,
// tests passed (JUnit XML), numeric answer match, format checks, an LLM
// judge, and weighted sums. Every reward returns its named components for
// the trajectory record. Rewards act on a rollout's sandbox through the
// small Box interface and never own its lifecycle.
package rewards

import (
	"context"
	"errors"
	"fmt"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/sandbox"
)

// ErrReward is wrapped by errors that mean the reward itself could not be
// computed (sandbox gone, judge unreachable, bad configuration). The runner
// treats them as infra failures and retries — they are never a score of 0.
var ErrReward = errors.New("reward failed")

// Box is what rewards need of a rollout's sandbox; sandbox.Sandbox
// satisfies it (ToolContext.Sandbox() gives one to a Hermes-style reward).
type Box interface {
	Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error)
	ReadFile(ctx context.Context, path string) ([]byte, error)
}

// Input is what a reward may look at.
type Input struct {
	// Answer is the item's reference answer, when it has one.
	Answer string
	// Final is the last assistant message's content.
	Final    string
	Messages []openai.ChatCompletionMessage
	// Box is the rollout's sandbox; nil for envs without one.
	Box Box
}

// Score is a reward's result.
type Score struct {
	Value      float64
	Components map[string]float64
}

// Reward scores one rollout. A wrong answer is a low Value with a nil error;
// an error means the score is unknown (see ErrReward).
type Reward interface {
	Score(ctx context.Context, in Input) (Score, error)
}

// Func adapts a function to Reward.
type Func func(ctx context.Context, in Input) (Score, error)

// Score implements Reward.
func (f Func) Score(ctx context.Context, in Input) (Score, error) { return f(ctx, in) }

// Part is one weighted term of a Sum.
type Part struct {
	Name   string
	Weight float64
	Reward Reward
}

// Sum is Σ weight·value over its parts. Each part's value is a component
// under its name, and its own components are kept as "name.component".
type Sum []Part

var _ Reward = Sum(nil)

// Score implements Reward; the first failing part fails the sum.
func (s Sum) Score(ctx context.Context, in Input) (Score, error) {
	out := Score{Components: map[string]float64{}}
	for _, p := range s {
		sc, err := p.Reward.Score(ctx, in)
		if err != nil {
			return Score{}, fmt.Errorf("reward %s: %w", p.Name, err)
		}
		out.Value += p.Weight * sc.Value
		out.Components[p.Name] = sc.Value
		for k, v := range sc.Components {
			out.Components[p.Name+"."+k] = v
		}
	}
	return out, nil
}

func boolScore(ok bool, comps map[string]float64) Score {
	v := 0.0
	if ok {
		v = 1
	}
	if comps == nil {
		comps = map[string]float64{}
	}
	return Score{Value: v, Components: comps}
}

func needBox(in Input, what string) error {
	if in.Box == nil {
		return fmt.Errorf("%w: %s needs a sandbox, and this rollout has none", ErrReward, what)
	}
	return nil
}

// exec runs a command for a reward; infrastructure errors become ErrReward.
func exec(ctx context.Context, in Input, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	res, err := in.Box.Exec(ctx, req)
	if err != nil {
		return res, fmt.Errorf("%w: run %v: %w", ErrReward, describe(req), err)
	}
	return res, nil
}

func describe(req sandbox.ExecRequest) any {
	if req.Command != "" {
		return req.Command
	}
	return req.Argv
}

// ExitCode scores 1 when a command exits with Want (default 0).
type ExitCode struct {
	Command string   // run by /bin/sh -c
	Argv    []string // or run directly
	Cwd     string
	Want    int
	Timeout time.Duration // default 60s
}

var _ Reward = ExitCode{}

// Score implements Reward.
func (r ExitCode) Score(ctx context.Context, in Input) (Score, error) {
	if err := needBox(in, "exit_code"); err != nil {
		return Score{}, err
	}
	res, err := exec(ctx, in, sandbox.ExecRequest{Command: r.Command, Argv: r.Argv, Cwd: r.Cwd, Timeout: orDefault(r.Timeout, time.Minute)})
	if err != nil {
		return Score{}, err
	}
	return boolScore(res.ExitCode == r.Want && !res.TimedOut, map[string]float64{"exit_code": float64(res.ExitCode)}), nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
