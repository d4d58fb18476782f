package agentloop

import (
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
)

// Event is one intervention of the loop, recorded so that a trainer can
// tell the policy's own text from the loop's. Message is the index in
// Result.Messages of the message concerned.
type Event struct {
	Turn     int    `json:"turn"` // 1-based
	Kind     string `json:"kind"`
	Message  int    `json:"message"`
	CallID   string `json:"call_id,omitempty"`
	Original string `json:"original,omitempty"`
	Detail   string `json:"detail,omitempty"`
}

// ToolError is one failed or invalid call, as Hermes records it.
type ToolError struct {
	Turn       int    `json:"turn"` // 1-based
	CallID     string `json:"call_id"`
	Tool       string `json:"tool_name"`
	Arguments  string `json:"arguments"` // raw, cut to 200 chars
	Error      string `json:"error"`
	ToolResult string `json:"tool_result"` // what the model saw, cut to 500 chars
	// Kind is tools.Invalid* for invalid calls, "execution" otherwise.
	Kind string `json:"kind"`
}

// CallStatus is one tool call's parse outcome: "ok", "repaired" (the
// parser fixed something to read it; Reason says what) or "malformed"
// (the parser's reason). In tokens mode the loop's parser decides; in chat
// mode the server parsed, and its calls are ok unless they lack a name.
type CallStatus struct {
	Turn   int    `json:"turn"`  // 1-based
	Index  int    `json:"index"` // position among the turn's calls
	Name   string `json:"name,omitempty"`
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	// SpanStart and SpanEnd are the call's half-open token span [start,
	// end) in the episode's Sequence.Tokens (the record's tokens column):
	// sampled ids of the call's turn whose text contains the call as the
	// parser read it. -1 when no exact span is known (chat mode, a
	// call not found verbatim in the text, or a backend whose
	// detokenizer does not reproduce the text).
	SpanStart int `json:"span_start"`
	SpanEnd   int `json:"span_end"`
}

// TurnStats are the timings of one turn.
type TurnStats struct {
	Turn       int           `json:"turn"`
	Generation time.Duration `json:"generation_ns"`
	Tools      time.Duration `json:"tools_ns"`
	// Queueing is the summed time calls waited before starting (behind a
	// concurrency slot or behind earlier calls of the same turn).
	Queueing         time.Duration `json:"queueing_ns"`
	ToolCalls        int           `json:"tool_calls"`
	Parallel         bool          `json:"parallel"`
	PromptTokens     int           `json:"prompt_tokens"`
	CompletionTokens int           `json:"completion_tokens"`
	FinishReason     string        `json:"finish_reason"`
}

// Counters summarise the episode.
type Counters struct {
	ToolCalls      int `json:"tool_calls"`
	InvalidCalls   int `json:"invalid_calls"`
	ToolErrors     int `json:"tool_errors"`
	ParallelTurns  int `json:"parallel_turns"`
	SpilledResults int `json:"spilled_results"`
	// Loop interventions (see Result.Events).
	ReplacedArguments int `json:"replaced_arguments"`
	RepairedNames     int `json:"repaired_names"`
	InsertedMessages  int `json:"inserted_messages"`
	// EnvMessages counts the messages the environment's responder added.
	EnvMessages      int `json:"env_messages"`
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// Result is the outcome of one episode. It is filled on every exit path.
type Result struct {
	ID string `json:"id"`
	// Messages is the whole conversation in OpenAI format, with
	// reasoning_content on assistant messages. The caller's slice is not
	// modified.
	Messages []openai.ChatCompletionMessage `json:"messages"`
	// Sequence is the token-exact record from Episode.Finish (tokens mode);
	// empty when Finish could not run.
	Sequence          inference.Sequence `json:"sequence"`
	TurnsUsed         int                `json:"turns_used"`
	FinishedNaturally bool               `json:"finished_naturally"`
	StopReason        StopReason         `json:"stop_reason"`
	// Err is the error behind a failed stop reason (nil otherwise).
	Err              error       `json:"-"`
	Error            string      `json:"error,omitempty"`
	ReasoningPerTurn []*string   `json:"reasoning_per_turn"`
	ToolErrors       []ToolError `json:"tool_errors"`
	// Events are the loop's interventions in the conversation, in order.
	Events []Event `json:"loop_events"`
	// CallStatuses are every tool call's parse outcome, turn by turn.
	CallStatuses []CallStatus `json:"call_statuses,omitempty"`
	// TurnRewards are the environment responder's intermediate rewards,
	// one per turn used (0 for a turn without one); nil when it gave none.
	TurnRewards []float64     `json:"turn_rewards,omitempty"`
	Turns       []TurnStats   `json:"turns"`
	Counters    Counters      `json:"counters"`
	Duration    time.Duration `json:"duration_ns"`
}
