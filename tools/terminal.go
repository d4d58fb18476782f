package tools

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rollout-rl/rollout/sandbox"
)

const terminalSchema = `{
  "type": "object",
  "properties": {
    "command": {"type": "string", "description": "The shell command to run. The working directory and exported environment variables persist between calls."},
    "background": {"type": "boolean", "description": "Run the command in the background and return a session_id for the process tool. Use for servers and long-running jobs.", "default": false},
    "timeout": {"type": "integer", "minimum": 1, "description": "Timeout in seconds (default 180, foreground max 600). The command is killed when it expires and exit_code is 124."},
    "workdir": {"type": "string", "pattern": "^[A-Za-z0-9/\\\\:_\\-.~ +@=,]+$", "description": "Directory to run the command in (default: the current directory of the session)."},
    "pty": {"type": "boolean", "description": "Accepted for compatibility; commands run without a terminal."},
    "notify_on_complete": {"type": "boolean", "description": "Accepted for compatibility; use process(action=wait) instead."},
    "watch_patterns": {"type": "array", "items": {"type": "string"}, "description": "Accepted for compatibility."}
  },
  "required": ["command"]
}`

const terminalDescription = "Execute a shell command in the task's sandbox (a Linux container). The current directory and exported variables persist between calls. " +
	"Output longer than 50,000 characters keeps its beginning and end. Prefer read_file, write_file, patch and search_files over cat, sed, echo and grep for files. " +
	"Use background=true for servers and jobs that do not finish, then the process tool to poll, read logs, wait or kill."

func terminalTool() Tool {
	return Tool{Name: "terminal", Toolset: ToolsetTerminal, Description: terminalDescription, Parameters: []byte(terminalSchema),
		Class: Exclusive, MaxResultChars: 100_000, Handler: runTerminal}
}

type terminalResult struct {
	Output          string  `json:"output"`
	ExitCode        int     `json:"exit_code"`
	Error           *string `json:"error"`
	ExitCodeMeaning string  `json:"exit_code_meaning,omitempty"`
	Status          string  `json:"status,omitempty"`
	SessionID       string  `json:"session_id,omitempty"`
	PID             int     `json:"pid,omitempty"`
}

func terminalError(msg string) string {
	return marshal(terminalResult{ExitCode: -1, Error: &msg, Status: "error"})
}

func runTerminal(ctx context.Context, rt *Runtime, a Args) (string, error) {
	cmd := a.String("command", "")
	if strings.TrimSpace(cmd) == "" {
		return terminalError("Invalid command: expected a non-empty string"), nil
	}
	timeout := rt.TerminalTimeout
	if timeout <= 0 {
		timeout = DefaultTerminalTimeout
	}
	if a.Has("timeout") {
		timeout = time.Duration(a.Int("timeout", 0)) * time.Second
	}
	background := a.Bool("background", false)
	cwd := ""
	if wd := a.String("workdir", ""); wd != "" {
		p, err := rt.Resolve(ctx, wd)
		if err != nil {
			if IsInfra(err) || ctx.Err() != nil {
				return "", err
			}
			return terminalError("Invalid workdir: " + err.Error()), nil
		}
		cwd = p
	}
	if background {
		return startBackground(ctx, rt, cmd, cwd)
	}
	if timeout > MaxForegroundTimeout {
		return ErrorResult(fmt.Sprintf("Foreground timeout %ds exceeds the maximum of %ds. Use background=true for long-running commands and check on them with the process tool.",
			int(timeout/time.Second), int(MaxForegroundTimeout/time.Second))), nil
	}
	if msg := foregroundGuard(cmd); msg != "" {
		return terminalError(msg), nil
	}
	res, err := rt.Sandbox.Exec(ctx, sandbox.ExecRequest{Command: cmd, Shell: true, Cwd: cwd, Timeout: timeout,
		OutputCap: defaultExecOutputCap, MergeOutput: true})
	rt.invalidateCwd()
	if err != nil {
		if IsInfra(err) || ctx.Err() != nil {
			return "", err
		}
		return terminalError("Command execution failed: " + err.Error()), nil
	}
	out := strings.ToValidUTF8(string(res.Stdout), "\uFFFD")
	if len(res.Stderr) > 0 {
		// A backend that could not merge: keep stderr after stdout.
		out += strings.ToValidUTF8(string(res.Stderr), "\uFFFD")
	}
	out = StripANSI(out)
	dropped := int64(0)
	if res.StdoutTruncated {
		dropped = res.StdoutTotal - int64(len(res.Stdout))
	}
	limit := rt.TerminalOutputChars
	if limit <= 0 {
		limit = DefaultTerminalOutputChars
	}
	out = TruncateHeadTail(out, limit, int(dropped))
	out = strings.TrimSpace(out)
	code := res.ExitCode
	if res.TimedOut {
		code = 124
		out += fmt.Sprintf("\n[Command timed out after %ds]", int(timeout/time.Second))
	}
	r := terminalResult{Output: out, ExitCode: code}
	if code != 0 {
		r.ExitCodeMeaning = exitCodeMeaning(cmd, code)
	}
	return marshal(r), nil
}

