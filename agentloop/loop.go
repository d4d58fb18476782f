package agentloop

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	openai "github.com/sashabaranov/go-openai"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/util/tracing"
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
	// TurnRewards are the environment responder's intermediate rewards,
	// one per turn used (0 for a turn without one); nil when it gave none.
	TurnRewards []float64     `json:"turn_rewards,omitempty"`
	Turns       []TurnStats   `json:"turns"`
	Counters    Counters      `json:"counters"`
	Duration    time.Duration `json:"duration_ns"`
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

// slot is one call of a turn in call order: a prepared call or an invalid
// one that is answered without dispatch.
type slot struct {
	id      string
	name    string
	rawArgs string
	// wroteName is the name the model wrote when name repair changed it.
	wroteName string
	call      *tools.Call
	invalid   *tools.InvalidCallError
	parse     *parsers.CallError
	content   string
	toolErr   error
}

// finishLength is the finish_reason of a generation cut by max_tokens.
const finishLength = "length"

// turn runs one generation and its tools; done reports the episode ended.
// grace marks the extra turn after the turn budget: its calls are not
// executed.
func (r *runner) turn(ctx, parent context.Context, ep inference.Episode, turn int, grace bool) (done bool) {
	// The turn's span is the parent of its generation and tool calls: they
	// get ctx. parent stays the caller's, for telling cancellation apart.
	ctx, span := tracer.Start(ctx, "agentloop.turn")
	invalidBefore := r.res.Counters.InvalidCalls
	defer func() {
		if span.IsRecording() {
			r.annotateTurn(span, turn, done, invalidBefore)
		}
		span.End()
	}()
	stats := TurnStats{Turn: turn + 1}
	t0 := time.Now()
	gen, err := ep.Generate(ctx, r.res.Messages)
	stats.Generation = time.Since(t0)
	r.res.TurnsUsed = turn + 1
	if err != nil {
		r.res.Turns = append(r.res.Turns, stats)
		r.generationError(ctx, parent, err)
		return true
	}
	stats.PromptTokens, stats.CompletionTokens, stats.FinishReason = gen.PromptTokens, gen.CompletionTokens, gen.FinishReason
	r.res.Counters.PromptTokens += gen.PromptTokens
	r.res.Counters.CompletionTokens += gen.CompletionTokens

	reasoning, content, slots, err := r.interpret(gen)
	if err != nil {
		r.res.Turns = append(r.res.Turns, stats)
		r.stop(StopConfigErr, err)
		return true
	}
	r.res.ReasoningPerTurn = append(r.res.ReasoningPerTurn, reasoning)
	if r.cfg.RepairToolNames && r.cfg.Tools != nil {
		for _, s := range slots {
			if s.parse != nil {
				continue
			}
			if name, ok := r.cfg.Tools.RepairName(s.name); ok {
				s.wroteName, s.name = s.name, name
			}
		}
	}
	msgIdx := len(r.res.Messages)
	r.res.Messages = append(r.res.Messages, r.assistantMessage(turn, msgIdx, reasoning, content, slots))
	cut := gen.FinishReason == finishLength
	switch {
	case cut && (len(slots) == 0 || r.cfg.OnTruncation == TruncationStop):
		// The model ran out of tokens mid-turn: what it would have done
		// next is unknown, so nothing of the turn is executed.
		r.notExecuted(slots, turn, msgIdx, "length")
		r.res.Turns = append(r.res.Turns, stats)
		r.stop(StopLength, nil)
		return true
	case grace:
		r.notExecuted(slots, turn, msgIdx, "grace_turn")
		r.res.Turns = append(r.res.Turns, stats)
		r.res.FinishedNaturally = len(slots) == 0
		r.stop(StopMaxTurns, nil)
		return true
	case len(slots) == 0:
		r.res.Turns = append(r.res.Turns, stats)
		if done, added := r.respond(ctx, parent, turn); done || added {
			return done
		}
		if strings.TrimSpace(content) == "" && r.nudges < r.cfg.EmptyReplyNudges && turn+1 < r.cfg.MaxTurns {
			r.nudges++
			r.insert(turn+1, "empty_reply_nudge", EmptyReplyNudgeText)
			return false
		}
		r.res.FinishedNaturally = true
		r.stop(StopFinished, nil)
		return true
	}
	if cut {
		// on_truncation: tool_error. Only the last call can be cut.
		if last := slots[len(slots)-1]; last.parse != nil || !isObject(last.rawArgs) {
			last.invalid = &tools.InvalidCallError{Kind: InvalidTruncated, Tool: nameOr(last.name), Detail: "the generation hit max_tokens inside the call",
				Result: tools.ErrorResult(fmt.Sprintf("Your tool call (%s) was cut off: the reply reached the max_tokens limit before the call was complete, so it was not executed. Make it shorter, or split the work into smaller calls.", nameOr(last.name)))}
		}
	}
	if n := r.cfg.MaxCallsPerTurn; n > 0 && len(slots) > n {
		for i, s := range slots[n:] {
			if s.invalid == nil {
				s.invalid = &tools.InvalidCallError{Kind: InvalidTooManyCalls, Tool: nameOr(s.name), Detail: fmt.Sprintf("call %d of %d in one turn; the limit is %d", n+i+1, len(slots), n),
					Result: tools.ErrorResult(fmt.Sprintf("Too many tool calls in one turn: at most %d are executed, this was call %d. It was not executed.", n, n+i+1))}
			}
		}
	}

	t1 := time.Now()
	stats.ToolCalls = len(slots)
	r.prepare(slots, turn)
	queue, parallel, infraErr := r.execute(ctx, slots)
	stats.Queueing, stats.Parallel = queue, parallel
	if parallel {
		r.res.Counters.ParallelTurns++
	}
	if infraErr != nil {
		stats.Tools = time.Since(t1)
		r.res.Turns = append(r.res.Turns, stats)
		// A cancellation or timeout wins over whatever error the tools
		// reported while being torn down.
		if ctx.Err() != nil {
			r.ctxStop(ctx, parent)
		} else {
			r.stop(StopSandboxErr, fmt.Errorf("rollout %s turn %d: %w", r.cfg.ID, turn+1, infraErr))
		}
		return true
	}
	r.applyBudgets(ctx, slots)
	r.record(slots, turn)
	warned := r.budgetWarning(slots, turn)
	for _, s := range slots {
		r.res.Messages = append(r.res.Messages, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleTool, ToolCallID: s.id, Content: s.content})
	}
	if warned != "" {
		r.event(Event{Turn: turn + 1, Kind: EventBudgetWarning, Message: len(r.res.Messages) - 1, CallID: slots[len(slots)-1].id, Detail: warned})
	}
	stats.Tools = time.Since(t1)
	r.res.Turns = append(r.res.Turns, stats)
	if done, _ := r.respond(ctx, parent, turn); done {
		return true
	}
	if r.cfg.MaxConsecutiveInvalid > 0 && r.invalid >= r.cfg.MaxConsecutiveInvalid {
		r.stop(StopInvalidCalls, nil)
		return true
	}
	return false
}

