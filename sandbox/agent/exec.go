package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultOutputCap is the per-stream byte budget when a request gives none.
const DefaultOutputCap = 1 << 20

// maxProcs bounds the background processes remembered; finished ones are
// forgotten first.
const maxProcs = 256

// drainGrace is how long output is still read after the command exited:
// a grandchild left in the background may hold the pipe open forever.
const drainGrace = 200 * time.Millisecond

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// capBuf keeps the first and the last bytes of a stream and counts all.
type capBuf struct {
	mu      sync.Mutex
	headCap int
	tailCap int
	head    []byte
	tail    []byte // ring once len == tailCap
	tpos    int
	tfull   bool
	total   int64
}

func newCapBuf(limit int) *capBuf {
	h := limit / 2
	return &capBuf{headCap: h, tailCap: limit - h}
}

func (b *capBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(p)
	b.total += int64(n)
	if room := b.headCap - len(b.head); room > 0 {
		take := min(room, len(p))
		b.head = append(b.head, p[:take]...)
		p = p[take:]
	}
	if len(p) == 0 || b.tailCap == 0 {
		return n, nil
	}
	if len(p) >= b.tailCap {
		if cap(b.tail) < b.tailCap {
			b.tail = make([]byte, b.tailCap)
		}
		b.tail = b.tail[:b.tailCap]
		copy(b.tail, p[len(p)-b.tailCap:])
		b.tpos, b.tfull = 0, true
		return n, nil
	}
	if !b.tfull {
		space := b.tailCap - len(b.tail)
		if len(p) < space {
			b.tail = append(b.tail, p...)
			return n, nil
		}
		b.tail = append(b.tail, p[:space]...)
		p = p[space:]
		b.tfull, b.tpos = true, 0
	}
	for len(p) > 0 {
		c := copy(b.tail[b.tpos:], p)
		p = p[c:]
		b.tpos = (b.tpos + c) % b.tailCap
	}
	return n, nil
}

// bytes returns the kept bytes (head then tail), the total and whether
// anything was dropped.
func (b *capBuf) bytes() ([]byte, int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]byte, 0, len(b.head)+len(b.tail))
	out = append(out, b.head...)
	if b.tfull {
		out = append(out, b.tail[b.tpos:]...)
		out = append(out, b.tail[:b.tpos]...)
	} else {
		out = append(out, b.tail...)
	}
	return out, b.total, b.total > int64(len(out))
}

// errNoCommand is a missing executable: a result (exit 127), not an error.
type errNoCommand struct{ name string }

func (e *errNoCommand) Error() string { return e.name + ": command not found" }

// running is one started command with the parent ends of its pipes.
type running struct {
	cmd     *exec.Cmd
	readers []*os.File
	pending atomic.Int32  // output copiers still running
	drained chan struct{} // closed when the last copier returned
	stdin   *os.File
	extra   []*os.File // parent ends of shell fds 3/4
	snap    bytes.Buffer
}

func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// shellScript builds the stateful-shell wrapper: restore the session's
// exported variables (fd 4), apply this command's env, cd, eval the command
// and, on any exit, report `pwd -P` and `export -p` on fd 3. Variables given
// for this command only are dropped from the saved state if unchanged.
func shellScript(env map[string]string, save bool) string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	if save {
		b.WriteString("__rollout_save() {\n")
		for _, k := range keys {
			fmt.Fprintf(&b, "  if [ \"${%s+set}\" = set ] && [ \"$%s\" = %s ]; then unset %s; fi\n", k, k, shQuote(env[k]), k)
		}
		b.WriteString("  { pwd -P; export -p; } >&3 2>/dev/null\n}\n")
		b.WriteString("trap '__rollout_rc=$?; __rollout_save; exit $__rollout_rc' EXIT\n")
	}
	// Under gVisor the sandbox user may not reopen the root agent's pipe
	// through /dev/fd (the chown does not reach it): read the inherited
	// descriptor instead. `command` keeps a failed `.` from ending the shell.
	b.WriteString("command . /dev/fd/4 2>/dev/null || eval \"$(cat <&4)\"\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "export %s=%s\n", k, shQuote(env[k]))
	}
	b.WriteString("cd -- \"$1\" || exit 126\n")
	b.WriteString("eval \"$2\"\n")
	return b.String()
}

func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		if fi, err := os.Stat(name); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return name, nil
		}
		return "", &errNoCommand{name}
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &errNoCommand{name}
}

