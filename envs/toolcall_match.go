package envs

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	openai "github.com/sashabaranov/go-openai"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/rewards"
)

// ToolCallMatch is single-turn, with no execution: the model's tool calls
// are compared with reference calls, BFCL-style. A reference call matches
// an actual call with the same name whose arguments equal the reference's
// (numbers compared by value, strings after trimming; keys absent from the
// reference must be absent from the call). Reward = matched / max(expected,
// actual), so both missing and extra calls cost; an item that expects no
// call scores 1 only when the model makes none.
type ToolCallMatch struct{ cfg toolcallConfig }

type toolcallConfig struct {
	SystemPrompt string `yaml:"system_prompt"`
	GroupSize    int    `yaml:"group_size"`
}

func init() {
	Register("toolcall-match", func(node *yaml.Node) (Env, error) {
		c := toolcallConfig{SystemPrompt: "You are a helpful assistant. Call the provided functions when they are needed; otherwise answer directly.", GroupSize: 4}
		if err := decodeStrict(node, &c); err != nil {
			return nil, err
		}
		return &ToolCallMatch{cfg: c}, nil
	})
}

var (
	_ Env    = (*ToolCallMatch)(nil)
	_ Solver = (*ToolCallMatch)(nil)
)

type refCall struct {
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
}

type toolcallItem struct {
	Question string        `json:"question"`
	Tools    []openai.Tool `json:"tools"`
	Expected []refCall     `json:"expected"`
	Category string        `json:"category"`
}

// Name implements Env.
func (e *ToolCallMatch) Name() string { return "toolcall-match" }

// Defaults implements Env.
func (e *ToolCallMatch) Defaults() Defaults {
	return Defaults{
		Description: "Single-turn function calling compared with reference calls, BFCL-style; no sandbox (8 items: 7 train, 1 eval)",
		GroupSize:   e.cfg.GroupSize, MaxTurns: 1, Splits: []string{"train", "eval"},
	}
}

// Items implements Env.
func (e *ToolCallMatch) Items(_ context.Context, split string) ([]datasets.Item, error) {
	return embeddedItems("toolcall_match.jsonl", split)
}

// Solution implements Solver.
func (e *ToolCallMatch) Solution(it datasets.Item) (json.RawMessage, bool) { return solution(it) }

func (e *ToolCallMatch) decode(it datasets.Item) (toolcallItem, error) {
	var t toolcallItem
	if err := decodeItem(it, &t); err != nil {
		return t, err
	}
	if t.Question == "" || len(t.Tools) == 0 {
		return t, fmt.Errorf("%w: %s row %d: a toolcall item needs a question and tools", datasets.ErrInvalid, it.Source, it.Row)
	}
	return t, nil
}

// Task implements Env.
func (e *ToolCallMatch) Task(_ context.Context, it datasets.Item) (Task, error) {
	t, err := e.decode(it)
	if err != nil {
		return Task{}, err
	}
	return Task{Messages: chat(e.cfg.SystemPrompt, t.Question), CallOnly: t.Tools, MaxTurns: 1, Category: t.Category}, nil
}

// Reward implements Env.
func (e *ToolCallMatch) Reward(_ context.Context, it datasets.Item, out Outcome, _ Sandbox) (rewards.Score, error) {
	t, err := e.decode(it)
	if err != nil {
		return rewards.Score{}, err
	}
	var actual []refCall
	malformed := 0
	for _, m := range out.Messages {
		if m.Role != openai.ChatMessageRoleAssistant {
			continue
		}
		for _, tc := range m.ToolCalls {
			var args map[string]any
			if err := json.Unmarshal([]byte(tc.Function.Arguments), &args); err != nil {
				malformed++
				continue
			}
			actual = append(actual, refCall{Name: tc.Function.Name, Arguments: args})
		}
	}
	used := make([]bool, len(actual))
	matched := 0
	for _, want := range t.Expected {
		for i, got := range actual {
			if !used[i] && got.Name == want.Name && sameArgs(want.Arguments, got.Arguments) {
				used[i] = true
				matched++
				break
			}
		}
	}
	denom := max(len(t.Expected), len(actual)+malformed)
	v := 1.0
	if denom > 0 {
		v = float64(matched) / float64(denom)
	}
	return rewards.Score{Value: v, Components: map[string]float64{
		"expected_calls": float64(len(t.Expected)), "actual_calls": float64(len(actual) + malformed),
		"matched_calls": float64(matched), "malformed_calls": float64(malformed),
	}}, nil
}

func sameArgs(want, got map[string]any) bool {
	if len(want) != len(got) {
		return false
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok || !sameValue(w, g) {
			return false
		}
	}
	return true
}

func sameValue(w, g any) bool {
	switch wv := w.(type) {
	case float64:
		gv, ok := g.(float64)
		return ok && math.Abs(wv-gv) <= 1e-9*math.Max(1, math.Abs(wv))
	case string:
		gv, ok := g.(string)
		return ok && strings.TrimSpace(wv) == strings.TrimSpace(gv)
	case []any:
		gv, ok := g.([]any)
		if !ok || len(gv) != len(wv) {
			return false
		}
		for i := range wv {
			if !sameValue(wv[i], gv[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		gv, ok := g.(map[string]any)
		return ok && sameArgs(wv, gv)
	}
	return w == g
}