const tracer = tracing.Tracer("github.com/rollout-rl/rollout/agentloop")

// annotateTurn sets the attributes of a finished turn's span from the
// turn's stats (every exit of turn appends them) and, when the episode
// ended in this turn, its stop reason.
func (r *runner) annotateTurn(span trace.Span, turn int, done bool, invalidBefore int) {
	span.SetAttributes(tracing.Rollout.String(r.cfg.ID), tracing.Turn.Int(turn+1))
	if n := len(r.res.Turns); n > 0 && r.res.Turns[n-1].Turn == turn+1 {
		st := r.res.Turns[n-1]
		span.SetAttributes(
			attribute.Int("agentloop.tool_calls", st.ToolCalls),
			attribute.Int("agentloop.invalid_calls", r.res.Counters.InvalidCalls-invalidBefore),
			attribute.Bool("agentloop.parallel", st.Parallel),
			attribute.String("agentloop.finish_reason", st.FinishReason),
		)
	}
	if done {
		span.SetAttributes(attribute.String("agentloop.stop_reason", string(r.res.StopReason)))
		if r.res.StopReason.Failed() {
			tracing.Fail(span, r.res.Err)
		}
	}
}

// interpret separates reasoning, content and calls of a generation.
func (r *runner) interpret(gen inference.Turn) (reasoning *string, content string, slots []*slot, err error) {
	if gen.Parsed {
		if gen.Reasoning != "" {
			s := gen.Reasoning
			reasoning = &s
		}
		content = gen.Content
		for i, tc := range gen.ToolCalls {
			s := &slot{id: tc.ID, name: tc.Function.Name, rawArgs: tc.Function.Arguments}
			if strings.TrimSpace(s.name) == "" {
				// A call without a name cannot go into the history (chat
				// templates refuse it): it is answered like a call the
				// parser could not read.
				s.parse = &parsers.CallError{Index: i, Reason: "the call has no tool name", Snippet: s.rawArgs}
				s.id = "" // not in the assistant message: its answer gets an id of its own
			}
			slots = append(slots, s)
		}
		// Text fallback with the configured family: the server may have
		// left well-formed calls in the content.
		if len(slots) == 0 && r.parser != nil && len(r.schemas) > 0 && content != "" {
			pr := r.parser.Parse(content, r.schemas)
			if len(pr.ToolCalls)+len(pr.Errors) > 0 {
				content = deref(pr.Content)
				slots = r.slotsFromParse(pr)
			}
		}
	} else {
		content = gen.Text
		if r.reason != nil {
			reasoning, content = r.reason.Extract(gen.Text, r.cfg.ReasoningOptions)
		}
		if len(r.schemas) > 0 {
			if r.parser == nil {
				return nil, "", nil, fmt.Errorf("%w: the policy returned unparsed text and tools are offered, but no tool-call parser is configured", ErrConfig)
			}
			pr := r.parser.Parse(content, r.schemas)
			content = deref(pr.Content)
			slots = r.slotsFromParse(pr)
		}
	}
	for _, s := range slots {
		if s.id == "" {
			s.id = parsers.NewCallIDFor(r.parser)
		}
	}
	return reasoning, content, slots, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// slotsFromParse puts well-formed calls and parse errors back in the
// order the model wrote them: errors carry their index, calls fill the rest.
func (r *runner) slotsFromParse(pr parsers.Result) []*slot {
	n := len(pr.ToolCalls) + len(pr.Errors)
	out := make([]*slot, n)
	for i := range pr.Errors {
		e := pr.Errors[i]
		if e.Index >= 0 && e.Index < n && out[e.Index] == nil {
			out[e.Index] = &slot{name: e.Name, rawArgs: e.Snippet, parse: &e}
		} else {
			// Index out of range: keep the error, after the others.
			for j := n - 1; j >= 0; j-- {
				if out[j] == nil {
					out[j] = &slot{name: e.Name, rawArgs: e.Snippet, parse: &e}
					break
				}
			}
		}
	}
	k := 0
	for i := range out {
		if out[i] != nil {
			continue
		}
		tc := pr.ToolCalls[k]
		k++
		out[i] = &slot{id: tc.ID, name: tc.Name, rawArgs: tc.Arguments}
	}
	for _, s := range out {
		if s.parse != nil {
			// The call is not in the assistant message (it is not
			// well-formed), so its answer needs an id of its own.
			s.id = parsers.NewCallIDFor(r.parser)
		}
	}
	return out
}

// assistantMessage is the turn's assistant message as the history holds it
// and as it is re-sent: the well-formed calls, with arguments that are not
// a JSON object replaced by "{}" (a server's chat template loads them as
// JSON; the vLLM and llama.cpp templates fail on anything else). What the
// model wrote is kept in the events; in tokens mode the sampled ids are the
// record, and the message is only a view of them.
func (r *runner) assistantMessage(turn, msgIdx int, reasoning *string, content string, slots []*slot) openai.ChatCompletionMessage {
	msg := openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant, Content: content}
	if reasoning != nil {
		msg.ReasoningContent = *reasoning
	}
	var unparsed []string
	for _, s := range slots {
		if s.parse != nil {
			// Not in the message: the parser could not read it.
			r.event(Event{Turn: turn + 1, Kind: EventCallUnparsed, Message: msgIdx, CallID: s.id, Original: s.rawArgs, Detail: s.parse.Reason})
			if s.rawArgs != "" {
				unparsed = append(unparsed, s.rawArgs)
			}
			continue
		}
		args := s.rawArgs
		if !isObject(args) {
			args = "{}"
			r.res.Counters.ReplacedArguments++
			r.event(Event{Turn: turn + 1, Kind: EventArgumentsReplaced, Message: msgIdx, CallID: s.id, Original: s.rawArgs, Detail: args})
		}
		if s.wroteName != "" {
			r.res.Counters.RepairedNames++
			r.event(Event{Turn: turn + 1, Kind: EventToolNameRepaired, Message: msgIdx, CallID: s.id, Original: s.wroteName, Detail: s.name})
		}
		msg.ToolCalls = append(msg.ToolCalls, openai.ToolCall{ID: s.id, Type: openai.ToolTypeFunction,
			Function: openai.FunctionCall{Name: s.name, Arguments: args}})
	}
	if msg.Content == "" && len(msg.ToolCalls) == 0 && len(unparsed) > 0 {
		// A turn whose only calls were unreadable would leave an assistant
		// message with neither content nor calls, which templates refuse
		// (llama.cpp: HTTP 400 "Assistant message must contain either
		// 'content' or 'tool_calls'"). The model's own text of those calls
		// is the truest view of the turn: the re-render then matches the
		// sampled ids instead of drifting.
		msg.Content = strings.Join(unparsed, "\n")
	}
	return msg
}

