package runner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/toolcontext"
	"github.com/rollout-rl/rollout/tools"
	"github.com/rollout-rl/rollout/tools/mcp"
)

// attempt is one try of one rollout. It never panics: a panic becomes a
// FailPanic record.
func (r *Runner) attempt(ctx context.Context, gr *groupRun, idx int) (ro Rollout) {
	start := time.Now()
	ro = Rollout{ID: newID("ro"), Index: idx, Status: StatusOK, Created: start}
	log := gr.log.With("rollout", ro.ID, "index", idx)
	defer func() {
		if p := recover(); p != nil {
			log.Error("rollout panicked", "panic", p, "stack", string(debug.Stack()))
			ro.fail(FailPanic, fmt.Errorf("panic: %v", p))
		}
		ro.Timings.Total = time.Since(start)
	}()
	if kind, err := gr.setupErr(); err != nil {
		ro.fail(kind, err)
		return ro
	}
	set := gr.set
	if set != nil {
		ro.Tools = set.OpenAI()
	}
	if err := r.rolls.Acquire(ctx, 1); err != nil {
		ro.fail(FailCancelled, err)
		return ro
	}
	defer r.rolls.Release(1)

	var sb sandbox.Sandbox
	if gr.task.Sandbox != nil {
		var err error
		var kind string
		sctx, span := startSandbox(ctx)
		sb, kind, err = r.openSandbox(sctx, gr, &ro)
		endSandbox(span, &ro, err)
		if err != nil {
			ro.fail(kind, err)
			return ro
		}
		defer r.boxes.Release(1)
		// Teardown happens after the reward, even on error, panic or
		// cancellation.
		defer closeSandbox(ctx, sb, log)
	}
	if len(gr.mcp) > 0 {
		sessions, mset, kind, err := r.openMCP(ctx, gr, sb, log)
		if err != nil {
			ro.fail(kind, err)
			return ro
		}
		defer func() {
			if err := sessions.Close(); err != nil {
				log.Debug("mcp close", "error", err)
			}
		}()
		set = mset
		ro.Tools = set.OpenAI()
	}

	var sess envs.Session
	if so, ok := r.deps.Env.(envs.Sessioned); ok {
		s, sset, kind, err := r.openEnvSession(ctx, so, gr, ro.ID, sb, set, log)
		if err != nil {
			ro.fail(kind, err)
			return ro
		}
		if s != nil {
			sess, set = s, sset
			ro.Tools = set.OpenAI()
			defer func() {
				if err := sess.Close(ctx); err != nil {
					log.Debug("env session close", "error", err)
				}
			}()
		}
	}

	rt := toolRuntime(sb, set, ro.ID, log)
	if kind, err := r.driverFor(gr.task).drive(ctx, episode{gr: gr, sb: sb, rt: rt, set: set, sess: sess, log: log}, &ro); err != nil {
		ro.fail(kind, err)
		return ro
	}
	rstart := time.Now()
	score, kind, err := r.score(ctx, gr, ro.Result, sb, rt, set, sess, log)
	ro.Timings.Reward = time.Since(rstart)
	if err != nil {
		ro.fail(kind, err)
		return ro
	}
	ro.Score = score
	return ro
}

// setupErr is the group's set-up failure every rollout of it records: a
// task or tool set the env could not build.
func (gr *groupRun) setupErr() (string, error) {
	switch {
	case gr.taskErr != nil:
		return FailTask, gr.taskErr
	case gr.setErr != nil:
		return FailTask, fmt.Errorf("tools: %w", gr.setErr)
	}
	return "", nil
}

// closeSandbox tears a rollout's sandbox down; it runs even when ctx is
// cancelled, bounded by its own minute.
func closeSandbox(ctx context.Context, sb sandbox.Sandbox, log *slog.Logger) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := sb.Close(cctx); err != nil {
		log.Warn("sandbox close", "error", err)
	}
}

