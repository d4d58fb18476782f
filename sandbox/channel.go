package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"sync"
	"time"

	"github.com/rollout-rl/rollout/sandbox/agent"
)

// NewChannelOps binds the exec-channel calls to conn for owner, the sandbox
// whose check/wrap/state rules classify each call.
func NewChannelOps(conn *Conn, owner ChannelOwner) ChannelOps {
	return ChannelOps{Conn: conn, owner: owner}
}

// ChannelOps are the Sandbox operations carried over an agent channel
// (conn). Every backend whose sandboxes run the agent as their main process
// embeds it (Docker: the container's attach stream or socket; runc: the
// agent's pipes; Kubernetes: the pod's exec stream), so exec, files, tar,
// background processes and quiesce behave identically everywhere.
type ChannelOps struct {
	Conn  *Conn
	owner ChannelOwner
	calls gate
}

// gate counts the calls under way on one holder's channel. A sandbox reset
// in place for its next holder shuts its previous holder's gate: calls not
// yet sent are refused, and the reset waits for the ones already sent, so
// no request of one rollout can reach the container after the next one got
// it.
type gate struct {
	mu   sync.Mutex
	n    int
	shut bool
	idle chan struct{} // closed when n reaches 0 after shut
	// closers end what outlives a call (tunnel listeners) when the gate
	// shuts: they must not serve the next holder.
	closers map[any]func()
}

// onShut registers f to run when the gate shuts; false (f not kept) when
// it already has.
func (g *gate) onShut(key any, f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut {
		return false
	}
	if g.closers == nil {
		g.closers = map[any]func(){}
	}
	g.closers[key] = f
	return true
}

func (g *gate) offShut(key any) {
	g.mu.Lock()
	delete(g.closers, key)
	g.mu.Unlock()
}

func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut {
		return false
	}
	g.n++
	return true
}

func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.n == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// close refuses new calls and returns the number still under way and a
// channel closed when they have all returned.
func (g *gate) close() (int, <-chan struct{}) {
	g.mu.Lock()
	g.shut = true
	idle := make(chan struct{})
	if g.n == 0 {
		close(idle)
	} else {
		g.idle = idle
	}
	n, closers := g.n, g.closers
	g.closers = nil
	g.mu.Unlock()
	for _, f := range closers {
		f()
	}
	return n, idle
}

// Begin admits one call: the owner is open and its gate not shut. The
// returned func ends the call.
func (o *ChannelOps) Begin() (func(), error) {
	if err := o.owner.Check(); err != nil {
		return nil, err
	}
	if !o.calls.enter() {
		return nil, fmt.Errorf("%w: handed to its next holder", ErrClosed)
	}
	return o.calls.leave, nil
}

// ChannelOwner is the backend-specific part: whether the sandbox is still
// open, and what an error means for it (e.g. what happened to the container
// or pod when the channel broke). Handle implements it for every backend.
type ChannelOwner interface {
	Check() error
	Wrap(what string, err error) error
}

func ToSpec(req ExecRequest) (*agent.ExecSpec, error) {
	if (req.Command == "") == (len(req.Argv) == 0) {
		return nil, fmt.Errorf("%w: exactly one of Command and Argv must be set", ErrInvalid)
	}
	if req.Shell && req.Command == "" {
		return nil, fmt.Errorf("%w: Shell needs Command", ErrInvalid)
	}
	if req.Timeout < 0 || req.OutputCap < 0 {
		return nil, fmt.Errorf("%w: negative timeout or output cap", ErrInvalid)
	}
	if req.Cwd != "" && !path.IsAbs(req.Cwd) {
		return nil, fmt.Errorf("%w: cwd %q is not absolute", ErrInvalid, req.Cwd)
	}
	return &agent.ExecSpec{Argv: req.Argv, Command: req.Command, Shell: req.Shell, Cwd: req.Cwd, Env: req.Env,
		Stdin: req.Stdin, TimeoutNS: int64(req.Timeout), OutputCap: req.OutputCap, Merge: req.MergeOutput}, nil
}

func (o *ChannelOps) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	end, err := o.Begin()
	if err != nil {
		return ExecResult{}, err
	}
	defer end()
	spec, err := ToSpec(req)
	if err != nil {
		return ExecResult{}, err
	}
	start := time.Now()
	resp, err := o.Conn.roundTrip(ctx, agent.Request{Op: agent.OpExec, Exec: spec}, nil, nil)
	if err != nil {
		return ExecResult{}, o.owner.Wrap("exec", err)
	}
	if err := responseError("exec", resp); err != nil {
		return ExecResult{}, o.owner.Wrap("exec", err)
	}
	if resp.Exec == nil {
		return ExecResult{}, o.owner.Wrap("exec", fmt.Errorf("%w: agent sent no result", ErrUnavailable))
	}
	metricExec.Observe(time.Since(start).Seconds())
	r := resp.Exec
	return ExecResult{ExitCode: r.ExitCode, Stdout: r.Stdout, Stderr: r.Stderr, StdoutTotal: r.StdoutTotal, StderrTotal: r.StderrTotal,
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated, TimedOut: r.TimedOut, Duration: time.Duration(r.DurationNS)}, nil
}

func (o *ChannelOps) WriteFile(ctx context.Context, p string, data []byte, mode os.FileMode) error {
	end, err := o.Begin()
	if err != nil {
		return err
	}
	defer end()
	if !path.IsAbs(p) {
		return fmt.Errorf("write file: %w: path %q is not absolute", ErrInvalid, p)
	}
	resp, err := o.Conn.roundTrip(ctx, agent.Request{Op: agent.OpWrite, Path: p, Mode: uint32(mode.Perm())}, bytes.NewReader(data), nil)
	if err == nil {
		err = responseError("write "+p, resp)
	}
	return o.owner.Wrap("write file", err)
}