// isObject reports whether s is one JSON object (what templates accept as
// tool-call arguments).
func isObject(s string) bool {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "{") {
		return false
	}
	var v map[string]json.RawMessage
	return json.Unmarshal([]byte(s), &v) == nil
}

func nameOr(name string) string {
	if name == "" {
		return "unknown"
	}
	return name
}

// notExecuted records the calls of a turn after which the episode stops.
func (r *runner) notExecuted(slots []*slot, turn, msgIdx int, why string) {
	for _, s := range slots {
		r.event(Event{Turn: turn + 1, Kind: EventCallNotExecuted, Message: msgIdx, CallID: s.id, Detail: why})
	}
}

func (r *runner) prepare(slots []*slot, turn int) {
	for _, s := range slots {
		if s.invalid != nil {
			continue // answered by the loop (cut, or over the per-turn limit)
		}
		if s.parse != nil {
			name := s.parse.Name
			if name == "" {
				name = "unknown"
			}
			s.invalid = &tools.InvalidCallError{Kind: tools.InvalidParse, Tool: name, Detail: s.parse.Reason,
				Result: tools.ErrorResult(fmt.Sprintf("Could not parse tool call %d (%s): %s. Please retry with a well-formed tool call.", s.parse.Index, name, s.parse.Reason))}
			continue
		}
		if r.cfg.Tools == nil {
			s.invalid = &tools.InvalidCallError{Kind: tools.InvalidUnknownTool, Tool: s.name, Detail: "no tools are available",
				Result: tools.ErrorResult(fmt.Sprintf("Unknown tool '%s'. Available tools: []", s.name))}
			continue
		}
		c, err := r.cfg.Tools.Prepare(s.id, s.name, s.rawArgs)
		if err != nil {
			var ic *tools.InvalidCallError
			if !errors.As(err, &ic) {
				ic = &tools.InvalidCallError{Kind: tools.InvalidSchema, Tool: s.name, Detail: err.Error(), Result: tools.ErrorResult(err.Error())}
			}
			s.invalid = ic
			continue
		}
		s.call = c
	}
}

