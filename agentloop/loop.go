package agentloop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/parsers"
	"github.com/rollout-rl/rollout/tools"
)

// StopReason says why an episode ended.
type StopReason string

// Stop reasons. The first six are outcomes of the model's behaviour; the
// rest are failures of the rollout (Failed).
const (
	StopFinished      StopReason = "finished"           // the model answered without a tool call
	StopLength        StopReason = "length"             // the last generation hit max_tokens (finish_reason "length")
	StopMaxTurns      StopReason = "max_turns"          // the turn budget ran out
	StopContextLength StopReason = "context_length"     // the next prompt does not fit
	StopTimeout       StopReason = "timeout"            // the per-rollout wall-clock timeout expired
	StopInvalidCalls  StopReason = "invalid_tool_calls" // too many invalid calls in a row
	StopCancelled     StopReason = "cancelled"          // the caller's context ended
	StopInferenceErr  StopReason = "inference_error"    // inference.ErrInfra (or unclassified)
	StopRequestErr    StopReason = "request_rejected"   // inference.ErrRequest
	StopSandboxErr    StopReason = "sandbox_error"      // the sandbox died (sandbox.ErrUnavailable/ErrClosed)
	StopConfigErr     StopReason = "config_error"       // ErrConfig: the episode could not be run as configured
)

// Failed reports whether the stop reason is an infrastructure failure or
// cancellation: the trajectory must not be scored as a model outcome.
func (s StopReason) Failed() bool {
	switch s {
	case StopCancelled, StopInferenceErr, StopRequestErr, StopSandboxErr, StopConfigErr, StopEnvErr:
		return true
	}
	return false
}

// ErrConfig marks an invalid Config.
var ErrConfig = errors.New("invalid agent loop config")

// errRolloutTimeout is the cause of the per-rollout deadline.
var errRolloutTimeout = errors.New("rollout wall-clock timeout")

// Defaults.
const (
	DefaultMaxTurns              = 30
	DefaultMaxConsecutiveInvalid = 5
	DefaultParallelism           = 8
)

// Truncation policies: what the loop does with a generation that ended at
// the token limit (finish_reason "length").
const (
	// TruncationStop ends the episode with stop reason "length"; no call of
	// the cut turn is executed. The default: the model did not finish its
	// turn, and a trainer can tell (zero advantage on truncation).
	TruncationStop = "stop"
	// TruncationToolError answers each cut call with a tool error the
	// model sees, executes the turn's well-formed calls and continues. A
	// cut turn without calls still stops with "length".
	TruncationToolError = "tool_error"
)

// Texts the loop inserts (as user messages, or appended to a tool result).
// They are off by default: inserted text is context the policy did not
// produce, which changes the on-policy distribution.
const (
	EmptyReplyNudgeText = "Your last reply was empty. Continue with the task: call a tool, or give your final answer."
	GraceTurnText       = "You have used all your turns. Do not call any more tools: give your final answer now."
)

// Extra tool-call error kinds of the loop (beside the tools.Invalid* kinds).
const (
	// InvalidTruncated: the call was cut by the token limit
	// (on_truncation: tool_error).
	InvalidTruncated = "truncated"
	// InvalidTooManyCalls: the call came after MaxCallsPerTurn calls of
	// its turn.
	InvalidTooManyCalls = "too_many_calls"
)

// Event kinds: what the loop changed in, or added to, the conversation.
const (
	// EventArgumentsReplaced: a call's arguments were not a JSON object
	// (cut, malformed or empty); the history holds "{}" instead, Original
	// what the model wrote.
	EventArgumentsReplaced = "arguments_replaced"
	// EventToolNameRepaired: a near-miss tool name was mapped to a tool
	// (RepairToolNames); Original is the name the model wrote, Detail the
	// tool called.
	EventToolNameRepaired = "tool_name_repaired"
	// EventMessageInserted: the loop added a user message (Detail:
	// "empty_reply_nudge" or "grace_turn").
	EventMessageInserted = "message_inserted"
	// EventBudgetWarning: a budget warning was added to a tool result.
	EventBudgetWarning = "budget_warning"
	// EventCallUnparsed: the parser could not read a call; it is not in
	// the assistant message (its answer is a parse_error tool message).
	// Original is the parser's snippet of the call text.
	EventCallUnparsed = "call_unparsed"
	// EventCallNotExecuted: a call of the last turn was not executed
	// because the episode stopped (Detail: "length" or "grace_turn").
	EventCallNotExecuted = "call_not_executed"
	// EventDistillHint is added by the runner, not the loop, with
	// distillation hints: the teacher scored the assistant message Message
	// with Detail (the judge's hint) appended to the last user message
	// before it; Original says how many of the judge's votes were positive.
	EventDistillHint = "distill_hint"
)

