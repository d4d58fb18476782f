package docker

import (
	"context"
	"errors"
	"testing"

	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
)

// reusePool is a pool with reuse over the test backend, closed at the end
// of the test, and a context bounding the test.
func reusePool(t *testing.T, opts sandbox.PoolOptions) (context.Context, *sandbox.Pool) {
	t.Helper()
	return sandboxtest.ReusePoolOn(t, needDocker(t), opts)
}

func TestReuseResetsEveryTrace(t *testing.T) { sandboxtest.ReuseResetsEveryTrace(t, needDocker(t)) }

// A call of the previous holder still under way when it closes the sandbox
// is ended (its process killed) before the reset, and its answer cannot
// reach the next holder.
func TestReuseEndsCallsUnderWay(t *testing.T) {
	ctx, p := reusePool(t, sandbox.PoolOptions{Reuse: true, MaxIdle: 2})
	spec := sandbox.Spec{Image: sandboxtest.Image, Limits: sandbox.Limits{ReadOnlyRoot: true}}
	first, err := p.Acquire(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		r, err := first.Exec(ctx, sandbox.ExecRequest{Command: "echo started > /tmp/started; sleep 600; echo late > /workspace/late"})
		if err == nil && r.ExitCode == 0 {
			err = errors.New("the long command finished normally")
		}
		done <- err
	}()
	eventually(t, "the long command to start", func() bool {
		r, err := first.Exec(ctx, sandbox.ExecRequest{Command: "cat /tmp/started"})
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
	r, err := second.Exec(ctx, sandbox.ExecRequest{Command: "ls -A /tmp /workspace"})
	if err != nil || string(r.Stdout) != "/tmp:\n\n/workspace:\n" {
		t.Fatalf("after reset: %q, %v", r.Stdout, err)
	}
}

// A spec with a writable root is never reused: its container is removed.
func TestReuseOnlyReadOnlyRoot(t *testing.T) {
	ctx, p := reusePool(t, sandbox.PoolOptions{Reuse: true, MaxIdle: 2})
	spec := sandbox.Spec{Image: sandboxtest.Image}
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
	ctx, p := reusePool(t, sandbox.PoolOptions{Reuse: true, MaxIdle: 2, MaxUses: 2})
	spec := sandbox.Spec{Image: sandboxtest.Image, Limits: sandbox.Limits{ReadOnlyRoot: true}}
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

// A reset sandbox serves any spec that differs only in its files (each
// task of an env places its own): the next holder gets its own files and
// none of the previous spec's.
func TestReuseAcrossFiles(t *testing.T) {
	ctx, p := reusePool(t, sandbox.PoolOptions{Reuse: true, MaxIdle: 2})
	a, err := p.Acquire(ctx, sandboxtest.Task("a"))
	if err != nil {
		t.Fatal(err)
	}
	id := a.ID()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := p.Acquire(ctx, sandboxtest.Task("b"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	if b.ID() != id {
		t.Fatalf("task b got container %s, want the reset %s", b.ID()[:12], id[:12])
	}
	r, err := b.Exec(ctx, sandbox.ExecRequest{Command: "ls -A /workspace; cat /workspace/b.txt"})
	if err != nil || string(r.Stdout) != "b.txt\nb" {
		t.Fatalf("task b's workdir: %q, %v", r.Stdout, err)
	}
}

// Demand announced while the scope holds sandboxes that come back reset
// (a prepared group waiting for a running one to end) starts nothing:
// they serve it. A held sandbox with no use left does not count.
func TestReuseHeldSandboxesServeDemand(t *testing.T) {
	sandboxtest.ReuseHeldSandboxesServeDemand(t, needDocker(t))
}

// A full pool keeps a reset sandbox, which serves the scope's next rollout
// of any task, over a never-used one that no one announced.
func TestReuseSpareOutranksSurplus(t *testing.T) {
	ctx, p := reusePool(t, sandbox.PoolOptions{Reuse: true, MaxIdle: 2})
	use := func(name string) sandbox.Sandbox {
		t.Helper()
		s, err := p.Acquire(ctx, sandboxtest.Task(name))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	closeIt := func(s sandbox.Sandbox) {
		t.Helper()
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A sandbox started ahead for task c, ready; a spare from task a.
	if err := p.Expect(sandboxtest.Task("c"), 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the warm sandbox of task c", func() bool { return p.Ready(sandboxtest.Task("c")) == 1 })
	a := use("a")
	closeIt(a)
	// Task c's rollout takes the spare (spares go first): c's warm one is
	// now wanted by no one. Another spare fills the pool.
	c := use("c")
	if c.ID() != a.ID() || p.Ready(sandboxtest.Task("c")) != 1 {
		t.Fatalf("task c got %s (spare %s), %d warm left; want the spare and 1", c.ID()[:12], a.ID()[:12], p.Ready(sandboxtest.Task("c")))
	}
	e := use("e")
	closeIt(e)
	closeIt(c)
	if n := p.Ready(sandboxtest.Task("c")); n != 0 {
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
	ctx, p := reusePool(t, sandbox.PoolOptions{Reuse: true, MaxIdle: 4})
	a, err := p.Acquire(ctx, sandboxtest.Task("a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Expect(sandboxtest.Task("b"), 1); err != nil {
		t.Fatal(err)
	}
	if n := sandboxtest.Filling(t, p, sandboxtest.Task("b")); n != 0 {
		t.Fatalf("%d sandboxes started for demand the held one serves", n)
	}
	if _, err := d.Client().ContainerKill(ctx, a.ID(), client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the killed sandbox's channel to break", func() bool {
		_, err := a.Exec(ctx, sandbox.ExecRequest{Command: "true"})
		return err != nil
	})
	_ = a.Close(ctx)
	eventually(t, "a sandbox for task b", func() bool {
		return sandboxtest.Filling(t, p, sandboxtest.Task("b"))+p.Ready(sandboxtest.Task("b")) == 1
	})
	b, err := p.Acquire(ctx, sandboxtest.Task("b"))
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
	ctx, p := reusePool(t, sandbox.PoolOptions{Reuse: true, MaxIdle: 8})
	for range 2 {
		s, err := p.Acquire(ctx, sandboxtest.Task("a"))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
	}
	for _, name := range []string{"b", "c"} {
		if err := p.Expect(sandboxtest.Task(name), 2); err != nil {
			t.Fatal(err)
		}
	}
	started := func() int {
		return sandboxtest.Filling(t, p, sandboxtest.Task("b")) + p.Ready(sandboxtest.Task("b")) + sandboxtest.Filling(t, p, sandboxtest.Task("c")) + p.Ready(sandboxtest.Task("c"))
	}
	if n := started(); n != 2 {
		t.Fatalf("%d sandboxes started for demand of 4 with 2 held, want 2", n)
	}
	// A third task draws on what is left: nothing.
	if err := p.Expect(sandboxtest.Task("d"), 1); err != nil {
		t.Fatal(err)
	}
	if n := started() + sandboxtest.Filling(t, p, sandboxtest.Task("d")) + p.Ready(sandboxtest.Task("d")); n != 3 {
		t.Fatalf("%d sandboxes started for demand of 5 with 2 held, want 3", n)
	}
}

// The scope keeps only the sets whose demand is still open in its index,
// so that counting cover stays as cheap as the few groups announced ahead
// however many tasks a long run has gone through.
func TestScopeForgetsAcquiredDemand(t *testing.T) {
	ctx, p := reusePool(t, sandbox.PoolOptions{Reuse: true, MaxIdle: 4})
	open := func() int {
		st, err := p.Stats(sandbox.Spec{Image: sandboxtest.Image})
		if err != nil {
			t.Fatal(err)
		}
		return st.Demanding
	}
	for _, name := range []string{"a", "b"} {
		if err := p.Expect(sandboxtest.Task(name), 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := open(); n != 2 {
		t.Fatalf("%d sets with open demand, want 2", n)
	}
	for _, name := range []string{"a", "b"} {
		s, err := p.Acquire(ctx, sandboxtest.Task(name))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
	}
	if n := open(); n != 0 {
		t.Fatalf("%d sets with open demand after every announced sandbox was acquired, want 0", n)
	}
}