// openMCP opens the task's MCP servers for one rollout and returns them
// with the tool set that offers their tools beside the group's. MCP
// servers are per rollout (a stdio server runs in this rollout's
// sandbox). A server that cannot be opened is an infrastructure failure
// (sandbox kind), like one that dies later; the caller closes the
// sessions.
func (r *Runner) openMCP(ctx context.Context, gr *groupRun, sb sandbox.Sandbox, log *slog.Logger) (*mcp.Sessions, *tools.Set, string, error) {
	sessions, err := mcp.Open(ctx, gr.mcp, sb, log)
	if err != nil {
		kind := FailTask // a configuration the servers cannot satisfy
		switch {
		case errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrClosed):
			kind = FailSandbox
		case ctx.Err() != nil:
			kind = FailCancelled
		}
		return nil, nil, kind, err
	}
	t := gr.task
	t.Tools = append(slices.Clip(gr.task.Tools), sessions.Tools()...)
	set, err := r.toolSet(t, gr.idx)
	if err != nil {
		if cerr := sessions.Close(); cerr != nil {
			log.Debug("mcp close", "error", cerr)
		}
		return nil, nil, FailTask, fmt.Errorf("tools: %w", err)
	}
	return sessions, set, "", nil
}

// openEnvSession opens the rollout's episode on the env's server (nil
// when this env's tasks have none) and returns it with the tool set that
// offers its tools beside set's. A server that is dead or misbehaving is
// an infrastructure failure (sandbox kind), like one that dies later; the
// caller closes the session.
func (r *Runner) openEnvSession(ctx context.Context, so envs.Sessioned, gr *groupRun, id string, sb sandbox.Sandbox, set *tools.Set, log *slog.Logger) (envs.Session, *tools.Set, string, error) {
	sess, err := so.OpenSession(ctx, gr.item, id, sb)
	if err != nil {
		kind := FailTask
		switch {
		case errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrClosed):
			kind = FailSandbox
		case ctx.Err() != nil:
			kind = FailCancelled
		}
		return nil, nil, kind, fmt.Errorf("env session: %w", err)
	}
	if sess == nil {
		return nil, set, "", nil
	}
	t := gr.task
	t.Tools = slices.Clip(gr.task.Tools)
	if set != nil {
		// MCP servers' tools of this rollout stay beside the session's.
		for _, n := range set.Names() {
			if tl, ok := set.Tool(n); ok && !slices.ContainsFunc(t.Tools, func(x tools.Tool) bool { return x.Name == n }) && !isBuiltin(n) {
				t.Tools = append(t.Tools, tl)
			}
		}
	}
	t.Tools = append(t.Tools, sess.Tools()...)
	nset, err := r.toolSet(t, gr.idx)
	if err != nil {
		if cerr := sess.Close(ctx); cerr != nil {
			log.Debug("env session close", "error", cerr)
		}
		return nil, nil, FailTask, fmt.Errorf("env session tools: %w", err)
	}
	return sess, nset, "", nil
}

// isBuiltin reports whether name is a built-in tool (the registry of a
// task's tools registers the built-ins itself).
func isBuiltin(name string) bool {
	return slices.ContainsFunc(tools.Builtins(), func(t tools.Tool) bool { return t.Name == name })
}

