// Package gateway is the contract of rollout's token-capturing gateway: the
// model API an outside agent harness calls as if it were an ordinary
// OpenAI or Anthropic endpoint, while rollout generates from token ids,
// parses with its own parsers and records the exact sampled tokens.
//
// The contract has two sides:
//
//   - a FrontDoor serves one API shape (OpenAI Chat Completions, OpenAI
//     Responses, Anthropic Messages): it decodes the harness's request into
//     a canonical Call, asks a Completer, and encodes the Reply (or the
//     error) in its API's own shape, streamed or not;
//   - a Completer (gateway/capture) owns sessions: it renders the call's
//     messages through the engine, generates, parses, anchors the harness's
//     echoed history to the calls that produced it and records each
//     session's branches as trainable token sequences.
//
// Front doors never see tokens; the Completer never sees an API's wire
// shape. The canonical form is OpenAI Chat's message model (go-openai's
// types), the one rollout's agent loop and inference layer already speak.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
)

// Message is one canonical message of a call's history.
type Message struct {
	openai.ChatCompletionMessage
	// Ref is what the front door found in the harness's copy of an
	// assistant turn that identifies the gateway's reply: a Responses
	// output or reasoning item id, an Anthropic thinking signature ("" when
	// the API carries none). The Completer anchors echoed assistant turns
	// by Ref first, then by the tool-call ids it issued, then by position
	// and normalised content.
	Ref string
}

// ToolChoice is the harness's tool_choice, canonical: Mode is "auto",
// "none" or "required" (Anthropic "any"), or "function" with Name.
type ToolChoice struct {
	Mode string
	Name string
}

// Call is one model call of a harness, decoded by a front door.
type Call struct {
	// API names the front door that decoded the call (FrontDoor.Name).
	API   string
	Model string
	// Messages is the whole history the harness sent, system prompt
	// first (Anthropic's top-level system and Responses' instructions
	// become a leading system message).
	Messages []Message
	Tools    []openai.Tool
	// ToolsRaw is the request's tools field as the harness sent it, in the
	// door's own shape (nil: none sent). The Completer may key its parsed
	// form of Tools by it: a harness sends the same tools on every call.
	ToolsRaw []byte `json:"-"`
	// ToolChoice is nil when the harness sent none (auto).
	ToolChoice *ToolChoice
	// ParallelToolCalls is nil when the harness did not say.
	ParallelToolCalls *bool
	// MaxTokens is what the harness asked for (0: not said); the
	// Completer caps it at the run's limit.
	MaxTokens int
	Stream    bool
	// Requested holds the sampling fields the harness sent (temperature,
	// top_p, penalties, seed, stop, …) as decoded JSON: recorded, never
	// applied — the run's sampler governs generation.
	Requested map[string]any
	// Previous is a Responses previous_response_id: the Completer prepends
	// the history that reply continued ("" when not used).
	Previous string
}

// Finish reasons of a Reply, canonical (front doors map them: Anthropic
// end_turn / max_tokens / tool_use, Responses status incomplete).
const (
	FinishStop      = "stop"
	FinishLength    = "length"
	FinishToolCalls = "tool_calls"
)

// Reply is the Completer's answer to one call.
type Reply struct {
	// ID is unique within the gateway's lifetime; front doors derive their
	// response, message and item ids from it, so that an echoed turn can
	// be anchored back to it: a front door that can carry an opaque value
	// through the harness's history (an item id, a thinking signature)
	// embeds ID there and returns it, recovered, as Message.Ref.
	ID        string
	Model     string
	Content   string
	Reasoning string
	// ToolCalls carry ids the gateway issued (unique per session).
	ToolCalls    []openai.ToolCall
	FinishReason string
	// Usage, in the engine's tokens.
	PromptTokens     int
	CompletionTokens int
}

// Model is what /v1/models (and similar probes) report.
type Model struct {
	ID string
	// ContextLength is the engine's context window in tokens (0 when
	// unknown). Harnesses refuse to run below their minimum, so it is the
	// engine's real value, never invented.
	ContextLength int
	OwnedBy       string
}

// Completer answers calls for sessions. Implementations are safe for
// concurrent use: a harness may call the model in parallel.
type Completer interface {
	// Complete generates the reply to call within session.
	Complete(ctx context.Context, session string, call Call) (Reply, error)
	// Models lists the models the session may name.
	Models(ctx context.Context, session string) ([]Model, error)
}

// FrontDoor serves one API shape.
type FrontDoor interface {
	// Name is the API's name in records and logs: "openai-chat",
	// "openai-responses", "anthropic-messages".
	Name() string
	// Mount adds the door's routes to mux under prefix, a ServeMux
	// pattern fragment holding the {session} wildcard (e.g. "/s/{session}");
	// handlers read the session with r.PathValue("session") and answer
	// through c. Routes are relative to the base URL a harness is given
	// ("/v1/chat/completions" under prefix).
	Mount(mux *http.ServeMux, prefix string, c Completer)
}