func (o *ChannelOps) ReadFile(ctx context.Context, p string) ([]byte, error) {
	end, err := o.Begin()
	if err != nil {
		return nil, err
	}
	defer end()
	if !path.IsAbs(p) {
		return nil, fmt.Errorf("read file: %w: path %q is not absolute", ErrInvalid, p)
	}
	var buf bytes.Buffer
	resp, err := o.Conn.roundTrip(ctx, agent.Request{Op: agent.OpRead, Path: p}, nil, &buf)
	if err == nil {
		err = responseError("read "+p, resp)
	}
	if err != nil {
		return nil, o.owner.Wrap("read file", err)
	}
	return buf.Bytes(), nil
}

func (o *ChannelOps) Upload(ctx context.Context, dir string, tarStream io.Reader) error {
	end, err := o.Begin()
	if err != nil {
		return err
	}
	defer end()
	if !path.IsAbs(dir) {
		return fmt.Errorf("upload: %w: dir %q is not absolute", ErrInvalid, dir)
	}
	resp, err := o.Conn.roundTrip(ctx, agent.Request{Op: agent.OpUpload, Path: dir}, tarStream, nil)
	if err == nil {
		err = responseError("upload to "+dir, resp)
	}
	return o.owner.Wrap("upload", err)
}

func (o *ChannelOps) Download(ctx context.Context, dir string, w io.Writer) error {
	end, err := o.Begin()
	if err != nil {
		return err
	}
	defer end()
	if !path.IsAbs(dir) {
		return fmt.Errorf("download: %w: dir %q is not absolute", ErrInvalid, dir)
	}
	resp, err := o.Conn.roundTrip(ctx, agent.Request{Op: agent.OpDownload, Path: dir}, nil, w)
	if err == nil {
		err = responseError("download "+dir, resp)
	}
	return o.owner.Wrap("download", err)
}

func procInfo(p *agent.ProcInfo) ProcessInfo {
	return ProcessInfo{ID: p.ID, Command: p.Command, PID: p.PID, Running: p.Running, ExitCode: p.ExitCode,
		StartedAt: time.Unix(0, p.StartedNS), Output: p.Output, OutputTotal: p.OutputTotal}
}

func (o *ChannelOps) procCall(ctx context.Context, what string, req agent.Request) (agent.Response, error) {
	end, err := o.Begin()
	if err != nil {
		return agent.Response{}, err
	}
	defer end()
	resp, err := o.Conn.roundTrip(ctx, req, nil, nil)
	if err == nil {
		err = responseError(what, resp)
	}
	return resp, o.owner.Wrap(what, err)
}

func (o *ChannelOps) Start(ctx context.Context, req ExecRequest) (ProcessInfo, error) {
	spec, err := ToSpec(req)
	if err != nil {
		return ProcessInfo{}, err
	}
	if req.Timeout != 0 {
		return ProcessInfo{}, fmt.Errorf("%w: background processes take no timeout (use Wait and Kill)", ErrInvalid)
	}
	resp, err := o.procCall(ctx, "start", agent.Request{Op: agent.OpStart, Exec: spec})
	if err != nil {
		return ProcessInfo{}, err
	}
	return procInfo(resp.Proc), nil
}

func (o *ChannelOps) Poll(ctx context.Context, id string) (ProcessInfo, error) {
	resp, err := o.procCall(ctx, "poll", agent.Request{Op: agent.OpPoll, Proc: id})
	if err != nil {
		return ProcessInfo{}, err
	}
	return procInfo(resp.Proc), nil
}

func (o *ChannelOps) Wait(ctx context.Context, id string, timeout time.Duration) (ProcessInfo, error) {
	if timeout < 0 {
		return ProcessInfo{}, fmt.Errorf("wait: %w: negative timeout", ErrInvalid)
	}
	resp, err := o.procCall(ctx, "wait", agent.Request{Op: agent.OpWait, Proc: id, TimeoutNS: int64(timeout)})
	if err != nil {
		return ProcessInfo{}, err
	}
	return procInfo(resp.Proc), nil
}

func (o *ChannelOps) Kill(ctx context.Context, id string) error {
	_, err := o.procCall(ctx, "kill", agent.Request{Op: agent.OpKill, Proc: id})
	return err
}

// KillAll stops every process in the container but its init and agent
// (Quiescer).
func (o *ChannelOps) KillAll(ctx context.Context) (int, error) {
	resp, err := o.procCall(ctx, "kill all processes", agent.Request{Op: agent.OpKillAll})
	return resp.Killed, err
}

func (o *ChannelOps) WriteStdin(ctx context.Context, id string, data []byte) error {
	_, err := o.procCall(ctx, "write stdin", agent.Request{Op: agent.OpStdin, Proc: id, Data: data})
	return err
}

// CloseStdin closes a background process's stdin (EOF for the process).
func (o *ChannelOps) CloseStdin(ctx context.Context, id string) error {
	_, err := o.procCall(ctx, "close stdin", agent.Request{Op: agent.OpStdin, Proc: id, Close: true})
	return err
}

func (o *ChannelOps) Processes(ctx context.Context) ([]ProcessInfo, error) {
	resp, err := o.procCall(ctx, "list processes", agent.Request{Op: agent.OpList})
	if err != nil {
		return nil, err
	}
	out := make([]ProcessInfo, 0, len(resp.Procs))
	for i := range resp.Procs {
		out = append(out, procInfo(&resp.Procs[i]))
	}
	return out, nil
}