// launch starts spec with stdout/stderr going to the given writers. When
// save is set (foreground Shell), the session snapshot comes back on fd 3.
func (s *server) launch(spec *ExecSpec, stdout, stderr io.Writer, save bool) (_ *running, err error) {
	cmd, err := s.command(spec, save)
	if err != nil {
		return nil, err
	}
	r := &running{cmd: cmd}
	ps := pipeSet{r: r}
	defer func() {
		for _, f := range ps.child {
			_ = f.Close()
		}
		if err != nil {
			r.closeAll()
		}
	}()
	sinks, envW, err := s.wire(&ps, spec, stdout, stderr)
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.EAGAIN) {
			return nil, fmt.Errorf("start %s: out of processes (pids limit): %w", cmd.Args[0], err)
		}
		return nil, fmt.Errorf("start %s: %w", cmd.Args[0], err)
	}
	s.startCopiers(r, spec, sinks, envW)
	return r, nil
}

// command checks spec and builds the command it runs: environment, argv
// (shell session, sh -c or plain argv), working directory and the sandbox
// user's credentials.
func (s *server) command(spec *ExecSpec, save bool) (*exec.Cmd, error) {
	if (len(spec.Argv) == 0) == (spec.Command == "") {
		return nil, invalidf("exactly one of command and argv must be set")
	}
	if spec.Shell && spec.Command == "" {
		return nil, invalidf("shell mode needs a command, not argv")
	}
	env, err := s.commandEnv(spec)
	if err != nil {
		return nil, err
	}
	cwd := spec.Cwd
	if cwd != "" && !filepath.IsAbs(cwd) {
		return nil, invalidf("cwd %q is not absolute", cwd)
	}
	var argv []string
	switch {
	case spec.Shell:
		if cwd == "" {
			cwd = s.shellCwd
		}
		argv = []string{"/bin/sh", "-c", shellScript(spec.Env, save), "rollout-shell", cwd, spec.Command}
		cwd = "/"
	case spec.Command != "":
		argv = []string{"/bin/sh", "-c", spec.Command}
	default:
		argv = spec.Argv
	}
	if cwd == "" {
		cwd = s.workdir
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, notFoundf("cwd %s: no such directory", cwd)
	}
	path, err := lookPath(argv[0], env)
	if err != nil {
		return nil, err
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: env, Dir: cwd}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if s.uid != 0 || s.gid != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(s.uid), Gid: uint32(s.gid), Groups: []uint32{}}
	}
	return cmd, nil
}

// commandEnv is the agent's base environment plus spec.Env. A shell
// session applies spec.Env in its script instead, so there the names
// only have to be shell identifiers.
func (s *server) commandEnv(spec *ExecSpec) ([]string, error) {
	env := append([]string(nil), s.baseEnv...)
	for k, v := range spec.Env {
		if spec.Shell {
			if !envName.MatchString(k) {
				return nil, invalidf("env name %q is not a shell identifier", k)
			}
			continue
		}
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(v, "\x00") {
			return nil, invalidf("bad env entry %q", k)
		}
		env = append(env, k+"="+v)
	}
	return env, nil
}

// pipeSet holds the pipes of one launch. The parent ends live in r; child
// lists the ends the child inherits, which launch closes in the agent once
// the child has started (or the launch failed): the readers see EOF only
// when no copy of a write end is left open.
type pipeSet struct {
	r     *running
	child []*os.File
}

// newPipe is os.Pipe with the error said to be the pipe's.
func newPipe() (*os.File, *os.File, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	return pr, pw, nil
}

// output opens a pipe the child writes and the agent reads (stdout or
// stderr), and returns the child's end.
func (ps *pipeSet) output() (*os.File, error) {
	pr, pw, err := newPipe()
	if err != nil {
		return nil, err
	}
	ps.r.readers = append(ps.r.readers, pr)
	ps.child = append(ps.child, pw)
	return pw, nil
}

