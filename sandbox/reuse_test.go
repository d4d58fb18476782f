package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
)

// hostileRollout leaves behind everything a rollout could use to reach the
// next one: files in every writable mount (some locked away with mode 000,
// a FIFO, a symlink out), a changed file of the spec, a locked workdir, a
// message queue, a setsid'd daemon still writing, a background process and
// a shell session with its own cwd and variables.
func hostileRollout(t *testing.T, ctx context.Context, s Sandbox) {
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
	r, err := s.Exec(ctx, ExecRequest{Command: script})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("hostile rollout: exit %d, %v, stderr %q", r.ExitCode, err, r.Stderr)
	}
	if _, err := s.Start(ctx, ExecRequest{Command: "sleep 600"}); err != nil {
		t.Fatalf("background process: %v", err)
	}
	if r, err := s.Exec(ctx, ExecRequest{Command: "cd /tmp && export LEAK=1", Shell: true}); err != nil || r.ExitCode != 0 {
		t.Fatalf("shell session: exit %d, %v", r.ExitCode, err)
	}
}

// reusePool is a pool with reuse over the test backend, closed at the end
// of the test, and a context bounding the test.
func reusePool(t *testing.T, opts PoolOptions) (context.Context, *Pool) {
	t.Helper()
	return reusePoolOn(t, needDocker(t), opts)
}

// reusePoolOn is reusePool over backend src.
func reusePoolOn(t *testing.T, src poolSource, opts PoolOptions) (context.Context, *Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	p := NewPool(src, opts)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return ctx, p
}

func TestReuseResetsEveryTrace(t *testing.T) { testReuseResetsEveryTrace(t, needDocker(t)) }

// The runc backend's sandboxes reset in place just as well.
func TestRuncReuseResetsEveryTrace(t *testing.T) { testReuseResetsEveryTrace(t, needRunc(t)) }