// execute runs the valid calls: together when they cannot interfere,
// else one by one in call order. It returns the first infrastructure (or
// context) error, which ends the episode.
func (r *runner) execute(ctx context.Context, slots []*slot) (queue time.Duration, parallel bool, err error) {
	var calls []*slot
	for _, s := range slots {
		if s.invalid != nil {
			s.content = s.invalid.Result
			continue
		}
		calls = append(calls, s)
	}
	if len(calls) == 0 {
		return 0, false, nil
	}
	start := time.Now()
	if len(calls) == 1 || !canRunTogether(calls) {
		for _, s := range calls {
			queue += time.Since(start)
			if err := r.runOne(ctx, s); err != nil {
				return queue, false, err
			}
		}
		return queue, false, nil
	}
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, r.cfg.Parallelism)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, s := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-tctx.Done():
				return
			}
			defer func() { <-sem }()
			waited := time.Since(start)
			e := r.runOne(tctx, s)
			mu.Lock()
			queue += waited
			if e != nil && first == nil {
				first = e
				cancel()
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = context.Cause(ctx)
	}
	return queue, true, first
}

func (r *runner) runOne(ctx context.Context, s *slot) error {
	t := time.Now()
	out, err := r.cfg.Tools.Execute(ctx, r.deps.Runtime, s.call)
	if d := time.Since(t); d > 30*time.Second {
		r.log.Info("slow tool call", "tool", s.name, "duration", d)
	}
	if err != nil {
		metrics().calls.WithLabelValues(s.name, "error").Inc()
		return err
	}
	s.content, s.toolErr = out.Content, out.Err
	s.content = r.budget.ApplyResult(ctx, r.deps.Runtime, s.call.Tool(), s.id, s.content)
	outcome := "ok"
	if s.toolErr != nil {
		outcome = "error"
	}
	m := metrics()
	m.calls.WithLabelValues(s.name, outcome).Inc()
	m.toolDur.WithLabelValues(s.name).Observe(time.Since(t).Seconds())
	return nil
}

