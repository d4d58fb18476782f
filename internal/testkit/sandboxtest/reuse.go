package sandboxtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
)

// HostileRollout leaves behind everything a rollout could use to reach the
// next one: files in every writable mount (some locked away with mode 000,
// a FIFO, a symlink out), a changed file of the spec, a locked workdir, a
// message queue, a setsid'd daemon still writing, a background process and
// a shell session with its own cwd and variables.
func HostileRollout(t *testing.T, ctx context.Context, s sandbox.Sandbox) {
	t.Helper()
	script := strings.Join([]string{
		"set -e",
		"echo answer > /workspace/answer.txt",
		"echo tampered > /workspace/seed.txt",
		"echo x > /tmp/x && echo y > /dev/shm/y",
		"mkdir -p /tmp/locked/inner && echo z > /tmp/locked/inner/z && chmod 000 /tmp/locked/inner /tmp/locked",
		"mkfifo /tmp/fifo && ln -s /etc/passwd /tmp/passwd-link && ln /tmp/x /tmp/x-hard",
		"touch /dev/mqueue/leak",
		"setsid sh -c 'while true; do date >> /tmp/daemon.log; sleep 0.05; done' </dev/null >/dev/null 2>&1 &",
		"chmod 0500 /workspace",
	}, "\n")
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: script})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("hostile rollout: exit %d, %v, stderr %q", r.ExitCode, err, r.Stderr)
	}
	if _, err := s.Start(ctx, sandbox.ExecRequest{Command: "sleep 600"}); err != nil {
		t.Fatalf("background process: %v", err)
	}
	if r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "cd /tmp && export LEAK=1", Shell: true}); err != nil || r.ExitCode != 0 {
		t.Fatalf("shell session: exit %d, %v", r.ExitCode, err)
	}
}

// ReusePoolOn is reusePool over backend src.
func ReusePoolOn(t *testing.T, src sandbox.PoolSource, opts sandbox.PoolOptions) (context.Context, *sandbox.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	p := sandbox.NewPool(src, opts)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return ctx, p
}

func ReuseResetsEveryTrace(t *testing.T, src sandbox.PoolSource) {
	ctx, p := ReusePoolOn(t, src, sandbox.PoolOptions{Reuse: true, MaxIdle: 2})
	spec := sandbox.Spec{Image: Image, Limits: sandbox.Limits{ReadOnlyRoot: true},
		Files: []sandbox.File{{Path: "/workspace/seed.txt", Data: []byte("seed\n")}}}

	first, err := p.Acquire(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := first.Exec(ctx, sandbox.ExecRequest{Command: "stat -c '%a %u' /workspace /tmp /dev/shm /dev/mqueue"})
	if err != nil {
		t.Fatal(err)
	}
	HostileRollout(t, ctx, first)
	id := first.ID()
	if err := first.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := first.Exec(ctx, sandbox.ExecRequest{Command: "true"}); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("previous holder's call after Close: %v, want ErrClosed", err)
	}

	second, err := p.Acquire(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close(context.Background())
	if second.ID() != id {
		t.Fatalf("second sandbox is container %s, want the reset %s", second.ID(), id)
	}
	check := func(what, cmd, want string) {
		t.Helper()
		r, err := second.Exec(ctx, sandbox.ExecRequest{Command: cmd})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := string(r.Stdout); got != want {
			t.Errorf("%s after reset: %q, want %q (stderr %q)", what, got, want, r.Stderr)
		}
	}
	check("writable mounts", "ls -A /tmp /dev/shm /dev/mqueue /workspace", "/dev/mqueue:\n\n/dev/shm:\n\n/tmp:\n\n/workspace:\nseed.txt\n")
	check("spec file", "cat /workspace/seed.txt", "seed\n")
	check("mount roots", "stat -c '%a %u' /workspace /tmp /dev/shm /dev/mqueue", string(fresh.Stdout))
	// Neither the background sleep nor the daemon survived (the daemon
	// would also have written its log again).
	check("processes", "cat /proc/[0-9]*/comm 2>/dev/null | grep -c sleep", "0\n")
	check("the daemon's file stays gone", "sleep 0.2; ls -A /tmp", "")
	if ps, err := second.Processes(ctx); err != nil || len(ps) != 0 {
		t.Errorf("background processes after reset: %+v, %v", ps, err)
	}
	r, err := second.Exec(ctx, sandbox.ExecRequest{Command: `pwd; echo "[$LEAK]"`, Shell: true})
	if err != nil || string(r.Stdout) != "/workspace\n[]\n" {
		t.Errorf("shell session after reset: %q, %v", r.Stdout, err)
	}
	if _, err := second.Exec(ctx, sandbox.ExecRequest{Command: "cat /etc/passwd >/dev/null"}); err != nil {
		t.Errorf("the symlink's target: %v", err)
	}
}

// Task is the read-only-root spec of a task that places its own file.
func Task(name string) sandbox.Spec {
	return sandbox.Spec{Image: Image, Limits: sandbox.Limits{ReadOnlyRoot: true},
		Files: []sandbox.File{{Path: "/workspace/" + name + ".txt", Data: []byte(name)}}}
}

// Filling is how many sandboxes of spec the pool is starting.
func Filling(t *testing.T, p *sandbox.Pool, spec sandbox.Spec) int {
	t.Helper()
	st, err := p.Stats(spec)
	if err != nil {
		t.Fatal(err)
	}
	return st.Filling
}

func ReuseHeldSandboxesServeDemand(t *testing.T, src sandbox.PoolSource) {
	ctx, p := ReusePoolOn(t, src, sandbox.PoolOptions{Reuse: true, MaxIdle: 4, MaxUses: 1})
	var held []sandbox.Sandbox
	ids := map[string]bool{}
	for range 2 {
		s, err := p.Acquire(ctx, Task("a"))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
		ids[s.ID()] = true
	}
	if err := p.Expect(Task("b"), 2); err != nil {
		t.Fatal(err)
	}
	if n := Filling(t, p, Task("b")); n != 0 {
		t.Fatalf("%d sandboxes started for demand that the 2 held ones serve", n)
	}
	for _, s := range held {
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var reset []sandbox.Sandbox
	for range 2 {
		s, err := p.Acquire(ctx, Task("b"))
		if err != nil {
			t.Fatal(err)
		}
		reset = append(reset, s)
		if !ids[s.ID()] {
			t.Fatalf("task b got container %s, want one of the reset ones", s.ID()[:12])
		}
	}
	// Both were reset once: with MaxUses 1 neither comes back, so demand
	// announced now starts its own.
	if err := p.Expect(Task("c"), 1); err != nil {
		t.Fatal(err)
	}
	if n := Filling(t, p, Task("c")); n != 1 {
		t.Fatalf("%d sandboxes started for task c, want 1 (the held ones have no use left)", n)
	}
	for _, s := range reset {
		_ = s.Close(ctx)
	}
	st, err := p.Stats(Task("c"))
	if err != nil {
		t.Fatal(err)
	}
	if left := st.Returning; left != 0 {
		t.Fatalf("returning counts left after every holder closed: %d", left)
	}
}
