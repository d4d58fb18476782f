package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rollout-rl/rollout/internal/util/tracing"
	"github.com/rollout-rl/rollout/sandbox"
)

// Defaults of the terminal tool (Hermes' values).
const (
	DefaultTerminalTimeout           = 180 * time.Second
	MaxForegroundTimeout             = 600 * time.Second
	DefaultTerminalOutputChars       = 50_000
	defaultExecOutputCap             = 4 << 20
	maxReadFileBytes           int64 = 64 << 20
)

// Runtime is the per-rollout state the tools run with: the rollout's
// sandbox, its todo list, its limits and a few cached facts about the
// sandbox. One Runtime per rollout; it stays valid after the loop for the
// reward (toolcontext). (Not "env": that word names an RL environment.)
type Runtime struct {
	Sandbox   sandbox.Sandbox
	RolloutID string
	Todo      *TodoStore
	Logger    *slog.Logger
	// TerminalTimeout is the foreground default when the model gives none.
	TerminalTimeout time.Duration
	// TerminalOutputChars is the head/tail cap of terminal output.
	TerminalOutputChars int

	dirsMu   sync.Mutex // one session query at a time (parallel calls share the session)
	mu       sync.Mutex
	cwd      string // live cwd of the shell session; "" = unknown
	home     string
	hasRG    int // 0 unknown, 1 yes, 2 no
	resultsN int
}

// NewRuntime binds the tools to a rollout's sandbox.
func NewRuntime(sb sandbox.Sandbox, rolloutID string) *Runtime {
	return &Runtime{Sandbox: sb, RolloutID: rolloutID, Todo: &TodoStore{}, Logger: slog.Default(),
		TerminalTimeout: DefaultTerminalTimeout, TerminalOutputChars: DefaultTerminalOutputChars}
}

func (rt *Runtime) logger() *slog.Logger {
	if rt.Logger == nil {
		return slog.Default()
	}
	return rt.Logger
}

// invalidateCwd is called after every shell command: it may have run cd.
func (rt *Runtime) invalidateCwd() {
	rt.mu.Lock()
	rt.cwd = ""
	rt.mu.Unlock()
}

// sessionDirs returns the shell session's cwd and $HOME, so that relative
// paths in file tools mean what they mean in the terminal (one cwd model
// for every tool, unlike Hermes).
func (rt *Runtime) sessionDirs(ctx context.Context) (cwd, home string, err error) {
	rt.mu.Lock()
	cwd, home = rt.cwd, rt.home
	rt.mu.Unlock()
	if cwd != "" {
		return cwd, home, nil
	}
	rt.dirsMu.Lock()
	defer rt.dirsMu.Unlock()
	rt.mu.Lock()
	cwd, home = rt.cwd, rt.home
	rt.mu.Unlock()
	if cwd != "" {
		return cwd, home, nil
	}
	res, err := rt.Sandbox.Exec(ctx, sandbox.ExecRequest{Command: `printf '%s\n%s\n' "$PWD" "$HOME"`, Shell: true, Timeout: 30 * time.Second})
	if err != nil {
		return "", "", fmt.Errorf("read session cwd: %w", err)
	}
	lines := strings.Split(strings.TrimRight(string(res.Stdout), "\n"), "\n")
	if res.ExitCode != 0 || len(lines) == 0 || !strings.HasPrefix(lines[0], "/") {
		return "", "", fmt.Errorf("read session cwd: unexpected output %q (exit %d)", res.Stdout, res.ExitCode)
	}
	cwd = lines[0]
	home = "/root"
	if len(lines) > 1 && strings.HasPrefix(lines[1], "/") {
		home = lines[1]
	}
	rt.mu.Lock()
	rt.cwd, rt.home = cwd, home
	rt.mu.Unlock()
	return cwd, home, nil
}

// Resolve turns a model-supplied path into an absolute one: absolute paths
// are cleaned, "~" is $HOME, anything else is relative to the session cwd.
func (rt *Runtime) Resolve(ctx context.Context, p string) (string, error) {
	if p == "" {
		return "", errors.New("empty path")
	}
	if strings.ContainsRune(p, 0) {
		return "", errors.New("path contains a NUL byte")
	}
	if strings.HasPrefix(p, "/") {
		return path.Clean(p), nil
	}
	cwd, home, err := rt.sessionDirs(ctx)
	if err != nil {
		return "", err
	}
	if p == "~" {
		return home, nil
	}
	if strings.HasPrefix(p, "~/") {
		return path.Join(home, p[2:]), nil
	}
	return path.Join(cwd, p), nil
}

