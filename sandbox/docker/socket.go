package docker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/agent"
)

// The socket channel (local engines): the host listens on a unix socket in
// a per-sandbox directory (0700, owned by the host user) that is
// bind-mounted read-only into the container at sockInCtr; the agent (root
// in the container) connects to it at start-up and serves the same framed
// protocol there. Calls then go host → agent directly instead of host →
// dockerd → containerd-shim → agent stdin. The attach stream stays open: it
// is the sandbox's lifetime (owner binding, sandbox/host/owner.go) and the fallback when
// the agent cannot connect (remote engine, a host user the container's root
// cannot act for). See docs/security.md ("The socket channel").

// Channel modes (Options.Channel).
const (
	ChannelAuto   = ""       // socket on local engines with bind delivery, else attach
	ChannelAttach = "attach" // always the attach stream
)

const (
	sockInCtr   = "/.rollout/run"
	sockName    = "agent.sock"
	sockAccept  = 5 * time.Second // the agent connected before its stdin hello: accept is immediate
	sockStaleAt = time.Hour       // leftover instance directories older than this are removed
)

// socketRoot is where the backend keeps its per-sandbox socket
// directories: a tmpfs under /run for root, else the temp dir, in a
// directory of this user's only.
func socketRoot() string {
	if os.Geteuid() == 0 {
		return "/run/rollout-sandbox"
	}
	return filepath.Join(os.TempDir(), "rollout-sandbox-"+strconv.Itoa(os.Geteuid()))
}

// prepareSocketRoot creates root (0700), refuses one that is not a
// directory of this user's (a planted symlink in a shared temp dir), and
// removes instance directories left by crashed processes.
func prepareSocketRoot(root string) error {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(root)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is not a directory owned by uid %d", root, os.Geteuid())
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(root, 0o700); err != nil {
			return err
		}
	}
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > sockStaleAt {
			_ = os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
	return nil
}

// sockListener is one sandbox's listener and directory.
type sockListener struct {
	dir string
	ln  *net.UnixListener
}

// listen creates the sandbox's directory and listener. The directory is
// mode 0700: inside the container only root (the agent) can reach the
// socket, not the sandbox user.
func (d *Docker) listen(name string) (*sockListener, error) {
	inst := filepath.Join(d.sockRoot, d.opts.Instance)
	if err := os.MkdirAll(inst, 0o700); err != nil {
		return nil, err
	}
	// The container name's random tail keeps the path short: a unix
	// socket path has at most 107 bytes.
	dir := filepath.Join(inst, name[max(0, len(name)-12):])
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, sockName), Net: "unix"})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	return &sockListener{dir: dir, ln: ln}, nil
}

// close stops listening and removes the directory. A connection already
// accepted stays open; the container's bind mount keeps the (now
// unlinked) directory until it exits.
func (l *sockListener) close() {
	if l == nil {
		return
	}
	_ = l.ln.Close()
	_ = os.RemoveAll(l.dir)
}

// accept takes the agent's connection and checks its hello against the
// one from the attach stream (same agent process).
func (l *sockListener) accept(ctx context.Context, want agent.Hello) (*sandbox.Conn, net.Conn, error) {
	_ = l.ln.SetDeadline(time.Now().Add(sockAccept))
	c, err := l.ln.AcceptUnix()
	if err != nil {
		return nil, nil, fmt.Errorf("accept: %w", err)
	}
	// Buffered: a frame's header and payload come in one read.
	cn := sandbox.NewConn(bufio.NewReaderSize(c, 64<<10), c)
	t := time.NewTimer(sockAccept)
	defer t.Stop()
	fail := func(err error) (*sandbox.Conn, net.Conn, error) {
		_ = c.Close()
		<-cn.Done()
		return nil, nil, err
	}
	select {
	case h := <-cn.Hello:
		if h.PID != want.PID || h.Version != want.Version {
			return fail(fmt.Errorf("hello on the socket (pid %d, version %d) does not match the attach stream's (pid %d, version %d)", h.PID, h.Version, want.PID, want.Version))
		}
	case <-cn.Done():
		return fail(errors.New("socket closed before the agent's hello"))
	case <-t.C:
		return fail(errors.New("no hello on the socket"))
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	return cn, c, nil
}
