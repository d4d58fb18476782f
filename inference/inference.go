// Package inference owns the policy backends (OpenAI-compatible chat, vLLM
// completions and generate, SGLang, Atropos-style generate), the endpoint
// pool, and token-exact episode sequences. inference/sim is a faithful vLLM
// simulator for tests, demos and benchmarks.
package inference

import (
	"context"
	"errors"

	openai "github.com/sashabaranov/go-openai"
)

// Error classes, tested with errors.Is. Every backend error wraps one.
var (
	// ErrInfra: the endpoint is unreachable, returned 5xx, a malformed or
	// truncated response, misaligned logprobs. Retried by the runner.
	ErrInfra = errors.New("inference infrastructure failure")
	// ErrRequest: the server refused the request (4xx), e.g. the prompt is
	// too long. Not retried.
	ErrRequest = errors.New("inference request rejected")
	// ErrContextLength: the next prompt cannot fit max_tokens in the model's
	// context; the episode stops with stop reason "context_length".
	ErrContextLength = errors.New("context length exceeded")
	// ErrContent: the server refused the request because of its content —
	// a chat template that cannot render the history (llama.cpp's HTTP 500
	// "Failed to parse tool call arguments as JSON"), a validation error.
	// It always comes with ErrRequest (whatever the HTTP status), is never
	// retried by the pool and never counts against the endpoint's health.
	ErrContent = errors.New("request content rejected by the server")
	// ErrNoTokenIDs: token ids were requested (tokens mode, or chat mode
	// with chat_token_ids) and no source returned them. Comes with
	// ErrInfra: the server or its configuration cannot serve the run.
	ErrNoTokenIDs = errors.New("token ids requested but not returned")
)

// Sampling parameters. Pointers distinguish "unset" from zero: a
// Temperature of 0 must reach the server.
type Sampling struct {
	Temperature        *float64       `json:"temperature,omitempty" yaml:"temperature,omitempty"`
	TopP               *float64       `json:"top_p,omitempty" yaml:"top_p,omitempty"`
	TopK               *int           `json:"top_k,omitempty" yaml:"top_k,omitempty"`
	MinP               *float64       `json:"min_p,omitempty" yaml:"min_p,omitempty"`
	MaxTokens          int            `json:"max_tokens,omitempty" yaml:"max_tokens,omitempty"`
	Stop               []string       `json:"stop,omitempty" yaml:"stop,omitempty"`
	Seed               *int64         `json:"seed,omitempty" yaml:"seed,omitempty"`
	RepetitionPenalty  *float64       `json:"repetition_penalty,omitempty" yaml:"repetition_penalty,omitempty"`
	PresencePenalty    *float64       `json:"presence_penalty,omitempty" yaml:"presence_penalty,omitempty"`
	FrequencyPenalty   *float64       `json:"frequency_penalty,omitempty" yaml:"frequency_penalty,omitempty"`
	ChatTemplateKwargs map[string]any `json:"chat_template_kwargs,omitempty" yaml:"chat_template_kwargs,omitempty"`
	ExtraBody          map[string]any `json:"extra_body,omitempty" yaml:"extra_body,omitempty"`
}

// EpisodeSpec fixes what stays constant over one episode.
type EpisodeSpec struct {
	ID string // rollout id; used for endpoint affinity and logs
	// Group (optional) is shared by the rollouts of one GRPO group: their
	// first request goes to the same endpoint (load permitting), so the
	// common prompt hits that server's prefix cache.
	Group    string
	Model    string
	Tools    []openai.Tool
	Sampling Sampling
}

// Turn is one assistant generation.
type Turn struct {
	// Text is the raw generated text (tokens mode) or the message content
	// (chat mode).
	Text string
	// Parsed reports that the server already separated reasoning and tool
	// calls (chat mode); otherwise the caller parses Text.
	Parsed    bool
	Content   string
	Reasoning string
	ToolCalls []openai.ToolCall
	// FinishReason as the server reported it: "stop", "length", "tool_calls".
	FinishReason string
	// Token accounting for this turn.
	PromptTokens     int
	CompletionTokens int
	// CompletionIDs/Logprobs are the sampled ids and their logprobs when the
	// backend returns them (always in tokens mode). A sampled id the server
	// gave no logprob for holds the 1.0 placeholder (Sequence.Unscored).
	CompletionIDs []int32
	Logprobs      []float32
	Endpoint      string // base URL that served the turn
	// Version is the policy version the turn's last token was sampled
	// under (tokens mode; chat mode: the version at admission); Cuts counts
	// the generations of this turn cut by an abort and continued.
	Version int64
	Cuts    int
	// Replay says why a chat turn against llama.cpp was replayed on
	// /completion at its seed ("" when it was not): ReplayServerParse (the
	// server could not parse the model's tool-call text) and
	// ReplayReplaced (the answer's ids could not be reproduced) leave the
	// replay's raw text in Content, calls included, for the loop's parser;
	// ReplayIDs keeps the chat answer with the replay's ids.
	Replay string
}

// Sequence is the token-exact record of an episode.
type Sequence struct {
	Tokens []int32
	// Mask is 1 on sampled (trained) positions, 0 elsewhere (also on the
	// few sampled ids without a logprob; see Unscored).
	Mask []int8
	// Logprobs are aligned to Tokens; untrained positions hold 1.0 (the
	// Atropos placeholder).
	Logprobs []float32
	// TurnStarts are the indices in Tokens where each generation begins.
	TurnStarts []int
	// Versions are aligned to Tokens: the policy version each sampled id
	// was generated under (untrained positions: the version in force when
	// they were appended). Nil when the backend returns no ids.
	Versions []int64
	// Cuts are the points where a generation's version changed: an abort
	// cut and its continuation, or a keep-mode freeze (Position -1).
	Cuts      []Cut
	PromptLen int // tokens of the first prompt
	// Unscored counts sampled ids the server returned no logprob for
	// (llama.cpp withholds the probability of a token that leaves the text
	// inside a UTF-8 character): they stay in Tokens, verbatim, with Mask 0
	// and the 1.0 placeholder — in context, not trained.
	Unscored int
	// Routing is the engine's routed experts (Config.RoutedExperts, tokens
	// mode on vllm-generate or sglang) for the first Routing.Positions
	// tokens: every position the engine ran a forward pass on in the last
	// turn's request — the whole sequence up to the last sampled id, which
	// was never fed back, and before the template's closing, which was
	// never sent. Nil when not asked for.
	Routing *Routing
	// DriftTokens counts the tokens that differ (insertions + deletions)
	// when the final conversation is re-rendered; -1 when the check could
	// not run (the render request failed).
	DriftTokens int
}

// Policy produces assistant turns. One Episode per rollout.
type Policy interface {
	Start(ctx context.Context, spec EpisodeSpec) (Episode, error)
}

// Episode generates the turns of one rollout. messages is always the whole
// conversation so far (the backend works out what is new since the last
// call).
type Episode interface {
	Generate(ctx context.Context, messages []openai.ChatCompletionMessage) (Turn, error)
	// Finish ends the episode: in tokens mode it runs the drift check
	// against messages and returns the sequence; in chat mode the sequence
	// holds whatever ids the server returned (possibly none).
	Finish(ctx context.Context, messages []openai.ChatCompletionMessage) (Sequence, error)
}
