package agentloop

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/tools"
)

// runTools executes the turn's calls, applies the result budgets and
// appends the tool messages; it records the turn's stats either way.
// stopped reports that an infrastructure error (or the context) ended the
// episode.
func (r *runner) runTools(ctx, parent context.Context, turn int, slots []*slot, stats TurnStats) (stopped bool) {
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
	return false
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
	te.Arguments = tools.HeadRunes(te.Arguments, 200)
	te.ToolResult = tools.HeadRunes(te.ToolResult, 500)
	r.res.ToolErrors = append(r.res.ToolErrors, te)
	r.res.Counters.ToolErrors++
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
