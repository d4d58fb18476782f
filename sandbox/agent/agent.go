// Package agent is the in-container exec agent of the sandbox package: a
// small static program that runs as the container's main process (under
// docker-init) and serves a framed, multiplexed protocol (see proto.go) on
// its stdin/stdout, which the host reaches through one Docker attach
// connection. It runs commands in their own process groups as the sandbox
// user, enforces timeouts by killing the whole group, caps output at the
// source, keeps background processes and a stateful shell session, and does
// file transfers without relying on any tool inside the image. For a
// container with a read-only root, OpReset (reset.go) returns it to the
// state of a freshly started one so the host can reuse it.
//
// The agent itself runs as root with a minimal capability set (SETUID,
// SETGID, CHOWN, KILL) so that a command running as the sandbox user cannot
// kill it (`kill -9 -1`); file operations switch the thread's filesystem uid
// to the sandbox user so they cannot reach anything the user could not.
package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Main runs the agent with command-line args (without the program name) on
// the process's stdin/stdout and returns the exit code.
func Main(args []string) int {
	if len(args) == 1 && args[0] == ipcCleanFlag {
		// Hidden: the reset's child (see ipcClean), not in the usage.
		return ipcClean()
	}
	fset := flag.NewFlagSet("rollout-agent", flag.ContinueOnError)
	user := fset.String("user", "", "user to run commands as (name, uid or uid:gid)")
	fallback := fset.String("fallback-user", "", "user when -user is not in /etc/passwd and -optional-user is set")
	optional := fset.Bool("optional-user", false, "fall back to -fallback-user when -user does not exist")
	workdir := fset.String("workdir", "/workspace", "default working directory")
	install := fset.String("install", "", "copy this executable to the given path (mode 0755) and exit (Kubernetes init container)")
	socket := fset.String("socket", "", "also serve the protocol on a connection to this unix socket (the host's listener, on a bind mount)")
	initMode := fset.Bool("init", false, "run as the container's init: reap orphans, exit on SIGTERM/SIGINT (Kubernetes pods, where the agent itself is exec'd)")
	supervise := fset.Bool("supervise", false, "run as the container's init and start the agent (the other flags) as its child on the same stdio: reap orphans, forward signals, exit with the agent's status (containers started by runc directly, which have no docker-init)")
	if err := fset.Parse(args); err != nil {
		return 2
	}
	switch {
	case *install != "":
		if err := installSelf(*install); err != nil {
			fmt.Fprintln(os.Stderr, "rollout-agent: install:", err)
			return 1
		}
		return 0
	case *initMode:
		return runInit()
	case *supervise:
		return runSupervised(append(commandPrefix(args), withoutFlag(args, "supervise")...))
	}
	// One P: the agent's work is waiting on pipes, processes and its
	// channel. With the runtime's default (2 here, the floor for a
	// container's CPU limit of 1) every exec paid cross-thread wake-ups:
	// exec `true` p50 0.73-0.84 ms in the agent vs 0.89-1.05 ms, same
	// sandbox, alternating (sandbox/README.md). Commands do not inherit it.
	runtime.GOMAXPROCS(1)
	warmThreads()
	stdin, stdout := pollable(os.Stdin), pollable(os.Stdout)
	s := newServer(stdout)
	if err := s.setup(*user, *fallback, *optional, *workdir); err != nil {
		_ = s.sendJSON(FrameHello, 0, Hello{Version: ProtocolVersion, PID: os.Getpid(), Err: err.Error()})
		fmt.Fprintln(os.Stderr, "rollout-agent:", err)
		return 1
	}
	hello := s.hello()
	if *socket != "" {
		// The socket is the fast path (no dockerd in between); stdin stays
		// the lifetime channel and the fallback. Its hello goes first, so
		// the host finds the connection accepted when stdin's hello comes.
		if err := s.dial(*socket); err != nil {
			hello.SocketErr = err.Error()
		} else {
			hello.Socket = true
		}
	}
	if err := s.sendJSON(FrameHello, 0, hello); err != nil {
		fmt.Fprintln(os.Stderr, "rollout-agent: hello:", err)
		return 1
	}
	err := s.serve(bufio.NewReaderSize(stdin, 256<<10))
	s.shutdown()
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintln(os.Stderr, "rollout-agent:", err)
		return 1
	}
	return 0
}

