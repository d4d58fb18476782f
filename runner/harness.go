package runner

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/sandbox"
)

// Gateway opens the capture sessions harness tasks run against, one per
// rollout (gateway/capture's Gateway, adapted by assemble).
type Gateway interface {
	// OpenSession opens a session whose generations use spec.Sampling
	// (the group's sampler), whatever the harness sends; maxCalls > 0 is
	// its call limit instead of CallLimit's.
	OpenSession(ctx context.Context, spec inference.EpisodeSpec, maxCalls int) (GatewaySession, error)
	// CallLimit is a session's call limit: a harness that reaches it looped.
	CallLimit() int
}

// GatewaySession is one rollout's session.
type GatewaySession interface {
	// Serve serves the session on l (the sandbox's tunnel) until l or the
	// session is closed.
	Serve(l net.Listener) error
	// Close ends the session (calls in flight are waited for) and returns
	// its record.
	Close(ctx context.Context) (gateway.SessionRecord, error)
}

// Harness stop reasons: how a harness episode ended. All are outcomes
// (data), never infrastructure failures; the reason's detail is the main
// row's loop event of kind "harness".
const (
	StopHarnessExit    agentloop.StopReason = "harness_exit"       // the harness exited 0
	StopHarnessCrash   agentloop.StopReason = "harness_crash"      // it exited non-zero
	StopHarnessTimeout agentloop.StopReason = "harness_timeout"    // its budget ran out; it was killed
	StopHarnessNoCalls agentloop.StopReason = "harness_no_calls"   // it never called the model
	StopHarnessLooped  agentloop.StopReason = "harness_call_limit" // it reached the session's call limit
	// StopSessionClosed: a standalone gateway's caller closed the session
	// (its harness ran elsewhere); StopSessionExpired: the session was
	// closed for it (idle expiry, or the gateway stopping).
	StopSessionClosed  agentloop.StopReason = "session_closed"
	StopSessionExpired agentloop.StopReason = "session_expired"
)

// harnessAPIKey is the key a harness is given: the tunnel reaches only its
// own session, so the key authorises nothing; SDKs refuse to start without
// one.
const harnessAPIKey = "rollout-session"

// harnessDriver runs a task's harness in the rollout's sandbox against a
// gateway session served on a loopback port inside that sandbox.
type harnessDriver struct{ r *Runner }

func (d harnessDriver) drive(ctx context.Context, ep episode, ro *Rollout) (string, error) {
	r, h := d.r, ep.gr.task.Harness
	// The harness offers its own tools in its calls (recorded per call);
	// the run's toolsets were never shown to the model.
	ro.Tools = nil
	if r.deps.Gateway == nil {
		ro.deterministic = true
		return FailTask, errors.New("harness task: the run has no gateway (harness envs need a tokens-mode inference backend and a tool-call parser)")
	}
	if ep.sb == nil {
		ro.deterministic = true
		return FailTask, errors.New("harness task: no sandbox (the harness runs in one)")
	}
	if err := h.Validate(); err != nil {
		ro.deterministic = true
		return FailTask, err
	}
	port := h.Port
	if port == 0 {
		port = envs.DefaultHarnessPort
	}
	l, err := sandbox.Listen(ctx, ep.sb, port)
	if err != nil {
		return sandboxKind(ctx, err, ro), fmt.Errorf("harness: open the session's port %d in the sandbox: %w", port, err)
	}
	defer l.Close()
	// The group's sampling (the run's, or a trainer's for this group)
	// governs the session's generations.
	sess, err := r.deps.Gateway.OpenSession(ctx, inference.EpisodeSpec{ID: ro.ID, Group: ep.gr.item.Key(), Model: r.cfg.Inference.Model, Sampling: ep.gr.sampling}, h.MaxCalls)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return FailCancelled, err
		case errors.Is(err, ErrConfig):
			ro.deterministic = true
			return FailTask, fmt.Errorf("harness: %w", err)
		}
		return FailInference, fmt.Errorf("harness: open a gateway session: %w", err)
	}
	served := make(chan error, 1)
	go func() { served <- sess.Serve(l) }()

	req, err := harnessExec(ctx, ep, h, port, r.cfg.Inference.Model, time.Duration(r.cfg.RolloutTimeout))
	var res sandbox.ExecResult
	if err == nil {
		res, err = ep.sb.Exec(ctx, req)
	}
	_ = l.Close()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	rec, cerr := sess.Close(cctx)
	cancel()
	<-served
	if err != nil {
		return sandboxKind(ctx, err, ro), fmt.Errorf("harness: run %q: %w", h.Command, err)
	}
	if cerr != nil {
		if ctx.Err() != nil {
			return FailCancelled, cerr
		}
		return FailInference, fmt.Errorf("harness: close the gateway session: %w", cerr)
	}
	ro.Session = &rec
	for _, c := range rec.Calls {
		ro.Timings.Generation += c.Duration
	}
	ro.Timings.Tools = max(res.Duration-ro.Timings.Generation, 0)
	limit := r.deps.Gateway.CallLimit()
	if h.MaxCalls > 0 {
		limit = h.MaxCalls
	}
	ro.Result = harnessResult(rec, res, limit)
	if kind, err := checkSession(ro, res); err != nil || r.deps.Distiller == nil {
		return kind, err
	}
	if err := DistillBranches(ctx, r.deps.Distiller, ro); err != nil {
		if ctx.Err() != nil {
			return FailCancelled, err
		}
		return FailDistill, err
	}
	return "", nil
}