// argv runs a command without a shell: arguments are never interpolated.
func (rt *Runtime) argv(ctx context.Context, timeout time.Duration, args ...string) (sandbox.ExecResult, error) {
	return rt.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: args, Timeout: timeout, OutputCap: defaultExecOutputCap})
}

// IsInfra reports whether err means the sandbox (not the tool call) failed:
// the episode must stop.
func IsInfra(err error) bool {
	return errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrClosed)
}

// Outcome is the result of executing one call.
type Outcome struct {
	// Content is the tool message content.
	Content string
	// Err is set when the call failed in a way worth recording as a tool
	// error (handler error, or a result with an error and a negative
	// exit_code); Content already explains it to the model.
	Err error
}

// Execute runs a prepared call. The error is non-nil only when the episode
// cannot go on: the sandbox is gone (IsInfra) or ctx ended.
func (s *Set) Execute(ctx context.Context, rt *Runtime, call *Call) (out Outcome, err error) {
	ctx, span := tracer.Start(ctx, "tools.execute")
	if span.IsRecording() {
		span.SetAttributes(tracing.ToolName.String(call.Name), tracing.ToolCall.String(call.ID),
			attrClass.String(call.tool.tool.Class.String()))
		if rt != nil {
			span.SetAttributes(tracing.Rollout.String(rt.RolloutID))
		}
	}
	// Deferred first, so it runs after the recover below has set out.
	defer func() { endExecSpan(span, out, err) }()
	defer func() {
		if r := recover(); r != nil {
			rt.logger().Error("tool panicked", "rollout", rt.RolloutID, "tool", call.Name, "panic", r, "stack", string(debug.Stack()))
			msg := fmt.Sprintf("Tool execution failed: panic: %v", r)
			out, err = Outcome{Content: ErrorResult(msg), Err: errors.New(msg)}, nil
		}
	}()
	content, herr := call.tool.tool.Handler(ctx, rt, call.Args)
	if herr != nil {
		if IsInfra(herr) {
			return Outcome{}, fmt.Errorf("tool %s: %w", call.Name, herr)
		}
		if cerr := ctx.Err(); cerr != nil {
			return Outcome{}, fmt.Errorf("tool %s: %w", call.Name, context.Cause(ctx))
		}
		msg := "Tool execution failed: " + herr.Error()
		return Outcome{Content: ErrorResult(msg), Err: errors.New(msg)}, nil
	}
	out = Outcome{Content: content}
	if msg, ok := failedWithNegativeExit(content); ok {
		out.Err = errors.New(msg)
	}
	return out, nil
}

const tracer = tracing.Tracer("github.com/rollout-rl/rollout/tools")

const (
	attrClass = attribute.Key("rollout.tool.class")
	attrError = attribute.Key("rollout.tool.error")
)

// endExecSpan ends a tool call's span: an infrastructure error fails it
// with an error event; a tool error (the model sees it in the result)
// fails it with the message as rollout.tool.error.
func endExecSpan(span trace.Span, out Outcome, err error) {
	if span.IsRecording() {
		switch {
		case err != nil:
			tracing.Fail(span, err)
		case out.Err != nil:
			msg := tracing.Cut(out.Err.Error())
			span.SetAttributes(attrError.String(msg))
			tracing.FailMsg(span, msg)
		}
	}
	span.End()
}

// failedWithNegativeExit mirrors Hermes' post-check: a JSON object with a
// truthy "error" and a negative "exit_code" is a tool error too.
func failedWithNegativeExit(content string) (string, bool) {
	if !strings.HasPrefix(content, "{") || !strings.Contains(content, `"exit_code"`) {
		return "", false
	}
	var v struct {
		Error    any          `json:"error"`
		ExitCode *json.Number `json:"exit_code"`
	}
	if json.Unmarshal([]byte(content), &v) != nil || v.ExitCode == nil {
		return "", false
	}
	code, err := v.ExitCode.Int64()
	if err != nil || code >= 0 {
		return "", false
	}
	switch e := v.Error.(type) {
	case string:
		if e != "" {
			return e, true
		}
	case nil, bool:
		if e == true {
			return "error", true
		}
	default:
		return fmt.Sprint(e), true
	}
	return "", false
}