// dial connects to the host's unix socket, sends the hello there and
// serves the connection in the background until the host closes it.
func (s *server) dial(path string) error {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return err
	}
	p := newPeer(c)
	p.conn = c
	if err := p.sendJSON(FrameHello, 0, s.hello()); err != nil {
		_ = c.Close()
		return err
	}
	s.mu.Lock()
	s.peers[p] = struct{}{}
	s.mu.Unlock()
	s.wg.Go(func() {
		_ = s.servePeer(p, bufio.NewReaderSize(c, 256<<10))
		_ = c.Close()
	})
	return nil
}

// warmThreads makes the Go runtime create a few OS threads up front. Under a
// fork bomb the pids cgroup is full and creating a thread later would abort
// the agent; idle threads are kept and reused by the runtime. Each warming
// goroutine locks itself to its thread and blocks, so the scheduler must
// start a new thread for the next one at once (a goroutine blocked in a
// plain syscall would get its thread replaced only when sysmon retakes the
// processor, after up to 10-20 ms on an idle process: that sleep used to
// delay every sandbox's hello by 20 ms). Unlocking before returning keeps
// the threads alive for reuse.
//
// Four are enough with one P (GOMAXPROCS 1): the stdin reader and each
// running foreground command's wait block a thread, the rest is netpoll.
// Every thread is a pid of the host's pid_max (32768 here), which at 1,000
// sandboxes is shared by 1,000 agents and 1,000 containerd shims.
func warmThreads() {
	const n = 4
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	ready.Add(n)
	for range n {
		done.Go(func() {
			runtime.LockOSThread()
			ready.Done()
			<-release
			runtime.UnlockOSThread()
		})
	}
	ready.Wait()
	close(release)
	done.Wait()
}

type inflight struct {
	cancel context.CancelFunc
	data   chan []byte   // inbound Data frames; closed on End
	done   chan struct{} // closed when the handler returned
	ended  bool
	// closing is closed on an End with EndClose (OpAccept: close the
	// connection once the inbound bytes are written).
	closing     chan struct{}
	closingOnce sync.Once
	// listener is OpAccept's listener, looked up when the request is
	// read: frames are served in the order they arrive, so an accept sent
	// before the listener's cancel waits on it (and fails when it
	// closes) instead of finding it gone.
	listener *tunnelListener
}

type server struct {
	main *peer // the container's stdin/stdout: its end is the host's end

	uid, gid int
	user     string
	home     string
	workdir  string
	baseEnv  []string

	mu    sync.Mutex
	peers map[*peer]struct{}
	procs map[string]*proc
	order []string // process ids in start order, for List and eviction

	shellMu  sync.Mutex
	shellCwd string
	shellEnv []byte // `export -p` output of the previous Shell command

	// Start-up state a reset restores (mounts.go, reset.go).
	roots      map[string]*mountRoot // tmpfs/mqueue mount roots by path
	mountTable []mountEntry
	mountErr   error // why the mount table could not be read
	keyBase    int   // kernel keys of the sandbox user at start-up, -1 unknown
	// checkMounts makes a reset refuse a writable root filesystem or a
	// user-writable mount left out of its paths (off only in tests that
	// run on the host's mounts).
	checkMounts bool
	selfExe     string      // the agent's binary, run with -ipc-clean
	resetting   atomic.Bool // a reset runs: new requests are refused

	wg sync.WaitGroup
}

// peer is one connection the agent serves frames on: stdin/stdout, and
// with -socket a unix socket to the host. Request ids are per peer;
// processes and the shell session are the server's.
type peer struct {
	outMu sync.Mutex
	out   *bufio.Writer

	mu   sync.Mutex
	reqs map[uint32]*inflight
	// listeners are the open OpListen requests of this peer, by id.
	listeners map[uint32]*tunnelListener

	conn io.Closer // a secondary peer's connection, closed at shutdown
}

func newPeer(w io.Writer) *peer {
	return &peer{out: bufio.NewWriterSize(w, 256<<10), reqs: map[uint32]*inflight{}, listeners: map[uint32]*tunnelListener{}}
}