// wire gives the command its pipes: stdout and stderr (one pipe when they
// go to the same writer), stdin when the spec feeds or keeps it, and a
// shell session's fds 3/4. It returns the writers the output pipes copy
// into, in the order of r.readers, and the agent's end of fd 4.
func (s *server) wire(ps *pipeSet, spec *ExecSpec, stdout, stderr io.Writer) ([]io.Writer, *os.File, error) {
	cmd := ps.r.cmd
	outW, err := ps.output()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdout = outW
	sinks := []io.Writer{stdout}
	if stderr == stdout {
		cmd.Stderr = outW
	} else {
		errW, err := ps.output()
		if err != nil {
			return nil, nil, err
		}
		cmd.Stderr = errW
		sinks = append(sinks, stderr)
	}
	if spec.Stdin != nil || spec.KeepStdin {
		inR, inW, err := newPipe()
		if err != nil {
			return nil, nil, err
		}
		ps.child = append(ps.child, inR)
		cmd.Stdin = inR
		ps.r.stdin = inW
	}
	if !spec.Shell {
		return sinks, nil, nil
	}
	envW, err := s.wireShell(ps)
	if err != nil {
		return nil, nil, err
	}
	return sinks, envW, nil
}

// wireShell opens a shell session's pipes: the snapshot comes back on fd
// 3, the saved state goes in on fd 4. It returns the agent's end of fd 4.
func (s *server) wireShell(ps *pipeSet) (*os.File, error) {
	snapR, snapW, err := newPipe()
	if err != nil {
		return nil, err
	}
	envR, envW, err := newPipe()
	if err != nil {
		_ = snapR.Close()
		_ = snapW.Close()
		return nil, err
	}
	// The shell reopens the pipe through /dev/fd/4, which checks the
	// pipe's owner: hand it to the sandbox user.
	if s.uid != 0 || s.gid != 0 {
		_ = envR.Chown(s.uid, s.gid)
	}
	ps.r.extra = append(ps.r.extra, snapR, envW)
	ps.child = append(ps.child, snapW, envR)
	ps.r.cmd.ExtraFiles = []*os.File{snapW, envR}
	return envW, nil
}

// startCopiers starts, for a started command, the goroutines that copy
// its output pipes into sinks (and the snapshot into r.snap) and that feed
// the session state and stdin. Each ends with its pipe; the last output
// copier closes r.drained.
func (s *server) startCopiers(r *running, spec *ExecSpec, sinks []io.Writer, envW *os.File) {
	copiers := len(r.readers)
	if spec.Shell {
		copiers++
	}
	r.drained = make(chan struct{})
	r.pending.Store(int32(copiers))
	copyOut := func(w io.Writer, rd io.Reader) {
		_, _ = io.Copy(w, rd)
		if r.pending.Add(-1) == 0 {
			close(r.drained)
		}
	}
	for i, rd := range r.readers {
		go copyOut(sinks[i], rd)
	}
	if spec.Shell {
		snapR := r.extra[0]
		go copyOut(&r.snap, io.LimitReader(snapR, 8<<20))
		r.readers = append(r.readers, snapR)
		state := s.shellEnv
		go func() {
			_, _ = envW.Write(state)
			_ = envW.Close()
		}()
	}
	if spec.Stdin != nil {
		in := r.stdin
		data := spec.Stdin
		keep := spec.KeepStdin
		go func() {
			_, _ = in.Write(data)
			if !keep {
				_ = in.Close()
			}
		}()
	}
}

// wait waits for the command to exit and reaps it. It first parks in the
// runtime's poller on a pidfd of the command, then reaps a process that
// has exited: the agent runs on one P, and os/exec's Wait alone blocks
// that P's thread in waitid, so the output copiers could run only after
// the runtime handed the P to another thread. Parked in the poller, one
// wake-up serves the exit and the pipes' EOF on the same thread (issue 20:
// the exec round trip). The pidfd is a file of its own (pidfd_open with
// PIDFD_NONBLOCK): os/exec's pidfd must stay blocking for its waitid.
// Without pidfds (old kernels, gVisor) it is os/exec's Wait alone. Only
// this Wait reaps the command, so its pid cannot be reused before.
func (r *running) wait() error {
	if fd, err := unix.PidfdOpen(r.cmd.Process.Pid, unix.PIDFD_NONBLOCK); err == nil {
		f := os.NewFile(uintptr(fd), "pidfd")
		if rc, err := f.SyscallConn(); err == nil {
			_ = rc.Read(pidfdExited)
		}
		_ = f.Close()
	}
	return r.cmd.Wait()
}

// pidfdExited reports whether the process behind pidfd has exited: a pidfd
// polls readable then. A poll error also ends the wait (os/exec's Wait
// then blocks as it would have).
func pidfdExited(pidfd uintptr) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err != nil || n > 0
}