// loopConfig is the agent loop's configuration for one rollout of gr.
func (r *Runner) loopConfig(gr *groupRun, id string, set *tools.Set) agentloop.Config {
	lcfg := agentloop.Config{
		ID: id, Messages: gr.task.Messages, Tools: set, Model: r.cfg.Inference.Model,
		Sampling: gr.sampling, Parser: r.cfg.Parser, ReasoningParser: r.cfg.ReasoningParser,
		MaxTurns: r.cfg.MaxTurns, Timeout: time.Duration(r.cfg.RolloutTimeout),
		MaxConsecutiveInvalid: r.cfg.MaxConsecutiveInvalid,
		OnTruncation:          r.cfg.Loop.OnTruncation, BudgetWarnings: r.cfg.Loop.BudgetWarnings,
		GraceTurn: r.cfg.Loop.GraceTurn, EmptyReplyNudges: r.cfg.Loop.EmptyReplyNudges,
		RepairToolNames: r.cfg.Loop.RepairToolNames, MaxCallsPerTurn: r.cfg.Loop.MaxCallsPerTurn,
	}
	if gr.task.MaxTurns > 0 {
		lcfg.MaxTurns = gr.task.MaxTurns
	}
	lcfg.Responder = envs.ResponderOf(r.deps.Env, gr.item)
	if v, ok := gr.sampling.ChatTemplateKwargs["enable_thinking"].(bool); ok && !v {
		lcfg.ReasoningOptions.ThinkingDisabled = true
	}
	return lcfg
}

// toolRuntime is what the rollout's tools run with: nil when it has
// neither a sandbox nor tools. Call-only tools (recorded, never executed)
// and host-side tools (web_search, web_extract) need a runtime but no
// sandbox.
func toolRuntime(sb sandbox.Sandbox, set *tools.Set, id string, log *slog.Logger) *tools.Runtime {
	if sb == nil && set == nil {
		return nil
	}
	rt := tools.NewRuntime(sb, id)
	rt.Logger = log
	return rt
}

// checkEpisode classifies what the agent loop returned (loopErr, the
// Result in ro): a failed episode, a sequence the trainer cannot use, or
// a distillation that failed. It distills when the run has a teacher.
func (r *Runner) checkEpisode(ctx context.Context, gr *groupRun, ro *Rollout, loopErr error) (string, error) {
	res := ro.Result
	if loopErr != nil || res.StopReason.Failed() {
		if loopErr == nil {
			loopErr = errors.New(res.Error)
		}
		return loopFailure(res.StopReason, loopErr), loopErr
	}
	if err := r.checkSequence(res); err != nil {
		if errors.Is(err, inference.ErrRequest) {
			return FailRejected, err // not retried: the same prompt would not fit again
		}
		return FailInference, err
	}
	if r.deps.Distiller == nil {
		return "", nil
	}
	if err := r.distill(ctx, ro, len(gr.task.Messages), gr.sampling.ChatTemplateKwargs); err != nil {
		if ctx.Err() != nil {
			return FailCancelled, err
		}
		return FailDistill, err
	}
	return "", nil
}

// score runs the env's reward on the episode, within the reward timeout,
// with a ToolContext on the rollout's sandbox when it has one.
func (r *Runner) score(ctx context.Context, gr *groupRun, res agentloop.Result, sb sandbox.Sandbox, rt *tools.Runtime, set *tools.Set, sess envs.Session, log *slog.Logger) (rewards.Score, string, error) {
	rctx, cancel := context.WithTimeout(ctx, time.Duration(r.cfg.RewardTimeout))
	defer cancel()
	out := envs.Outcome{Messages: res.Messages, Final: finalContent(res), Turns: res.TurnsUsed,
		FinishedNaturally: res.FinishedNaturally, StopReason: string(res.StopReason), TurnRewards: res.TurnRewards,
		Session: sess}
	var box envs.Sandbox
	if sb != nil {
		box = sb
		tc, err := toolcontext.New(rt, set)
		if err != nil {
			return rewards.Score{}, FailReward, err
		}
		// Nothing the agent left running may change what the reward
		// reads (a background process rewriting a report, say). An env
		// session's reward is its server's, which runs in this sandbox and
		// must outlive the episode to score it (/verify); the reward reads
		// nothing else of the sandbox.
		if sess == nil {
			if err := tc.KillProcesses(rctx); err != nil {
				log.Warn("stop the agent's background processes before the reward", "error", err)
			}
		}
		out.Tools = tc
	}
	sctx, span := startReward(rctx)
	score, err := r.deps.Env.Reward(sctx, gr.item, out, box)
	endReward(span, score.Value, err)
	if err != nil {
		kind := FailReward
		if errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrClosed) {
			// The sandbox died under the reward (killed, OOM, past its
			// disk limit): infrastructure, not the reward's logic.
			kind = FailSandbox
		} else if errors.Is(rctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			kind = FailRewardTimout
		} else if ctx.Err() != nil {
			kind = FailCancelled
		}
		return rewards.Score{}, kind, err
	}
	if math.IsNaN(score.Value) || math.IsInf(score.Value, 0) {
		return rewards.Score{}, FailReward, fmt.Errorf("reward is %v", score.Value)
	}
	return score, "", nil
}