// TruncateHeadTail keeps 40 % head and 60 % tail of s when it is longer
// than limit chars (plus extra chars already dropped upstream), with
// Hermes' notice in between.
func TruncateHeadTail(s string, limit, extraDropped int) string {
	n := utf8.RuneCountInString(s)
	if n <= limit && extraDropped == 0 {
		return s
	}
	total := n + extraDropped
	if n <= limit {
		// Upstream already cut the middle; say so at the cut we cannot see,
		// i.e. keep the text and report the loss.
		head := n * 4 / 10
		return HeadRunes(s, head) + fmt.Sprintf("\n\n... [OUTPUT TRUNCATED - %d chars omitted out of %d total] ...\n\n", extraDropped, total) + tailRunes(s, n-head)
	}
	head := limit * 4 / 10
	tail := limit - head
	omitted := total - head - tail
	return HeadRunes(s, head) + fmt.Sprintf("\n\n... [OUTPUT TRUNCATED - %d chars omitted out of %d total] ...\n\n", omitted, total) + tailRunes(s, tail)
}

var ansiRE = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[PX^_][^\x1b]*\x1b\\|\x1b[@-Z\\-_]`)

// StripANSI removes terminal escape sequences (CSI, OSC and the rest).
func StripANSI(s string) string {
	if !strings.ContainsRune(s, 0x1b) {
		return s
	}
	return ansiRE.ReplaceAllString(s, "")
}

var (
	quotedRE       = regexp.MustCompile(`'[^']*'|"(?:[^"\\]|\\.)*"`)
	backgroundRE   = regexp.MustCompile(`(^|[;&|(\s])(nohup|disown|setsid)(\s|$)|[^&]&\s*$|\s&\s`)
	longRunningRE  = regexp.MustCompile(`\b(?:(?:npm|pnpm|yarn|bun)\s+(?:run\s+)?(?:dev|start|serve|watch)\b|docker\s+compose\s+up\b|docker-compose\s+up\b|next\s+dev\b|vite\b|nodemon\b|uvicorn\b|gunicorn\b|python3?\s+-m\s+http\.server\b)`)
	helpFlagRE     = regexp.MustCompile(`(^|\s)(--help|-h|--version|-v)(\s|$)`)
	firstCommandRE = regexp.MustCompile(`^\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:sudo\s+)?([^\s;&|]+)`)
)

// foregroundGuard refuses commands that detach or never end: in the
// foreground they would only burn the timeout.
func foregroundGuard(cmd string) string {
	bare := quotedRE.ReplaceAllString(cmd, "''")
	if backgroundRE.MatchString(bare) {
		return "This command tries to detach a process (nohup, disown, setsid or '&'). Foreground commands must finish; run it with background=true instead and use the process tool to check on it."
	}
	if longRunningRE.MatchString(bare) && !helpFlagRE.MatchString(bare) {
		return "This looks like a long-running server or watcher, which never finishes in the foreground. Run it with background=true and use the process tool to read its output."
	}
	return ""
}

func exitCodeMeaning(cmd string, code int) string {
	m := firstCommandRE.FindStringSubmatch(cmd)
	if m == nil {
		return ""
	}
	name := m[1]
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	switch {
	case code == 1 && (name == "grep" || name == "egrep" || name == "fgrep" || name == "rg" || name == "ag" || name == "ack"):
		return "No matches found (not an error)"
	case code == 1 && name == "diff":
		return "Files differ (not an error)"
	case code == 1 && name == "find":
		return "Some paths could not be read"
	case code == 1 && (name == "test" || name == "["):
		return "Condition is false (not an error)"
	case code == 1 && name == "git":
		return "git reported a non-fatal condition (e.g. differences or nothing to do)"
	case name == "curl" && code == 6:
		return "Could not resolve host"
	case name == "curl" && code == 7:
		return "Failed to connect to host"
	case name == "curl" && code == 22:
		return "HTTP error status returned"
	case name == "curl" && code == 28:
		return "Operation timed out"
	}
	return ""
}

func startBackground(ctx context.Context, rt *Runtime, cmd, cwd string) (string, error) {
	if cwd == "" {
		c, _, err := rt.sessionDirs(ctx)
		if err != nil {
			if IsInfra(err) || ctx.Err() != nil {
				return "", err
			}
			return terminalError("Could not determine the working directory: " + err.Error()), nil
		}
		cwd = c
	}
	info, err := rt.Sandbox.Start(ctx, sandbox.ExecRequest{Command: cmd, Cwd: cwd, MergeOutput: true})
	if err != nil {
		if IsInfra(err) || ctx.Err() != nil {
			return "", err
		}
		if errors.Is(err, sandbox.ErrInvalid) {
			return terminalError("Invalid background command: " + err.Error()), nil
		}
		return terminalError("Failed to start background process: " + err.Error()), nil
	}
	return marshal(terminalResult{Output: "Background process started", SessionID: info.ID, PID: info.PID, ExitCode: 0}), nil
}