// Config is one episode's input.
type Config struct {
	// ID is the rollout id (logs, endpoint affinity, tool call ids).
	ID       string
	Messages []openai.ChatCompletionMessage
	// Tools offered to the model; nil or empty means none.
	Tools    *tools.Set
	Model    string
	Sampling inference.Sampling
	// Parser is the tool-call parser (vLLM --tool-call-parser name). It is
	// required when the policy returns unparsed text (tokens mode) and
	// tools are offered; in chat mode it is the text fallback for calls the
	// server left in the content.
	Parser string
	// ReasoningParser separates reasoning in tokens mode ("" = none).
	ReasoningParser  string
	ReasoningOptions parsers.ReasoningOptions
	// MaxTurns bounds generations (default 30).
	MaxTurns int
	// Timeout is the per-rollout wall-clock limit (0 = none).
	Timeout time.Duration
	// MaxConsecutiveInvalid ends the episode after that many invalid calls
	// in a row (default 5; negative = never).
	MaxConsecutiveInvalid int
	// BudgetWarnings appends a warning to the last tool result at 70 % and
	// 90 % of MaxTurns.
	BudgetWarnings bool
	// OnTruncation is TruncationStop (default, also "") or
	// TruncationToolError.
	OnTruncation string
	// GraceTurn: when MaxTurns generations are used and the last one
	// called tools, insert GraceTurnText and allow one more generation,
	// whose calls are not executed. The stop reason stays max_turns.
	GraceTurn bool
	// EmptyReplyNudges answers up to that many empty replies (no call,
	// blank content) with EmptyReplyNudgeText instead of finishing
	// (0 = never).
	EmptyReplyNudges int
	// RepairToolNames executes a call to a near-miss tool name as the tool
	// it unambiguously means (tools.Set.RepairName); the history shows the
	// repaired name.
	RepairToolNames bool
	// MaxCallsPerTurn answers the calls after the first N of a turn with
	// a tool error without executing them (0 = no limit).
	MaxCallsPerTurn int
	// Budget is the tool result budget (zero value = Hermes' defaults).
	Budget tools.Budget
	// Parallelism bounds concurrent calls within a turn (default 8).
	Parallelism int
	// FinishTimeout bounds Episode.Finish (default 30 s).
	FinishTimeout time.Duration
	// Responder, when set, is the environment's side of a multi-turn
	// episode (feedback.go): called after each assistant turn, it may add
	// user messages, end the episode (env_done) or give turn rewards.
	Responder Responder
}

// Deps are the collaborators. Runtime is what the rollout's tools run
// with (bound to its sandbox); it may be nil when no tools are offered.
type Deps struct {
	Policy  inference.Policy
	Runtime *tools.Runtime
	Logger  *slog.Logger
}

type runner struct {
	cfg     Config
	deps    Deps
	log     *slog.Logger
	parser  parsers.Parser
	reason  parsers.ReasoningParser
	schemas []parsers.ToolSchema
	budget  tools.Budget
	res     *Result
	invalid int // consecutive invalid calls
	warned  int // budget warnings already given (0, 1 = 70 %, 2 = 90 %)
	nudges  int // empty-reply nudges given
}