// tokensExpected reports whether the run's backend promises token ids: a
// tokens-mode backend, or the chat backend with chat_token_ids. An empty
// backend name (a library caller's own Policy) promises nothing.
func (r *Runner) tokensExpected() bool {
	b := r.cfg.Inference.Backend
	return b != "" && (b != inference.BackendChat || r.cfg.Inference.ChatTokenIDs)
}

// checkSequence refuses a silent empty: when token ids are expected, an
// episode the model finished must come with a sequence whose tokens, mask
// and logprobs are aligned, and with trained (sampled) tokens when a
// generation succeeded. A server that does not return ids (llama.cpp's
// chat endpoint without logprobs, say) must fail the rollout, never pass
// as ok with nothing a trainer could use.
func (r *Runner) checkSequence(res agentloop.Result) error {
	if !r.tokensExpected() {
		return nil
	}
	if len(res.ReasoningPerTurn) == 0 && res.StopReason == agentloop.StopContextLength {
		// Not the server failing to return ids: the task's first prompt
		// alone does not fit the context, so nothing was generated.
		return fmt.Errorf("%w: the first prompt does not fit the model's context (stop reason context_length before any generation); nothing to train on", inference.ErrRequest)
	}
	seq := res.Sequence
	n := len(seq.Tokens)
	switch {
	case n == 0:
		return fmt.Errorf("%w: server returned no token ids (backend %s expects them; %d generations)", inference.ErrInfra, r.cfg.Inference.Backend, len(res.ReasoningPerTurn))
	case len(seq.Mask) != n || len(seq.Logprobs) != n:
		return fmt.Errorf("%w: misaligned token sequence: %d tokens, %d mask entries, %d logprobs", inference.ErrInfra, n, len(seq.Mask), len(seq.Logprobs))
	}
	if len(res.ReasoningPerTurn) > 0 && !slices.Contains(seq.Mask, 1) {
		return fmt.Errorf("%w: server returned no ids for the sampled tokens: %d tokens, none trained after %d generations", inference.ErrInfra, n, len(res.ReasoningPerTurn))
	}
	return nil
}

func loopFailure(reason agentloop.StopReason, err error) string {
	switch {
	case reason == agentloop.StopSandboxErr || errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrClosed):
		return FailSandbox
	case reason == agentloop.StopRequestErr || errors.Is(err, inference.ErrRequest):
		return FailRejected
	case reason == agentloop.StopCancelled || errors.Is(err, context.Canceled):
		return FailCancelled
	case errors.Is(err, agentloop.ErrConfig):
		return FailTask
	case reason == agentloop.StopEnvErr && errors.Is(err, datasets.ErrInvalid):
		return FailTask // the item does not fit the responder's templates
	case reason == agentloop.StopEnvErr:
		return FailEnvFeedback
	}
	return FailInference
}

func (ro *Rollout) fail(kind string, err error) {
	ro.Status = StatusInfraFailed
	msg := "unknown error"
	if err != nil {
		msg = err.Error()
	}
	ro.Failure = &Failure{Kind: kind, Message: msg}
}

func finalContent(res agentloop.Result) string {
	for i := len(res.Messages) - 1; i >= 0; i-- {
		if res.Messages[i].Role == "assistant" {
			return res.Messages[i].Content
		}
	}
	return ""
}

func newID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + strings.ToLower(hex.EncodeToString(b[:]))
}