func newServer(w io.Writer) *server {
	s := &server{
		main:  newPeer(w),
		peers: map[*peer]struct{}{},
		procs: map[string]*proc{},

		checkMounts: true,
		selfExe:     "/proc/self/exe",
		keyBase:     -1,
	}
	s.peers[s.main] = struct{}{}
	return s
}

func (s *server) hello() Hello {
	return Hello{Version: ProtocolVersion, PID: os.Getpid(), UID: s.uid, GID: s.gid, User: s.user, Workdir: s.workdir}
}

func (p *peer) send(typ byte, id uint32, payload []byte) error {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	if err := WriteFrame(p.out, typ, id, payload); err != nil {
		return err
	}
	return p.out.Flush()
}

func (p *peer) sendJSON(typ byte, id uint32, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return p.send(typ, id, b)
}

// sendJSON sends on the main peer (the hello).
func (s *server) sendJSON(typ byte, id uint32, v any) error { return s.main.sendJSON(typ, id, v) }

// serve reads frames from the main peer until stdin ends (the host went
// away).
func (s *server) serve(r io.Reader) error { return s.servePeer(s.main, r) }

// servePeer reads p's frames from r until r ends. Requests of a secondary
// peer (registered in s.peers by its caller) are cancelled when it ends; the main peer's end is the agent's
// (shutdown).
func (s *server) servePeer(p *peer, r io.Reader) error {
	if p != s.main {
		defer func() {
			s.mu.Lock()
			delete(s.peers, p)
			s.mu.Unlock()
			p.mu.Lock()
			for _, in := range p.reqs {
				in.cancel()
			}
			p.mu.Unlock()
		}()
	}
	for {
		f, err := ReadFrame(r)
		if err != nil {
			return err
		}
		switch f.Type {
		case FrameRequest:
			var req Request
			if err := json.Unmarshal(f.Payload, &req); err != nil {
				_ = p.sendJSON(FrameResponse, f.ID, Response{Code: CodeInvalid, Err: "bad request: " + err.Error()})
				continue
			}
			ctx, cancel := context.WithCancel(context.Background())
			in := &inflight{cancel: cancel, data: make(chan []byte, 16), done: make(chan struct{}), closing: make(chan struct{})}
			p.mu.Lock()
			// Checked under p.mu: a reset sets the flag before it
			// cancels what p.reqs holds, so a request is either cancelled
			// by it or refused here.
			if s.resetting.Load() {
				p.mu.Unlock()
				cancel()
				_ = p.sendJSON(FrameResponse, f.ID, Response{Code: CodeFailed, Err: "the sandbox is being reset"})
				continue
			}
			if _, dup := p.reqs[f.ID]; dup {
				p.mu.Unlock()
				cancel()
				_ = p.sendJSON(FrameResponse, f.ID, Response{Code: CodeInvalid, Err: fmt.Sprintf("request id %d already in use", f.ID)})
				continue
			}
			if req.Op == OpAccept {
				in.listener = p.listeners[req.Listener]
			}
			p.reqs[f.ID] = in
			p.mu.Unlock()
			s.wg.Go(func() {
				resp := s.handle(ctx, p, f.ID, &req, in.data)
				close(in.done)
				cancel()
				p.mu.Lock()
				delete(p.reqs, f.ID)
				p.mu.Unlock()
				_ = p.sendJSON(FrameResponse, f.ID, resp)
			})

		case FrameData, FrameEnd, FrameCancel:
			p.mu.Lock()
			in := p.reqs[f.ID]
			p.mu.Unlock()
			if in == nil {
				continue // the request already finished; late frames are dropped
			}
			switch {
			case f.Type == FrameCancel:
				in.cancel()
			case f.Type == FrameEnd:
				switch {
				case string(f.Payload) == EndClose:
					in.closingOnce.Do(func() { close(in.closing) })
				case len(f.Payload) > 0:
					in.cancel() // the host aborted its stream
				}
				if !in.ended {
					in.ended = true
					close(in.data)
				}
			case !in.ended:
				select {
				case in.data <- f.Payload:
				case <-in.done:
				}
			}
		default:
			// Hello/Response frames are never sent to the agent; ignore them.
		}
	}
}