// Run plays one episode. The returned error is nil when the episode ended
// for a model reason (finished, length, max_turns, context_length, timeout,
// invalid_tool_calls); otherwise it is Result.Err: an ErrConfig, a
// cancellation, or an infrastructure error that wraps the collaborator's
// class (inference.ErrInfra/ErrRequest, sandbox.ErrUnavailable/ErrClosed).
func Run(ctx context.Context, cfg Config, deps Deps) (Result, error) {
	start := time.Now()
	r, err := newRunner(cfg, deps)
	if err != nil {
		return Result{ID: cfg.ID, Messages: cloneMessages(cfg.Messages), StopReason: StopConfigErr, Err: err, Error: err.Error()}, err
	}
	m := metrics()
	m.active.Inc()
	r.run(ctx)
	r.padTurnRewards()
	m.active.Dec()
	m.episodes.WithLabelValues(string(r.res.StopReason)).Inc()
	m.turns.Add(float64(r.res.TurnsUsed))
	m.parallelT.Add(float64(r.res.Counters.ParallelTurns))
	r.res.Duration = time.Since(start)
	if r.res.Err != nil {
		r.res.Error = r.res.Err.Error()
	}
	if r.res.StopReason.Failed() {
		return *r.res, r.res.Err
	}
	return *r.res, nil
}

func newRunner(cfg Config, deps Deps) (*runner, error) {
	if deps.Policy == nil {
		return nil, fmt.Errorf("%w: no policy", ErrConfig)
	}
	if len(cfg.Messages) == 0 {
		return nil, fmt.Errorf("%w: no messages", ErrConfig)
	}
	if cfg.MaxTurns == 0 {
		cfg.MaxTurns = DefaultMaxTurns
	}
	if cfg.MaxTurns < 0 {
		return nil, fmt.Errorf("%w: max_turns %d is negative", ErrConfig, cfg.MaxTurns)
	}
	if cfg.MaxConsecutiveInvalid == 0 {
		cfg.MaxConsecutiveInvalid = DefaultMaxConsecutiveInvalid
	}
	if cfg.Parallelism <= 0 {
		cfg.Parallelism = DefaultParallelism
	}
	if cfg.FinishTimeout <= 0 {
		cfg.FinishTimeout = 30 * time.Second
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("%w: negative timeout", ErrConfig)
	}
	switch cfg.OnTruncation {
	case "":
		cfg.OnTruncation = TruncationStop
	case TruncationStop, TruncationToolError:
	default:
		return nil, fmt.Errorf("%w: on_truncation %q, want %q or %q", ErrConfig, cfg.OnTruncation, TruncationStop, TruncationToolError)
	}
	if cfg.EmptyReplyNudges < 0 {
		return nil, fmt.Errorf("%w: empty_reply_nudges %d is negative", ErrConfig, cfg.EmptyReplyNudges)
	}
	if cfg.MaxCallsPerTurn < 0 {
		return nil, fmt.Errorf("%w: max_calls_per_turn %d is negative", ErrConfig, cfg.MaxCallsPerTurn)
	}
	hasTools := cfg.Tools != nil && cfg.Tools.Len() > 0
	if hasTools && deps.Runtime == nil {
		return nil, fmt.Errorf("%w: tools offered without a tool runtime (Deps.Runtime)", ErrConfig)
	}
	r := &runner{cfg: cfg, deps: deps, log: deps.Logger, budget: cfg.Budget}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.log = r.log.With("rollout", cfg.ID)
	if cfg.Parser != "" {
		p, err := parsers.Get(cfg.Parser)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		r.parser = p
	}
	if cfg.ReasoningParser != "" {
		p, err := parsers.GetReasoning(cfg.ReasoningParser)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		r.reason = p
	}
	if hasTools {
		r.schemas = cfg.Tools.Schemas()
	}
	r.res = &Result{ID: cfg.ID, Messages: cloneMessages(cfg.Messages), ReasoningPerTurn: []*string{}, ToolErrors: []ToolError{}, Events: []Event{}, Turns: []TurnStats{}}
	return r, nil
}

func cloneMessages(m []openai.ChatCompletionMessage) []openai.ChatCompletionMessage {
	return append(make([]openai.ChatCompletionMessage, 0, len(m)+16), m...)
}

func (r *runner) stop(reason StopReason, err error) {
	r.res.StopReason = reason
	r.res.Err = err
}

