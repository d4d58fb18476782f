package agentloop

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/util/tracing"
	"github.com/rollout-rl/rollout/parsers"
	"github.com/rollout-rl/rollout/tools"
)

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
	// repairs are what the parser fixed to read the call (its parse
	// status is then "repaired").
	repairs []string
	// raw is the call's exact text as the parser read it (tokens mode).
	raw     string
	content string
	toolErr error
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
	r.recordCallStatus(ctx, ep, gen, turn, slots)
	r.repairNames(slots)
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
	r.refuseUnexecutable(slots, cut)
	if r.runTools(ctx, parent, turn, slots, stats) {
		return true
	}
	if done, _ := r.respond(ctx, parent, turn); done {
		return true
	}
	if r.cfg.MaxConsecutiveInvalid > 0 && r.invalid >= r.cfg.MaxConsecutiveInvalid {
		r.stop(StopInvalidCalls, nil)
		return true
	}
	return false
}

// repairNames maps near-miss tool names onto the tools they mean, when the
// loop is asked to (RepairToolNames); the name the model wrote is kept for
// the record.
func (r *runner) repairNames(slots []*slot) {
	if !r.cfg.RepairToolNames || r.cfg.Tools == nil {
		return
	}
	for _, s := range slots {
		if s.parse != nil {
			continue
		}
		if name, ok := r.cfg.Tools.RepairName(s.name); ok {
			s.wroteName, s.name = s.name, name
		}
	}
}

// refuseUnexecutable marks the calls that must be answered with an error
// instead of run: the last call of a turn cut by max_tokens when it is
// incomplete (on_truncation: tool_error; only the last call can be cut),
// and the calls past MaxCallsPerTurn.
func (r *runner) refuseUnexecutable(slots []*slot, cut bool) {
	if cut {
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

// recordCallStatus records each call's parse outcome as the parser left
// it (before the loop's own name repair, which is a loop event).
func (r *runner) recordCallStatus(ctx context.Context, ep inference.Episode, gen inference.Turn, turn int, slots []*slot) {
	spans := r.callSpans(ctx, ep, gen, slots)
	for i, s := range slots {
		st := CallStatus{Turn: turn + 1, Index: i, Name: s.name, SpanStart: spans[i].Start, SpanEnd: spans[i].End}
		st.Status, st.Reason = parsers.Outcome(s.repairs, s.parse)
		r.res.CallStatuses = append(r.res.CallStatuses, st)
	}
}

// tokenSpanner maps byte ranges of a tokens-mode turn's text to its
// sampled ids (inference's tokens-mode episode).
type tokenSpanner interface {
	TokenSpans(ctx context.Context, ids []int32, text string, ranges []inference.ByteRange) ([]inference.TokenSpan, error)
}

// callSpans places each call's raw text in the turn's text, in order, and
// asks the episode for the sampled ids that produced it; spans are
// positions in the episode's Sequence. Calls without an
// exact place get -1, -1 (chat mode, a backend that cannot say, a call
// not found verbatim); a failed lookup is logged and leaves all unset —
// the spans are annotations, the turn goes on.
func (r *runner) callSpans(ctx context.Context, ep inference.Episode, gen inference.Turn, slots []*slot) []inference.TokenSpan {
	out := make([]inference.TokenSpan, len(slots))
	for i := range out {
		out[i] = inference.TokenSpan{Start: -1, End: -1}
	}
	sp, ok := ep.(tokenSpanner)
	if !ok || gen.Parsed || len(slots) == 0 || len(gen.CompletionIDs) == 0 {
		return out
	}
	var ranges []inference.ByteRange
	var which []int
	from := 0
	for i, s := range slots {
		if s.raw == "" {
			continue
		}
		at := strings.Index(gen.Text[from:], s.raw)
		if at < 0 {
			continue
		}
		start := from + at
		from = start + len(s.raw)
		ranges = append(ranges, inference.ByteRange{Start: start, End: from})
		which = append(which, i)
	}
	if len(ranges) == 0 {
		return out
	}
	got, err := sp.TokenSpans(ctx, gen.CompletionIDs, gen.Text, ranges)
	if err != nil {
		r.log.Warn("agentloop: tool-call token spans unavailable", "err", err)
		return out
	}
	// The turn's sampled ids follow its prompt in the Sequence: the
	// prompt is the whole sequence so far.
	for k, i := range which {
		if g := got[k]; g.Start >= 0 && g.End > g.Start {
			out[i] = inference.TokenSpan{Start: gen.PromptTokens + g.Start, End: gen.PromptTokens + g.End}
		}
	}
	return out
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
			out[e.Index] = &slot{name: e.Name, rawArgs: e.Snippet, parse: &e, raw: e.Raw}
		} else {
			// Index out of range: keep the error, after the others.
			for j := n - 1; j >= 0; j-- {
				if out[j] == nil {
					out[j] = &slot{name: e.Name, rawArgs: e.Snippet, parse: &e, raw: e.Raw}
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
		out[i] = &slot{id: tc.ID, name: tc.Name, rawArgs: tc.Arguments, repairs: tc.Repairs, raw: tc.Raw}
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