// shutdown kills everything still running: the host is gone.
func (s *server) shutdown() {
	s.mu.Lock()
	for pr := range s.peers {
		if pr.conn != nil {
			_ = pr.conn.Close()
		}
		pr.mu.Lock()
		for _, in := range pr.reqs {
			in.cancel()
		}
		pr.mu.Unlock()
	}
	for _, p := range s.procs {
		p.kill()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
}

type codedError struct {
	code string
	msg  string
}

func (e *codedError) Error() string { return e.msg }

func invalidf(format string, a ...any) error {
	return &codedError{CodeInvalid, fmt.Sprintf(format, a...)}
}

func notFoundf(format string, a ...any) error {
	return &codedError{CodeNotFound, fmt.Sprintf(format, a...)}
}

func errResponse(err error) Response {
	var ce *codedError
	if errors.As(err, &ce) {
		return Response{Code: ce.code, Err: ce.msg}
	}
	if errors.Is(err, os.ErrNotExist) {
		return Response{Code: CodeNotFound, Err: err.Error()}
	}
	return Response{Code: CodeFailed, Err: err.Error()}
}

func (s *server) handle(ctx context.Context, p *peer, id uint32, req *Request, data <-chan []byte) Response {
	var err error
	var resp Response
	switch req.Op {
	case OpPing:
	case OpExec:
		var r *ExecResult
		r, err = s.execForeground(ctx, req.Exec)
		resp.Exec = r
	case OpStart:
		var p *ProcInfo
		p, err = s.startBackground(req.Exec)
		resp.Proc = p
	case OpPoll:
		var p *ProcInfo
		p, err = s.poll(req.Proc)
		resp.Proc = p
	case OpWait:
		var p *ProcInfo
		p, err = s.wait(ctx, req.Proc, time.Duration(req.TimeoutNS))
		resp.Proc = p
	case OpKill:
		err = s.killProc(req.Proc)
	case OpStdin:
		err = s.writeStdin(req.Proc, req.Data, req.Close)
	case OpList:
		resp.Procs = s.list()
	case OpKillAll:
		resp.Killed, err = killAll()
	case OpWrite:
		resp.Size, err = s.writeFile(ctx, req.Path, req.Mode, data)
	case OpRead:
		resp.Size, err = s.readFile(ctx, p, id, req.Path)
	case OpUpload:
		err = s.upload(ctx, req.Path, data)
	case OpDownload:
		resp.Size, err = s.download(ctx, p, id, req.Path)
	case OpPipe:
		var r *ExecResult
		r, err = s.pipe(ctx, p, id, req.Exec, data)
		resp.Exec = r
	case OpReset:
		resp.Reset, err = s.reset(ctx, p, id, req)
	case OpListen:
		err = s.listen(ctx, p, id, req.Port)
	case OpAccept:
		err = s.accept(ctx, p, id, req.Listener, data)
	case OpDial:
		err = s.dialLoopback(ctx, p, id, req.Port, data)
	default:
		err = invalidf("unknown op %q", req.Op)
	}
	if err != nil {
		return errResponse(err)
	}
	return resp
}

// pollable returns f, when it is a pipe (the stdio runc, the Docker shim
// and the kubelet hand the agent), set non-blocking and served by the
// runtime's poller; else f as it is. A blocking read(2) of stdin holds a
// thread in the kernel, and on the agent's one P the handler of the
// request it returned then waits until sysmon retakes the P from that
// thread: about 100 µs of every round trip on the runc backend's pipes
// (issue 20; sandbox/README.md). In the poller, the reading goroutine parks
// and the handler runs at once. Only these two descriptors change: the
// pipes' other ends, held by the host or the shim, are other open files.
//
// The new *os.File owns a duplicate of f's descriptor, never f's own: two
// files owning one number would close it twice (the second close, from a
// finalizer, hitting whatever reused the number since).
func pollable(f *os.File) *os.File {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return f
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return f
	}
	// O_NONBLOCK belongs to the open file both descriptors share.
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return f
	}
	return os.NewFile(uintptr(fd), f.Name())
}