// Error kinds. Every error a Completer returns wraps one of them
// (errors.Is); front doors map each to their API's status and error type.
var (
	// ErrBadRequest: the call is malformed (an unknown role, a tool
	// result without its call, a history the template cannot render).
	// OpenAI 400 invalid_request_error; Anthropic 400 invalid_request_error.
	ErrBadRequest = errors.New("bad request")
	// ErrUnknownModel: the call names a model the session does not serve.
	// OpenAI 404 model_not_found; Anthropic 404 not_found_error.
	ErrUnknownModel = errors.New("unknown model")
	// ErrContextLength: the prompt plus the reply cannot fit the context.
	// OpenAI 400 code context_length_exceeded; Anthropic 400
	// invalid_request_error "prompt is too long".
	ErrContextLength = errors.New("context length exceeded")
	// ErrSession: the session is unknown or closed. 404 (OpenAI
	// not_found_error-like; Anthropic not_found_error).
	ErrSession = errors.New("unknown or closed session")
	// ErrOverloaded: the engine pool refused or is saturated; the harness
	// may retry. OpenAI 503; Anthropic 529 overloaded_error.
	ErrOverloaded = errors.New("overloaded")
	// ErrUpstream: the engine failed (unreachable, 5xx, a malformed
	// answer). OpenAI 500 server_error; Anthropic 500 api_error.
	ErrUpstream = errors.New("upstream engine failure")
)

// Error is a classified gateway error.
type Error struct {
	Kind  error  // one of the Err* kinds
	Param string // the offending request field, when known ("messages[3].content")
	Msg   string
	Err   error // cause, if any
	// Tokens and Limit, for ErrContextLength: the prompt's length and the
	// context window in tokens, when known (0: unknown). Anthropic's
	// context error names both ("prompt is too long: N tokens > M
	// maximum").
	Tokens, Limit int
}

func (e *Error) Error() string {
	s := e.Kind.Error()
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	if e.Param != "" {
		s += " (" + e.Param + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

// Errorf returns an *Error of kind with a formatted message.
func Errorf(kind error, param, format string, args ...any) *Error {
	return &Error{Kind: kind, Param: param, Msg: fmt.Sprintf(format, args...)}
}

// KindOf returns the kind err wraps (ErrUpstream when it wraps none: an
// unclassified failure is the gateway's, never the harness's).
func KindOf(err error) error {
	for _, k := range []error{ErrBadRequest, ErrUnknownModel, ErrContextLength, ErrSession, ErrOverloaded, ErrUpstream} {
		if errors.Is(err, k) {
			return k
		}
	}
	return ErrUpstream
}

// KindName is the name of the kind err wraps (KindOf), as call records
// carry it: "bad_request", "unknown_model", "context_length", "session",
// "overloaded" or "upstream".
func KindName(err error) string {
	switch KindOf(err) {
	case ErrBadRequest:
		return "bad_request"
	case ErrUnknownModel:
		return "unknown_model"
	case ErrContextLength:
		return "context_length"
	case ErrSession:
		return "session"
	case ErrOverloaded:
		return "overloaded"
	}
	return "upstream"
}

// EngineFailed reports whether a call record's error was the engine's
// (upstream or overloaded), not the harness's.
func (c CallRecord) EngineFailed() bool {
	return c.Status == CallError && (c.Kind == "upstream" || c.Kind == "overloaded")
}

// Param returns the offending field of err when it is an *Error.
func Param(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Param
	}
	return ""
}

// Call statuses in a session's record.
const (
	CallOK = "ok" // answered, its reply is in a branch
	// CallResent: the harness sent the identical request again (after a
	// 5xx, a cut stream or a reply it could not use); the call answered
	// again is recorded, this one kept out of training.
	CallResent = "resent"
	// CallDiscarded: answered, but no later call of the session echoed
	// the reply (the harness dropped it); kept out of training.
	CallDiscarded = "discarded"
	CallError     = "error" // answered with an error (Reason says which)
)

// CallRecord is one call as the gateway saw it.
type CallRecord struct {
	Index  int    // order of arrival in the session, from 0
	API    string // the front door's name
	Branch int    // the branch holding its reply (-1: none)
	Status string
	Reason string // why, for statuses other than ok
	// Kind names the error kind of a CallError (KindName): "upstream" and
	// "overloaded" are the engine's failures, the others the harness's.
	Kind string
	// Requested: the sampling fields the harness sent (never applied);
	// MaxTokens: what it asked for, Granted: what the run allowed.
	Requested map[string]any
	MaxTokens int
	Granted   int
	Stream    bool
	// ToolChoice is the harness's tool_choice ("auto", "none",
	// "required", "function:<name>"; "" when it sent none): recorded;
	// "none" also stops the reply's text being parsed for calls.
	ToolChoice       string
	ReplyID          string
	PromptTokens     int
	CompletionTokens int
	Started          time.Time
	Duration         time.Duration
}

// Branch is one maximal sequence of a session's calls each of which
// extends the previous one's tokens: a trainable record. A harness that
// rewrites its history (compaction, edits) or calls the model in
// parallel (sub-agents) starts a new branch; which branch a call extends
// is decided by token prefixes, not by text.
type Branch struct {
	Index int
	// Parent is the branch this one shares the longest token prefix with
	// (-1 for the first branch); SplitCall is the call that started this
	// branch and Shared the number of leading tokens it has in common
	// with its parent.
	Parent    int
	SplitCall int
	Shared    int
	Calls     []int // indices of the calls whose replies it holds, in order
	// Messages is the branch's conversation, canonical, with the sampled
	// replies as the gateway returned them.
	Messages []openai.ChatCompletionMessage
	Sequence inference.Sequence
}

// SessionRecord is what a closed session leaves.
type SessionRecord struct {
	ID       string
	Branches []Branch
	Calls    []CallRecord
	// Rewritten counts echoed assistant turns whose text differed from
	// what was sampled (the harness normalised them) and were anchored
	// back to the sampled ids; Unanchored counts echoed assistant turns
	// the gateway could not match to any call it answered (rendered from
	// the harness's text, masked, never trained).
	Rewritten  int
	Unanchored int
}