func testReuseResetsEveryTrace(t *testing.T, src poolSource) {
	ctx, p := reusePoolOn(t, src, PoolOptions{Reuse: true, MaxIdle: 2})
	spec := Spec{Image: testImage, Limits: Limits{ReadOnlyRoot: true},
		Files: []File{{Path: "/workspace/seed.txt", Data: []byte("seed\n")}}}

	first, err := p.Acquire(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := first.Exec(ctx, ExecRequest{Command: "stat -c '%a %u' /workspace /tmp /dev/shm /dev/mqueue"})
	if err != nil {
		t.Fatal(err)
	}
	hostileRollout(t, ctx, first)
	id := first.ID()
	if err := first.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := first.Exec(ctx, ExecRequest{Command: "true"}); !errors.Is(err, ErrClosed) {
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
		r, err := second.Exec(ctx, ExecRequest{Command: cmd})
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
	r, err := second.Exec(ctx, ExecRequest{Command: `pwd; echo "[$LEAK]"`, Shell: true})
	if err != nil || string(r.Stdout) != "/workspace\n[]\n" {
		t.Errorf("shell session after reset: %q, %v", r.Stdout, err)
	}
	if _, err := second.Exec(ctx, ExecRequest{Command: "cat /etc/passwd >/dev/null"}); err != nil {
		t.Errorf("the symlink's target: %v", err)
	}
}

// A call of the previous holder still under way when it closes the sandbox
// is ended (its process killed) before the reset, and its answer cannot
// reach the next holder.
func TestReuseEndsCallsUnderWay(t *testing.T) {
	ctx, p := reusePool(t, PoolOptions{Reuse: true, MaxIdle: 2})
	spec := Spec{Image: testImage, Limits: Limits{ReadOnlyRoot: true}}
	first, err := p.Acquire(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		r, err := first.Exec(ctx, ExecRequest{Command: "echo started > /tmp/started; sleep 600; echo late > /workspace/late"})
		if err == nil && r.ExitCode == 0 {
			err = errors.New("the long command finished normally")
		}
		done <- err
	}()
	eventually(t, "the long command to start", func() bool {
		r, err := first.Exec(ctx, ExecRequest{Command: "cat /tmp/started"})
		return err == nil && r.ExitCode == 0
	})
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	second, err := p.Acquire(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close(context.Background())
	if second.ID() != first.ID() {
		t.Fatalf("not reset in place: %s then %s", first.ID()[:12], second.ID()[:12])
	}
	r, err := second.Exec(ctx, ExecRequest{Command: "ls -A /tmp /workspace"})
	if err != nil || string(r.Stdout) != "/tmp:\n\n/workspace:\n" {
		t.Fatalf("after reset: %q, %v", r.Stdout, err)
	}
}

// A spec with a writable root is never reused: its container is removed.
func TestReuseOnlyReadOnlyRoot(t *testing.T) {
	ctx, p := reusePool(t, PoolOptions{Reuse: true, MaxIdle: 2})
	spec := Spec{Image: testImage}
	first, err := p.Acquire(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	id := first.ID()
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := p.Acquire(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close(context.Background())
	if second.ID() == id {
		t.Fatal("a writable-root sandbox was handed out again")
	}
	d := testDocker
	d.mu.Lock()
	_, live := d.live[id]
	d.mu.Unlock()
	if live {
		t.Fatal("the writable-root sandbox is still live after Close")
	}
}

// MaxUses bounds how often one container is reset.
func TestReuseMaxUses(t *testing.T) {
	ctx, p := reusePool(t, PoolOptions{Reuse: true, MaxIdle: 2, MaxUses: 2})
	spec := Spec{Image: testImage, Limits: Limits{ReadOnlyRoot: true}}
	var ids []string
	for range 4 {
		s, err := p.Acquire(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID())
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Uses 1–3 are one container (two resets), the fourth a new one.
	if ids[0] != ids[1] || ids[1] != ids[2] || ids[2] == ids[3] {
		t.Fatalf("containers per use: %v", ids)
	}
}

// task is the read-only-root spec of a task that places its own file.
func task(name string) Spec {
	return Spec{Image: testImage, Limits: Limits{ReadOnlyRoot: true},
		Files: []File{{Path: "/workspace/" + name + ".txt", Data: []byte(name)}}}
}

// A reset sandbox serves any spec that differs only in its files (each
// task of an env places its own): the next holder gets its own files and
// none of the previous spec's.
func TestReuseAcrossFiles(t *testing.T) {
	ctx, p := reusePool(t, PoolOptions{Reuse: true, MaxIdle: 2})
	a, err := p.Acquire(ctx, task("a"))
	if err != nil {
		t.Fatal(err)
	}
	id := a.ID()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := p.Acquire(ctx, task("b"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	if b.ID() != id {
		t.Fatalf("task b got container %s, want the reset %s", b.ID()[:12], id[:12])
	}
	r, err := b.Exec(ctx, ExecRequest{Command: "ls -A /workspace; cat /workspace/b.txt"})
	if err != nil || string(r.Stdout) != "b.txt\nb" {
		t.Fatalf("task b's workdir: %q, %v", r.Stdout, err)
	}
}

// filling is how many sandboxes of spec the pool is starting.
func filling(t *testing.T, p *Pool, spec Spec) int {
	t.Helper()
	key, err := p.Fingerprint(spec)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if ws := p.sets[key]; ws != nil {
		return ws.filling
	}
	return 0
}

// Demand announced while the scope holds sandboxes that come back reset
// (a prepared group waiting for a running one to end) starts nothing:
// they serve it. A held sandbox with no use left does not count.
func TestReuseHeldSandboxesServeDemand(t *testing.T) {
	testReuseHeldSandboxesServeDemand(t, needDocker(t))
}

// The runc backend's pool counts them the same way.
func TestRuncReuseHeldSandboxesServeDemand(t *testing.T) {
	testReuseHeldSandboxesServeDemand(t, needRunc(t))
}

func testReuseHeldSandboxesServeDemand(t *testing.T, src poolSource) {
	ctx, p := reusePoolOn(t, src, PoolOptions{Reuse: true, MaxIdle: 4, MaxUses: 1})
	var held []Sandbox
	ids := map[string]bool{}
	for range 2 {
		s, err := p.Acquire(ctx, task("a"))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
		ids[s.ID()] = true
	}
	if err := p.Expect(task("b"), 2); err != nil {
		t.Fatal(err)
	}
	if n := filling(t, p, task("b")); n != 0 {
		t.Fatalf("%d sandboxes started for demand that the 2 held ones serve", n)
	}
	for _, s := range held {
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var reset []Sandbox
	for range 2 {
		s, err := p.Acquire(ctx, task("b"))
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
	if err := p.Expect(task("c"), 1); err != nil {
		t.Fatal(err)
	}
	if n := filling(t, p, task("c")); n != 1 {
		t.Fatalf("%d sandboxes started for task c, want 1 (the held ones have no use left)", n)
	}
	for _, s := range reset {
		_ = s.Close(ctx)
	}
	p.mu.Lock()
	left := len(p.returning)
	p.mu.Unlock()
	if left != 0 {
		t.Fatalf("returning counts left after every holder closed: %d", left)
	}
}

// A full pool keeps a reset sandbox, which serves the scope's next rollout
// of any task, over a never-used one that no one announced.
func TestReuseSpareOutranksSurplus(t *testing.T) {
	ctx, p := reusePool(t, PoolOptions{Reuse: true, MaxIdle: 2})
	use := func(name string) Sandbox {
		t.Helper()
		s, err := p.Acquire(ctx, task(name))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	closeIt := func(s Sandbox) {
		t.Helper()
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A sandbox started ahead for task c, ready; a spare from task a.
	if err := p.Expect(task("c"), 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the warm sandbox of task c", func() bool { return p.Ready(task("c")) == 1 })
	a := use("a")
	closeIt(a)
	// Task c's rollout takes the spare (spares go first): c's warm one is
	// now wanted by no one. Another spare fills the pool.
	c := use("c")
	if c.ID() != a.ID() || p.Ready(task("c")) != 1 {
		t.Fatalf("task c got %s (spare %s), %d warm left; want the spare and 1", c.ID()[:12], a.ID()[:12], p.Ready(task("c")))
	}
	e := use("e")
	closeIt(e)
	closeIt(c)
	if n := p.Ready(task("c")); n != 0 {
		t.Fatalf("the surplus warm sandbox is still ready (%d) while the pool is full", n)
	}
	want := map[string]bool{a.ID(): true, e.ID(): true}
	for range 2 {
		d := use("d")
		defer d.Close(context.Background())
		if !want[d.ID()] {
			t.Fatalf("task d got container %s, want one of the reset ones", d.ID()[:12])
		}
		delete(want, d.ID())
	}
}

// A held sandbox that cannot come back (its container died) no longer
// stands for the demand it was counted against: closing it starts a
// sandbox for that demand, of another task's spec.
func TestReuseLostSandboxRefillsDemand(t *testing.T) {
	d := needDocker(t)
	ctx, p := reusePool(t, PoolOptions{Reuse: true, MaxIdle: 4})
	a, err := p.Acquire(ctx, task("a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Expect(task("b"), 1); err != nil {
		t.Fatal(err)
	}
	if n := filling(t, p, task("b")); n != 0 {
		t.Fatalf("%d sandboxes started for demand the held one serves", n)
	}
	if _, err := d.Client().ContainerKill(ctx, a.ID(), client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the killed sandbox's channel to break", func() bool {
		_, err := a.Exec(ctx, ExecRequest{Command: "true"})
		return err != nil
	})
	_ = a.Close(ctx)
	eventually(t, "a sandbox for task b", func() bool { return filling(t, p, task("b"))+p.Ready(task("b")) == 1 })
	b, err := p.Acquire(ctx, task("b"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	if b.ID() == a.ID() {
		t.Fatalf("task b got the killed container")
	}
}

// The sandboxes a scope holds stand for the demand of one task each, not
// of every task they could serve: with two held, demand for two of task b
// and two of task c starts two (whichever set the held ones are counted
// against), not none.
func TestReuseHeldSandboxesCountOnce(t *testing.T) {
	ctx, p := reusePool(t, PoolOptions{Reuse: true, MaxIdle: 8})
	for range 2 {
		s, err := p.Acquire(ctx, task("a"))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
	}
	for _, name := range []string{"b", "c"} {
		if err := p.Expect(task(name), 2); err != nil {
			t.Fatal(err)
		}
	}
	started := func() int {
		return filling(t, p, task("b")) + p.Ready(task("b")) + filling(t, p, task("c")) + p.Ready(task("c"))
	}
	if n := started(); n != 2 {
		t.Fatalf("%d sandboxes started for demand of 4 with 2 held, want 2", n)
	}
	// A third task draws on what is left: nothing.
	if err := p.Expect(task("d"), 1); err != nil {
		t.Fatal(err)
	}
	if n := started() + filling(t, p, task("d")) + p.Ready(task("d")); n != 3 {
		t.Fatalf("%d sandboxes started for demand of 5 with 2 held, want 3", n)
	}
}

// The scope keeps only the sets whose demand is still open in its index,
// so that counting cover stays as cheap as the few groups announced ahead
// however many tasks a long run has gone through.
func TestScopeForgetsAcquiredDemand(t *testing.T) {
	ctx, p := reusePool(t, PoolOptions{Reuse: true, MaxIdle: 4})
	open := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		n := 0
		for _, sets := range p.root.demanding {
			n += len(sets)
		}
		return n
	}
	for _, name := range []string{"a", "b"} {
		if err := p.Expect(task(name), 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := open(); n != 2 {
		t.Fatalf("%d sets with open demand, want 2", n)
	}
	for _, name := range []string{"a", "b"} {
		s, err := p.Acquire(ctx, task(name))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
	}
	if n := open(); n != 0 {
		t.Fatalf("%d sets with open demand after every announced sandbox was acquired, want 0", n)
	}
}
