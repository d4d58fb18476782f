package tools

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
)

// hostSandbox is a unit-test fake: it runs commands on the host inside a
// temp directory and keeps a shell cwd like the real session does. It is
// only as faithful as these unit tests need; the Docker backend is
// exercised by the integration tests.
type hostSandbox struct {
	mu     sync.Mutex
	root   string
	cwd    string
	env    map[string]string
	closed bool
	dead   bool // simulate a killed container
	procs  map[string]*hostProc
	n      int
	execs  []sandbox.ExecRequest
}

type hostProc struct {
	info sandbox.ProcessInfo
	cmd  *exec.Cmd
	out  *bytes.Buffer
	mu   sync.Mutex
	done chan struct{}
	in   io.WriteCloser
}

var _ sandbox.Sandbox = (*hostSandbox)(nil)

func newHostSandbox(root string) *hostSandbox {
	return &hostSandbox{root: root, cwd: root, env: map[string]string{}, procs: map[string]*hostProc{}}
}

func (h *hostSandbox) ID() string { return "host-fake" }

func (h *hostSandbox) check() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return sandbox.ErrClosed
	}
	if h.dead {
		return fmt.Errorf("container gone: %w", sandbox.ErrUnavailable)
	}
	return nil
}

const cwdMarker = "__FAKE_CWD__"

func (h *hostSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	if err := h.check(); err != nil {
		return sandbox.ExecResult{}, err
	}
	h.mu.Lock()
	h.execs = append(h.execs, req)
	h.mu.Unlock()
	if (req.Command == "") == (len(req.Argv) == 0) {
		return sandbox.ExecResult{}, fmt.Errorf("exactly one of Command and Argv: %w", sandbox.ErrInvalid)
	}
	cctx := ctx
	var cancel context.CancelFunc
	if req.Timeout > 0 {
		cctx, cancel = context.WithTimeout(ctx, req.Timeout)
		defer cancel()
	}
	var cmd *exec.Cmd
	h.mu.Lock()
	cwd := h.cwd
	h.mu.Unlock()
	if req.Cwd != "" {
		cwd = req.Cwd
	}
	if req.Argv != nil {
		cmd = exec.CommandContext(cctx, req.Argv[0], req.Argv[1:]...)
		if req.Cwd == "" {
			cwd = h.root
		}
	} else {
		script := req.Command
		if req.Shell {
			state := h.root + "/.fake-shell-state"
			script = "[ -f " + state + " ] && . " + state + "\neval " + shellQuote(req.Command) + "\n__rc=$?\nexport -p > " + state + "\nprintf '\\n" + cwdMarker + "%s\\n' \"$PWD\"\nexit $__rc"
		}
		cmd = exec.CommandContext(cctx, "bash", "-c", script)
	}
	cmd.Dir = cwd
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	env := os.Environ()
	env = append(env, "HOME="+h.root)
	for k, v := range req.Env {
		env = append(env, k+"="+v)
	}
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	if req.MergeOutput {
		cmd.Stderr = &stdout
	} else {
		cmd.Stderr = &stderr
	}
	cmd.Stdin = bytes.NewReader(req.Stdin)
	start := time.Now()
	err := cmd.Run()
	res := sandbox.ExecResult{Duration: time.Since(start)}
	out := stdout.String()
	if req.Shell {
		if i := strings.LastIndex(out, "\n"+cwdMarker); i >= 0 {
			rest := strings.TrimSpace(out[i+len(cwdMarker)+1:])
			h.mu.Lock()
			h.cwd = rest
			h.mu.Unlock()
			out = out[:i]
		}
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	if cctx.Err() != nil {
		res.TimedOut, res.ExitCode = true, 124
	} else if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			res.ExitCode = ee.ExitCode()
		} else {
			res.ExitCode = 127
			stderr.WriteString(err.Error())
		}
	}
	capN := req.OutputCap
	if capN == 0 {
		capN = 1 << 20
	}
	res.Stdout, res.StdoutTotal, res.StdoutTruncated = capBytes([]byte(out), capN)
	res.Stderr, res.StderrTotal, res.StderrTruncated = capBytes(stderr.Bytes(), capN)
	return res, nil
}