// harnessExec is the command that runs the harness: its environment (the
// session's base URLs and key), its prompt, its budget.
func harnessExec(ctx context.Context, ep episode, h *envs.Harness, port int, model string, rolloutTimeout time.Duration) (sandbox.ExecRequest, error) {
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	env := map[string]string{}
	for k, v := range h.Env {
		env[k] = v
	}
	for _, a := range h.APIs {
		switch a {
		case envs.HarnessAPIOpenAI:
			env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"] = base+"/v1", harnessAPIKey
		case envs.HarnessAPIAnthropic:
			env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"] = base, harnessAPIKey
		}
	}
	if model != "" {
		env["ROLLOUT_MODEL"] = model
	}
	budget := h.Budget
	if budget == 0 {
		budget = rolloutTimeout
	}
	req := sandbox.ExecRequest{Command: h.Command, Env: env, Timeout: budget, OutputCap: 64 << 10}
	switch h.PromptVia {
	case envs.PromptFile:
		if err := ep.sb.WriteFile(ctx, envs.HarnessPromptFile, []byte(h.Prompt), 0o644); err != nil {
			return req, fmt.Errorf("write the prompt file: %w", err)
		}
		env["ROLLOUT_PROMPT_FILE"] = envs.HarnessPromptFile
	case envs.PromptArg:
		req.Command += " " + shellQuote(h.Prompt)
	default:
		req.Stdin = []byte(h.Prompt)
	}
	return req, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// sandboxKind classifies an error from the sandbox.
func sandboxKind(ctx context.Context, err error, ro *Rollout) string {
	switch {
	case ctx.Err() != nil:
		return FailCancelled
	case errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrClosed):
		return FailSandbox
	case errors.Is(err, sandbox.ErrInvalid) || errors.Is(err, errors.ErrUnsupported):
		ro.deterministic = true
		return FailTask
	}
	return FailSandbox
}

// harnessResult is what the reward and the main row see of a harness
// episode: the stop reason and its detail, the conversation of the branch
// that holds the session's last answered call (what the harness ended
// with), branch 0's sequence (the main row's).
func harnessResult(rec gateway.SessionRecord, res sandbox.ExecResult, callLimit int) agentloop.Result {
	out := SessionResult(rec)
	ok := out.TurnsUsed
	detail := fmt.Sprintf("exit %d after %s, %d calls (%d answered), %d branches", res.ExitCode, res.Duration.Round(time.Millisecond), len(rec.Calls), ok, len(rec.Branches))
	switch {
	case res.TimedOut:
		out.StopReason = StopHarnessTimeout
	case callLimit > 0 && len(rec.Calls) >= callLimit:
		out.StopReason = StopHarnessLooped
		detail += fmt.Sprintf("; the session's limit is %d calls", callLimit)
	case res.ExitCode != 0:
		out.StopReason = StopHarnessCrash
	case len(rec.Calls) == 0:
		out.StopReason = StopHarnessNoCalls
	default:
		out.StopReason = StopHarnessExit
		out.FinishedNaturally = true
	}
	if res.ExitCode != 0 {
		if tail := tailText(res.Stderr, 400); tail != "" {
			detail += "; stderr: " + tail
		}
	}
	out.Events = []agentloop.Event{{Kind: "harness", Detail: detail}}
	return out
}

// SessionResult is what the main row sees of a gateway session: its
// answered calls as turns, the conversation of the branch that holds the
// session's last answered call (what the harness ended with), branch 0's
// sequence. The caller sets the stop reason and events.
func SessionResult(rec gateway.SessionRecord) agentloop.Result {
	var out agentloop.Result
	last := -1
	for _, c := range rec.Calls {
		if c.Status == gateway.CallError {
			continue
		}
		out.TurnsUsed++
		if c.Branch >= 0 {
			last = c.Branch
		}
	}
	if last >= 0 && last < len(rec.Branches) {
		out.Messages = append([]openai.ChatCompletionMessage(nil), rec.Branches[last].Messages...)
	}
	if len(rec.Branches) > 0 {
		out.Sequence = rec.Branches[0].Sequence
	}
	return out
}

// tailText is the last n bytes or fewer of b, trimmed, starting on a
// rune boundary so that the detail stays valid UTF-8.
func tailText(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		i := len(s) - n
		for i < len(s) && !utf8.RuneStart(s[i]) {
			i++
		}
		s = "…" + s[i:]
	}
	return s
}

// checkSession refuses what a trainer cannot use: a branch whose tokens,
// mask and logprobs are misaligned, and a harness that failed because the
// engine did (a call the engine failed: infrastructure, not the model).
func checkSession(ro *Rollout, res sandbox.ExecResult) (string, error) {
	for _, b := range ro.Session.Branches {
		n := len(b.Sequence.Tokens)
		if len(b.Sequence.Mask) != n || len(b.Sequence.Logprobs) != n {
			return FailInference, fmt.Errorf("%w: session branch %d: misaligned token sequence: %d tokens, %d mask entries, %d logprobs", inference.ErrInfra, b.Index, n, len(b.Sequence.Mask), len(b.Sequence.Logprobs))
		}
	}
	if ro.Result.StopReason == StopHarnessExit {
		return "", nil
	}
	var engine []string
	for _, c := range ro.Session.Calls {
		if c.EngineFailed() {
			engine = append(engine, fmt.Sprintf("call %d: %s", c.Index, c.Reason))
		}
	}
	if len(engine) > 0 {
		return FailInference, fmt.Errorf("harness %s after the engine failed: %s", ro.Result.StopReason, strings.Join(engine, "; "))
	}
	return "", nil
}
