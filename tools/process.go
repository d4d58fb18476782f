package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
)

const processSchema = `{
  "type": "object",
  "properties": {
    "action": {"type": "string", "enum": ["list", "poll", "log", "wait", "kill", "write", "submit", "close"], "description": "list: all background processes; poll: status and recent output; log: output lines (offset/limit); wait: block until exit or timeout; kill: stop it; write: send data to stdin; submit: send data plus a newline; close: close stdin (EOF)."},
    "session_id": {"type": "string", "description": "The session_id returned by terminal(background=true)."},
    "data": {"type": "string", "description": "Text for write/submit."},
    "timeout": {"type": "integer", "minimum": 1, "description": "Seconds to wait (wait action; default 180, max 600)."},
    "offset": {"type": "integer", "minimum": 0, "description": "First output line for log (0-based; default: the last lines)."},
    "limit": {"type": "integer", "minimum": 1, "description": "Number of output lines for log (default 200)."}
  },
  "required": ["action"]
}`

type stdinCloser interface {
	CloseStdin(ctx context.Context, id string) error
}

func processTool() Tool {
	return Tool{Name: "process", Toolset: ToolsetTerminal, Parameters: []byte(processSchema), Class: Exclusive, MaxResultChars: 100_000,
		Description: "Manage background processes started with terminal(background=true): list, poll, log, wait, kill, write, submit.",
		Handler:     runProcess}
}

type procView struct {
	SessionID     string  `json:"session_id"`
	Command       string  `json:"command"`
	PID           int     `json:"pid"`
	Status        string  `json:"status"`
	ExitCode      *int    `json:"exit_code,omitempty"`
	UptimeSeconds float64 `json:"uptime_seconds"`
	OutputChars   int64   `json:"output_total_bytes"`
}

func viewOf(p sandbox.ProcessInfo) procView {
	v := procView{SessionID: p.ID, Command: p.Command, PID: p.PID, Status: "running", OutputChars: p.OutputTotal}
	if !p.Running {
		v.Status = "exited"
		c := p.ExitCode
		v.ExitCode = &c
	}
	if !p.StartedAt.IsZero() {
		v.UptimeSeconds = float64(time.Since(p.StartedAt).Round(100*time.Millisecond)) / float64(time.Second)
	}
	return v
}

func runProcess(ctx context.Context, rt *Runtime, a Args) (string, error) {
	action := a.String("action", "")
	id := a.String("session_id", "")
	if action != "list" && id == "" {
		return ErrorResult(fmt.Sprintf("action %q needs a session_id (from terminal with background=true); use action=list to see them", action)), nil
	}
	fail := func(err error) (string, error) {
		switch {
		case IsInfra(err) || ctx.Err() != nil:
			return "", err
		case errors.Is(err, sandbox.ErrNotFound):
			return ErrorResult(fmt.Sprintf("Unknown session_id '%s'. Use action=list to see background processes.", id)), nil
		default:
			return ErrorResult(fmt.Sprintf("process %s failed: %v", action, err)), nil
		}
	}
	switch action {
	case "list":
		ps, err := rt.Sandbox.Processes(ctx)
		if err != nil {
			return fail(err)
		}
		views := make([]procView, 0, len(ps))
		for _, p := range ps {
			views = append(views, viewOf(p))
		}
		return marshal(map[string]any{"processes": views, "total": len(views)}), nil
	case "poll":
		p, err := rt.Sandbox.Poll(ctx, id)
		if err != nil {
			return fail(err)
		}
		out := StripANSI(strings.ToValidUTF8(string(p.Output), "\uFFFD"))
		return marshal(map[string]any{"process": viewOf(p), "output_preview": tailRunes(out, 2000)}), nil
	case "log":
		p, err := rt.Sandbox.Poll(ctx, id)
		if err != nil {
			return fail(err)
		}
		out := StripANSI(strings.ToValidUTF8(string(p.Output), "\uFFFD"))
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if out == "" {
			lines = nil
		}
		limit := a.Int("limit", 200)
		start := len(lines) - limit
		if a.Has("offset") {
			start = a.Int("offset", 0)
		}
		start = max(0, min(start, len(lines)))
		end := min(len(lines), start+limit)
		return marshal(map[string]any{"process": viewOf(p), "output": TruncateHeadTail(strings.Join(lines[start:end], "\n"), DefaultTerminalOutputChars, 0),
			"total_lines": len(lines), "offset": start, "lines_returned": end - start}), nil
	case "wait":
		timeout := time.Duration(a.Int("timeout", 180)) * time.Second
		if timeout > MaxForegroundTimeout {
			timeout = MaxForegroundTimeout
		}
		p, err := rt.Sandbox.Wait(ctx, id, timeout)
		if err != nil {
			return fail(err)
		}
		out := StripANSI(strings.ToValidUTF8(string(p.Output), "\uFFFD"))
		return marshal(map[string]any{"process": viewOf(p), "timed_out": p.Running,
			"output": strings.TrimRight(TruncateHeadTail(out, DefaultTerminalOutputChars, 0), "\n")}), nil
	case "kill":
		if err := rt.Sandbox.Kill(ctx, id); err != nil {
			return fail(err)
		}
		return marshal(map[string]any{"success": true, "session_id": id, "status": "killed"}), nil
	case "write", "submit":
		data := a.String("data", "")
		if action == "submit" {
			data += "\n"
		}
		if err := rt.Sandbox.WriteStdin(ctx, id, []byte(data)); err != nil {
			return fail(err)
		}
		return marshal(map[string]any{"success": true, "session_id": id, "bytes_written": len(data)}), nil
	case "close":
		// Closing stdin is an optional sandbox capability (the Docker
		// backend has it); the contract does not require it.
		c, ok := rt.Sandbox.(stdinCloser)
		if !ok {
			return ErrorResult("action close is not supported by this sandbox; use kill to stop the process"), nil
		}
		if err := c.CloseStdin(ctx, id); err != nil {
			return fail(err)
		}
		return marshal(map[string]any{"success": true, "session_id": id, "stdin": "closed"}), nil
	}
	return ErrorResult(fmt.Sprintf("unknown action %q", action)), nil
}