// finish collects the output left after the process exited and releases
// the pipes.
func (r *running) finish() {
	select {
	case <-r.drained:
	default:
		t := time.NewTimer(drainGrace)
		select {
		case <-r.drained:
		case <-t.C:
			for _, f := range r.readers {
				_ = f.SetReadDeadline(time.Now())
			}
			<-r.drained
		}
		t.Stop()
	}
	r.closeAll()
}

func (r *running) closeAll() {
	for _, f := range r.readers {
		_ = f.Close()
	}
	for _, f := range r.extra {
		_ = f.Close()
	}
	if r.stdin != nil {
		_ = r.stdin.Close()
	}
}

func (r *running) killGroup() {
	if p := r.cmd.Process; p != nil {
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	}
}

func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

func outputCap(spec *ExecSpec) (int, error) {
	switch {
	case spec.OutputCap < 0:
		return 0, invalidf("negative output cap %d", spec.OutputCap)
	case spec.OutputCap == 0:
		return DefaultOutputCap, nil
	}
	return spec.OutputCap, nil
}

func (s *server) execForeground(ctx context.Context, spec *ExecSpec) (*ExecResult, error) {
	if spec == nil {
		return nil, invalidf("exec without a command")
	}
	if spec.TimeoutNS < 0 {
		return nil, invalidf("negative timeout")
	}
	limit, err := outputCap(spec)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	stdout := newCapBuf(limit)
	stderr := stdout
	if !spec.Merge {
		stderr = newCapBuf(limit)
	}
	if spec.Shell {
		s.shellMu.Lock()
		defer s.shellMu.Unlock()
	}
	r, err := s.launch(spec, stdout, stderr, spec.Shell)
	var nc *errNoCommand
	if errors.As(err, &nc) {
		msg := []byte("rollout-agent: " + nc.Error() + "\n")
		res := &ExecResult{ExitCode: 127, DurationNS: int64(time.Since(start))}
		if spec.Merge {
			res.Stdout, res.StdoutTotal = msg, int64(len(msg))
		} else {
			res.Stderr, res.StderrTotal = msg, int64(len(msg))
		}
		return res, nil
	}
	if err != nil {
		return nil, err
	}
	// The handler waits for the command itself; a timeout or a cancelled
	// request kills the process group from a timer or context callback,
	// which makes Wait return. No extra goroutine sits on the round trip.
	var timedOut, cancelled atomic.Bool
	stopTimer := func() bool { return true }
	if spec.TimeoutNS > 0 {
		t := time.AfterFunc(time.Duration(spec.TimeoutNS), func() {
			timedOut.Store(true)
			r.killGroup()
		})
		stopTimer = t.Stop
	}
	stopCancel := context.AfterFunc(ctx, func() {
		cancelled.Store(true)
		r.killGroup()
	})
	_ = r.wait()
	stopTimer()
	stopCancel()
	if timedOut.Load() || cancelled.Load() {
		r.killGroup() // children that were forked while the group was dying
	}
	r.finish()
	if cancelled.Load() {
		return nil, fmt.Errorf("command cancelled: %w", ctx.Err())
	}
	res := &ExecResult{ExitCode: exitCode(r.cmd.ProcessState), TimedOut: timedOut.Load(), DurationNS: int64(time.Since(start))}
	if res.TimedOut {
		res.ExitCode = 124
	}
	res.Stdout, res.StdoutTotal, res.StdoutTruncated = stdout.bytes()
	if !spec.Merge {
		res.Stderr, res.StderrTotal, res.StderrTruncated = stderr.bytes()
	}
	if spec.Shell && !res.TimedOut {
		s.saveShell(r.snap.Bytes())
	}
	return res, nil
}

// saveShell keeps the cwd and exported variables reported by the wrapper.
func (s *server) saveShell(snap []byte) {
	line, rest, ok := bytes.Cut(snap, []byte("\n"))
	if !ok || len(line) == 0 || line[0] != '/' {
		return
	}
	s.shellCwd = string(line)
	s.shellEnv = append([]byte(nil), rest...)
}

type proc struct {
	id      string
	command string
	pid     int
	started time.Time
	out     *capBuf
	r       *running
	stdinMu sync.Mutex
	done    chan struct{}
	code    int
}

func (p *proc) kill() { p.r.killGroup() }

func (p *proc) info() *ProcInfo {
	out, total, trunc := p.out.bytes()
	pi := &ProcInfo{ID: p.id, Command: p.command, PID: p.pid, StartedNS: p.started.UnixNano(), Output: out, OutputTotal: total, Truncated: trunc, Running: true}
	select {
	case <-p.done:
		pi.Running, pi.ExitCode = false, p.code
	default:
	}
	return pi
}

