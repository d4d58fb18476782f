package docker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

// TestSocketChannel: on a local engine run by root, calls go over the
// socket; the sandbox user cannot reach the socket directory; the host
// directory is gone once the agent connected; the attach stream still
// binds the container's life (closing the sandbox removes it, and a
// broken socket is reported as a broken channel).
func TestSocketChannel(t *testing.T) {
	d := needDocker(t)
	if d.sockRoot == "" || os.Geteuid() != 0 {
		t.Skip("socket channel needs a local engine and a root host process")
	}
	s := newSandbox(t, sandbox.Spec{})
	ds := s.(*dockerSandbox)
	if ds.Transport() != "socket" {
		t.Fatalf("transport %q, want socket (agent stderr: %s)", ds.Transport(), ds.stderr.String())
	}
	ctx := context.Background()
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "ls /.rollout/run", MergeOutput: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode == 0 || !strings.Contains(strings.ToLower(string(r.Stdout)), "permission denied") {
		t.Fatalf("sandbox user listed the socket directory: exit %d, %q", r.ExitCode, r.Stdout)
	}
	// Nothing is left on the host: the directory was removed after accept.
	if _, err := os.Stat(filepath.Join(d.sockRoot, d.opts.Instance, ds.name[len(ds.name)-12:])); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket directory still on the host: %v", err)
	}
	// Both channels answer: the socket (calls) and the attach stream
	// (still open, the lifetime).
	if err := ds.attach.Broken(); err != nil {
		t.Fatalf("attach stream broken: %v", err)
	}
	r, err = s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"echo", "hi"}})
	if err != nil || string(r.Stdout) != "hi\n" {
		t.Fatalf("exec over socket: %v %q", err, r.Stdout)
	}
	// The socket closing (here from the host side) is a broken channel,
	// not a hang.
	_ = ds.sock.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.Exec(cctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("exec after the socket closed: %v, want ErrUnavailable", err)
	}
}

// TestAttachChannel: ChannelAttach keeps every call on the attach stream
// and the sandbox works the same.
func TestAttachChannel(t *testing.T) {
	needDocker(t)
	ctx := context.Background()
	d, err := New(ctx, Options{Options: host.Options{Instance: "attach-" + sandbox.RandomID(4), ReapInterval: -1}, Channel: ChannelAttach})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Close(ctx); err != nil {
			t.Error(err)
		}
	}()
	s, err := d.Create(ctx, sandbox.Spec{Image: sandboxtest.Image})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if tr := s.(*dockerSandbox).Transport(); tr != "attach" {
		t.Fatalf("transport %q, want attach", tr)
	}
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "ls -d /.rollout/run 2>&1; echo ok"})
	if err != nil || !strings.HasSuffix(string(r.Stdout), "ok\n") || strings.Contains(string(r.Stdout), "/.rollout/run\n") {
		t.Fatalf("exec: %v %q (no socket directory is mounted with ChannelAttach)", err, r.Stdout)
	}
	if _, err := New(ctx, Options{Channel: "pigeon"}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("bad channel: %v, want ErrInvalid", err)
	}
}
