package agentloop

import (
	"fmt"
	"strings"
	"unicode/utf8"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/tools"
)

// Trajectory is the JSON form of one episode written by `rollout chat
// --out`: the conversation, the token-exact sequence (loss_mask 1 =
// trained, logprobs aligned to tokens) and the outcome.
type Trajectory struct {
	ID                string                         `json:"id"`
	Messages          []openai.ChatCompletionMessage `json:"messages"`
	Tokens            []int32                        `json:"tokens"`
	LossMask          []int8                         `json:"loss_mask"`
	Logprobs          []float32                      `json:"logprobs"`
	TurnStarts        []int                          `json:"turn_starts,omitempty"`
	PromptLen         int                            `json:"prompt_len"`
	DriftTokens       int                            `json:"drift_tokens"`
	StopReason        StopReason                     `json:"stop_reason"`
	Error             string                         `json:"error,omitempty"`
	TurnsUsed         int                            `json:"turns_used"`
	FinishedNaturally bool                           `json:"finished_naturally"`
	ReasoningPerTurn  []*string                      `json:"reasoning_per_turn"`
	ToolErrors        []ToolError                    `json:"tool_errors"`
	LoopEvents        []Event                        `json:"loop_events"`
	TurnRewards       []float64                      `json:"turn_rewards,omitempty"`
	Turns             []TurnStats                    `json:"turns"`
	Counters          Counters                       `json:"counters"`
	DurationMS        int64                          `json:"duration_ms"`
}

// Trajectory converts the result. Slices are never nil, so the JSON always
// has arrays.
func (r Result) Trajectory() Trajectory {
	seq := r.Sequence
	nz := func(s inference.Sequence) inference.Sequence {
		if s.Tokens == nil {
			s.Tokens = []int32{}
		}
		if s.Mask == nil {
			s.Mask = []int8{}
		}
		if s.Logprobs == nil {
			s.Logprobs = []float32{}
		}
		return s
	}
	seq = nz(seq)
	return Trajectory{ID: r.ID, Messages: r.Messages, Tokens: seq.Tokens, LossMask: seq.Mask, Logprobs: seq.Logprobs,
		TurnStarts: seq.TurnStarts, PromptLen: seq.PromptLen, DriftTokens: seq.DriftTokens,
		StopReason: r.StopReason, Error: r.Error, TurnsUsed: r.TurnsUsed, FinishedNaturally: r.FinishedNaturally,
		ReasoningPerTurn: r.ReasoningPerTurn, ToolErrors: r.ToolErrors, LoopEvents: nonNil(r.Events), TurnRewards: r.TurnRewards, Turns: r.Turns, Counters: r.Counters,
		DurationMS: r.Duration.Milliseconds()}
}

func nonNil(e []Event) []Event {
	if e == nil {
		return []Event{}
	}
	return e
}

// Transcript renders the conversation for people: messages from index
// from on, tool calls and results (results cut to maxResult chars), then
// the outcome.
func (r Result) Transcript(from, maxResult int) string {
	var b strings.Builder
	for i := from; i < len(r.Messages); i++ {
		m := r.Messages[i]
		switch m.Role {
		case openai.ChatMessageRoleAssistant:
			if m.ReasoningContent != "" {
				fmt.Fprintf(&b, "assistant (reasoning): %s\n", strings.TrimSpace(m.ReasoningContent))
			}
			if m.Content != "" {
				fmt.Fprintf(&b, "assistant: %s\n", strings.TrimSpace(m.Content))
			}
			for _, tc := range m.ToolCalls {
				fmt.Fprintf(&b, "  → %s(%s) [%s]\n", tc.Function.Name, tc.Function.Arguments, tc.ID)
			}
		case openai.ChatMessageRoleTool:
			content := m.Content
			if maxResult > 0 && utf8.RuneCountInString(content) > maxResult {
				n := 0
				for j := range content {
					if n == maxResult {
						content = content[:j] + fmt.Sprintf(" … [%d more chars]", utf8.RuneCountInString(m.Content)-maxResult)
						break
					}
					n++
				}
			}
			fmt.Fprintf(&b, "  ← [%s] %s\n", m.ToolCallID, content)
		default:
			fmt.Fprintf(&b, "%s: %s\n", m.Role, strings.TrimSpace(m.Content))
		}
	}
	for _, e := range r.Events {
		if e.Message < from {
			continue
		}
		fmt.Fprintf(&b, "loop (turn %d): %s", e.Turn, e.Kind)
		if e.Detail != "" {
			fmt.Fprintf(&b, " %s", e.Detail)
		}
		if e.CallID != "" {
			fmt.Fprintf(&b, " [%s]", e.CallID)
		}
		if e.Original != "" {
			fmt.Fprintf(&b, " (model wrote %q)", tools.HeadRunes(e.Original, 200))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "stop: %s (turns %d, finished naturally: %v, tool calls %d, tool errors %d, %d prompt + %d completion tokens, %s)\n",
		r.StopReason, r.TurnsUsed, r.FinishedNaturally, r.Counters.ToolCalls, r.Counters.ToolErrors,
		r.Counters.PromptTokens, r.Counters.CompletionTokens, r.Duration.Round(1e6))
	if r.Error != "" {
		fmt.Fprintf(&b, "error: %s\n", r.Error)
	}
	return b.String()
}