// ctxStop classifies a context ending: our own timeout is a model outcome,
// the caller's cancellation is not.
func (r *runner) ctxStop(ctx context.Context, parent context.Context) {
	if errors.Is(context.Cause(ctx), errRolloutTimeout) && parent.Err() == nil {
		r.stop(StopTimeout, nil)
		return
	}
	r.stop(StopCancelled, fmt.Errorf("rollout %s: %w", r.cfg.ID, context.Cause(parent)))
}

func (r *runner) run(parent context.Context) {
	ctx := parent
	if r.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(parent, r.cfg.Timeout, errRolloutTimeout)
		defer cancel()
	}
	var spec inference.EpisodeSpec
	spec.ID, spec.Model, spec.Sampling = r.cfg.ID, r.cfg.Model, r.cfg.Sampling
	if r.cfg.Tools != nil && r.cfg.Tools.Len() > 0 {
		spec.Tools = r.cfg.Tools.OpenAI()
	}
	ep, err := r.deps.Policy.Start(ctx, spec)
	if err != nil {
		r.generationError(ctx, parent, err)
		return
	}
	defer r.finish(ctx, parent, ep)
	for turn := 0; turn < r.cfg.MaxTurns; turn++ {
		if ctx.Err() != nil {
			r.ctxStop(ctx, parent)
			return
		}
		if done := r.turn(ctx, parent, ep, turn, false); done {
			return
		}
	}
	if r.cfg.GraceTurn && r.cfg.MaxTurns > 0 {
		if ctx.Err() != nil {
			r.ctxStop(ctx, parent)
			return
		}
		r.insert(r.cfg.MaxTurns, "grace_turn", GraceTurnText)
		if done := r.turn(ctx, parent, ep, r.cfg.MaxTurns, true); done {
			return
		}
	}
	r.stop(StopMaxTurns, nil)
}

// insert appends a user message of the loop's own and records it. The
// backends render it like any non-assistant message: in tokens mode its
// ids are masked (never trained), exactly like a tool result.
func (r *runner) insert(turn int, why, text string) {
	r.res.Messages = append(r.res.Messages, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleUser, Content: text})
	r.res.Counters.InsertedMessages++
	r.event(Event{Turn: turn, Kind: EventMessageInserted, Message: len(r.res.Messages) - 1, Detail: why})
}

func (r *runner) event(e Event) {
	r.res.Events = append(r.res.Events, e)
	metrics().events.WithLabelValues(e.Kind).Inc()
}

func (r *runner) finish(ctx, parent context.Context, ep inference.Episode) {
	if parent.Err() != nil {
		// Cancelled before the sequence was taken: the episode may have
		// ended well, but without its tokens it is not a usable rollout,
		// so it must not pass as one (a resumed run collects it again).
		if !r.res.StopReason.Failed() {
			r.stop(StopCancelled, fmt.Errorf("rollout %s: cancelled before its token sequence was taken: %w", r.cfg.ID, context.Cause(parent)))
		}
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.FinishTimeout)
	defer cancel()
	seq, err := ep.Finish(fctx, r.res.Messages)
	if err != nil {
		if r.res.Err == nil && !r.res.StopReason.Failed() {
			reason := StopInferenceErr
			if errors.Is(err, inference.ErrRequest) {
				reason = StopRequestErr
			}
			r.stop(reason, fmt.Errorf("finish episode %s: %w", r.cfg.ID, err))
		}
		return
	}
	r.res.Sequence = seq
}

func (r *runner) generationError(ctx, parent context.Context, err error) {
	switch {
	case ctx.Err() != nil:
		r.ctxStop(ctx, parent)
	case errors.Is(err, inference.ErrContextLength):
		r.stop(StopContextLength, nil)
	case errors.Is(err, inference.ErrRequest):
		r.stop(StopRequestErr, fmt.Errorf("generate (rollout %s): %w", r.cfg.ID, err))
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		r.ctxStop(ctx, parent)
	default:
		if !errors.Is(err, inference.ErrInfra) {
			err = fmt.Errorf("%w: %w", inference.ErrInfra, err)
		}
		r.stop(StopInferenceErr, fmt.Errorf("generate (rollout %s): %w", r.cfg.ID, err))
	}
}