func capBytes(b []byte, n int) ([]byte, int64, bool) {
	if len(b) <= n {
		return b, int64(len(b)), false
	}
	h := n / 2
	out := append(append([]byte{}, b[:h]...), b[len(b)-(n-h):]...)
	return out, int64(len(b)), true
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (h *hostSandbox) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	if err := h.check(); err != nil {
		return err
	}
	if !strings.HasPrefix(p, "/") {
		return sandbox.ErrInvalid
	}
	return os.WriteFile(p, data, mode)
}

func (h *hostSandbox) ReadFile(ctx context.Context, p string) ([]byte, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", p, sandbox.ErrNotFound)
	}
	return b, err
}

func (h *hostSandbox) Upload(ctx context.Context, dir string, r io.Reader) error {
	return errors.New("hostSandbox: upload not implemented yet")
}
func (h *hostSandbox) Download(ctx context.Context, dir string, w io.Writer) error {
	return errors.New("hostSandbox: download not implemented yet")
}

func (h *hostSandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.ProcessInfo, error) {
	if err := h.check(); err != nil {
		return sandbox.ProcessInfo{}, err
	}
	cmd := exec.Command("bash", "-c", req.Command)
	cmd.Dir = req.Cwd
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &hostProc{out: &bytes.Buffer{}, done: make(chan struct{}), cmd: cmd}
	w := &lockedWriter{p: p}
	cmd.Stdout, cmd.Stderr = w, w
	in, _ := cmd.StdinPipe()
	p.in = in
	if err := cmd.Start(); err != nil {
		return sandbox.ProcessInfo{}, err
	}
	h.mu.Lock()
	h.n++
	p.info = sandbox.ProcessInfo{ID: fmt.Sprintf("proc_%012d", h.n), Command: req.Command, PID: cmd.Process.Pid, Running: true, StartedAt: time.Now()}
	h.procs[p.info.ID] = p
	h.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.info.Running = false
		p.info.ExitCode = 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			p.info.ExitCode = ee.ExitCode()
		}
		p.mu.Unlock()
		close(p.done)
	}()
	return p.snapshot(), nil
}

type lockedWriter struct{ p *hostProc }

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.out.Write(b)
}

func (p *hostProc) snapshot() sandbox.ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.info
	i.Output = append([]byte{}, p.out.Bytes()...)
	i.OutputTotal = int64(p.out.Len())
	return i
}

func (h *hostSandbox) proc(id string) (*hostProc, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p, ok := h.procs[id]
	if !ok {
		return nil, fmt.Errorf("process %s: %w", id, sandbox.ErrNotFound)
	}
	return p, nil
}

func (h *hostSandbox) Poll(ctx context.Context, id string) (sandbox.ProcessInfo, error) {
	p, err := h.proc(id)
	if err != nil {
		return sandbox.ProcessInfo{}, err
	}
	return p.snapshot(), nil
}

func (h *hostSandbox) Wait(ctx context.Context, id string, timeout time.Duration) (sandbox.ProcessInfo, error) {
	p, err := h.proc(id)
	if err != nil {
		return sandbox.ProcessInfo{}, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	case <-ctx.Done():
		return sandbox.ProcessInfo{}, ctx.Err()
	}
	return p.snapshot(), nil
}

func (h *hostSandbox) Kill(ctx context.Context, id string) error {
	p, err := h.proc(id)
	if err != nil {
		return err
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	return nil
}

func (h *hostSandbox) WriteStdin(ctx context.Context, id string, data []byte) error {
	p, err := h.proc(id)
	if err != nil {
		return err
	}
	_, err = p.in.Write(data)
	return err
}

func (h *hostSandbox) Processes(ctx context.Context) ([]sandbox.ProcessInfo, error) {
	h.mu.Lock()
	ps := make([]*hostProc, 0, len(h.procs))
	for _, p := range h.procs {
		ps = append(ps, p)
	}
	h.mu.Unlock()
	var out []sandbox.ProcessInfo
	for _, p := range ps {
		out = append(out, p.snapshot())
	}
	return out, nil
}

func (h *hostSandbox) Close(ctx context.Context) error {
	h.mu.Lock()
	ps := h.procs
	h.procs = map[string]*hostProc{}
	h.closed = true
	h.mu.Unlock()
	for _, p := range ps {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	return nil
}