// canRunTogether: no exclusive call, every path-scoped call names its
// paths, and no path written by one call overlaps a path of another.
func canRunTogether(calls []*slot) bool {
	type touch struct {
		idx   int
		path  string
		write bool
	}
	var ts []touch
	for i, s := range calls {
		t := s.call.Tool()
		switch t.Class {
		case tools.Exclusive:
			return false
		case tools.PathScoped:
			ps := s.call.Paths()
			if len(ps) == 0 {
				return false
			}
			for _, p := range ps {
				ts = append(ts, touch{i, p, true})
			}
		case tools.ReadOnly:
			for _, p := range s.call.Paths() {
				ts = append(ts, touch{i, p, false})
			}
		}
	}
	for a := range ts {
		for b := range ts {
			if ts[a].idx != ts[b].idx && (ts[a].write || ts[b].write) && overlaps(ts[a].path, ts[b].path) {
				return false
			}
		}
	}
	return true
}

// overlaps is conservative: a relative and an absolute path, or "~", may
// be the same file.
func overlaps(a, b string) bool {
	if strings.HasPrefix(a, "~") || strings.HasPrefix(b, "~") || path.IsAbs(a) != path.IsAbs(b) {
		return true
	}
	a, b = path.Clean(a), path.Clean(b)
	return a == b || a == "." || b == "." || a == "/" || b == "/" || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/") ||
		strings.HasPrefix(a, "..") || strings.HasPrefix(b, "..")
}

func (r *runner) applyBudgets(ctx context.Context, slots []*slot) {
	ids := make([]string, len(slots))
	contents := make([]string, len(slots))
	for i, s := range slots {
		ids[i], contents[i] = s.id, s.content
	}
	if r.deps.Runtime != nil {
		r.budget.ApplyTurn(ctx, r.deps.Runtime, ids, contents)
	}
	for i, s := range slots {
		s.content = contents[i]
		if strings.HasPrefix(s.content, "<persisted-output>") || strings.Contains(s.content, "[Truncated: tool response was") {
			r.res.Counters.SpilledResults++
		}
	}
}

func (r *runner) record(slots []*slot, turn int) {
	for _, s := range slots {
		r.res.Counters.ToolCalls++
		switch {
		case s.invalid != nil:
			metrics().calls.WithLabelValues("-", "invalid").Inc()
			r.res.Counters.InvalidCalls++
			r.invalid++
			r.addToolError(ToolError{Turn: turn + 1, CallID: s.id, Tool: s.invalid.Tool, Arguments: s.rawArgs, Error: s.invalid.Detail, ToolResult: s.content, Kind: s.invalid.Kind})
		default:
			r.invalid = 0
			if s.toolErr != nil {
				r.addToolError(ToolError{Turn: turn + 1, CallID: s.id, Tool: s.name, Arguments: s.rawArgs, Error: s.toolErr.Error(), ToolResult: s.content, Kind: "execution"})
			}
		}
	}
}

func (r *runner) addToolError(te ToolError) {
	te.Arguments = cut(te.Arguments, 200)
	te.ToolResult = cut(te.ToolResult, 500)
	r.res.ToolErrors = append(r.res.ToolErrors, te)
	r.res.Counters.ToolErrors++
}

func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i := 0
	for j := range s {
		if i == n {
			return s[:j]
		}
		i++
	}
	return s
}

// budgetWarning tells the model how many turns it has left, once at 70 %
// and once at 90 % of max_turns, inside the last tool result.
// It returns the warning given, or "".
func (r *runner) budgetWarning(slots []*slot, turn int) string {
	if !r.cfg.BudgetWarnings || len(slots) == 0 {
		return ""
	}
	used, max := turn+1, r.cfg.MaxTurns
	var msg string
	switch {
	case r.warned < 2 && used*10 >= max*9:
		r.warned = 2
		msg = fmt.Sprintf("[Budget warning: %d of %d turns used, %d left. Finish now: give your final answer.]", used, max, max-used)
	case r.warned < 1 && used*10 >= max*7:
		r.warned = 1
		msg = fmt.Sprintf("[Budget warning: %d of %d turns used, %d left. Start wrapping up.]", used, max, max-used)
	default:
		return ""
	}
	last := slots[len(slots)-1]
	var obj map[string]any
	if strings.HasPrefix(last.content, "{") && json.Unmarshal([]byte(last.content), &obj) == nil {
		obj["_budget_warning"] = msg
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if enc.Encode(obj) == nil {
			last.content = strings.TrimSuffix(buf.String(), "\n")
			return msg
		}
	}
	last.content += "\n\n" + msg
	return msg
}