func newProcID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "proc_" + hex.EncodeToString(b[:])
}

func (s *server) startBackground(spec *ExecSpec) (*ProcInfo, error) {
	if spec == nil {
		return nil, invalidf("start without a command")
	}
	limit, err := outputCap(spec)
	if err != nil {
		return nil, err
	}
	out := newCapBuf(limit)
	bg := *spec
	bg.KeepStdin = true
	if spec.Shell {
		s.shellMu.Lock()
		defer s.shellMu.Unlock()
	}
	r, err := s.launch(&bg, out, out, false)
	if err != nil {
		return nil, err
	}
	command := spec.Command
	if command == "" {
		command = strings.Join(spec.Argv, " ")
	}
	p := &proc{id: newProcID(), command: command, pid: r.cmd.Process.Pid, started: time.Now(), out: out, r: r, done: make(chan struct{})}
	s.mu.Lock()
	s.procs[p.id] = p
	s.order = append(s.order, p.id)
	s.evictLocked()
	s.mu.Unlock()
	s.wg.Go(func() {
		_ = r.wait()
		r.finish()
		p.code = exitCode(r.cmd.ProcessState)
		close(p.done)
	})
	return p.info(), nil
}

func (s *server) evictLocked() {
	for len(s.order) > maxProcs {
		evicted := false
		for i, id := range s.order {
			p := s.procs[id]
			select {
			case <-p.done:
				delete(s.procs, id)
				s.order = append(s.order[:i], s.order[i+1:]...)
				evicted = true
			default:
			}
			if evicted {
				break
			}
		}
		if !evicted {
			return
		}
	}
}

func (s *server) lookupProc(id string) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[id]
	if p == nil {
		return nil, notFoundf("no background process %q", id)
	}
	return p, nil
}

func (s *server) poll(id string) (*ProcInfo, error) {
	p, err := s.lookupProc(id)
	if err != nil {
		return nil, err
	}
	return p.info(), nil
}

func (s *server) wait(ctx context.Context, id string, timeout time.Duration) (*ProcInfo, error) {
	p, err := s.lookupProc(id)
	if err != nil {
		return nil, err
	}
	var tc <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-p.done:
	case <-tc:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait cancelled: %w", ctx.Err())
	}
	return p.info(), nil
}

// killAll SIGKILLs every process in the container except init (pid 1)
// and the agent itself, whoever runs it — daemonised, setsid'd or
// reparented children included — so that nothing the agent's user left
// behind can act while a reward reads the sandbox. New processes forked
// during a sweep are caught by the next one.
func killAll() (int, error) {
	self := os.Getpid()
	killed := 0
	for round := 0; round < 20; round++ {
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return killed, fmt.Errorf("list /proc: %w", err)
		}
		found := 0
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == 1 || pid == self {
				continue
			}
			if zombie(pid) {
				continue // already dead, waiting for its parent
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				found++
			}
		}
		killed += found
		if found == 0 {
			return killed, nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return killed, errors.New("processes kept appearing after 20 kill sweeps")
}

// zombie reports whether pid has exited but is not reaped yet.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // gone
	}
	// The state follows the command name's closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z'
}

func (s *server) killProc(id string) error {
	p, err := s.lookupProc(id)
	if err != nil {
		return err
	}
	p.kill()
	return nil
}

func (s *server) writeStdin(id string, data []byte, closeIt bool) error {
	p, err := s.lookupProc(id)
	if err != nil {
		return err
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	select {
	case <-p.done:
		return invalidf("process %s has exited", id)
	default:
	}
	if p.r.stdin == nil {
		return invalidf("process %s has no stdin", id)
	}
	if len(data) > 0 {
		if _, err := p.r.stdin.Write(data); err != nil {
			return fmt.Errorf("write stdin of %s: %w", id, err)
		}
	}
	if closeIt {
		return p.r.stdin.Close()
	}
	return nil
}

func (s *server) list() []ProcInfo {
	s.mu.Lock()
	ps := make([]*proc, 0, len(s.order))
	for _, id := range s.order {
		ps = append(ps, s.procs[id])
	}
	s.mu.Unlock()
	out := make([]ProcInfo, 0, len(ps))
	for _, p := range ps {
		pi := p.info()
		pi.Output = nil // a listing carries no output; Poll does
		out = append(out, *pi)
	}
	return out
}
