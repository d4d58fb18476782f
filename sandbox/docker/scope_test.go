package docker

import (
	"context"
	"errors"
	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
	"testing"
	"time"
)

// isLive says whether the test backend still holds the container.
func isLive(id string) bool {
	d := testDocker
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.live[id]
	return ok
}

// Scopes of one pool (rollout serve's jobs): a sandbox reset in place goes
// back only to the scope that used it; closing a scope removes its spares
// and the sandboxes it still holds, and leaves the other scopes' alone.
func TestPoolScopesKeepResetSandboxes(t *testing.T) {
	ctx, p := reusePool(t, sandbox.PoolOptions{Reuse: true, MaxIdle: 4})
	spec := sandbox.Spec{Image: sandboxtest.Image, Limits: sandbox.Limits{ReadOnlyRoot: true}}
	a, b := p.Scope(sandbox.ScopeOptions{Reuse: true}), p.Scope(sandbox.ScopeOptions{Reuse: true})
	t.Cleanup(func() { _ = a.Close(context.Background()); _ = b.Close(context.Background()) })

	sa, err := a.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	used := sa.ID()
	if err := sa.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !isLive(used) {
		t.Fatal("scope a's sandbox was removed, not reset in place")
	}
	sb, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID() == used {
		t.Fatal("scope b was handed the sandbox scope a used")
	}
	again, err := a.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID() != used {
		t.Fatalf("scope a got %s, want its reset sandbox %s", again.ID()[:12], used[:12])
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	bSpare := sb.ID()

	// a ends while it holds a sandbox: the sandbox is removed when closed,
	// not reset; b's spare stays.
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := again.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if isLive(used) {
		t.Fatal("a sandbox closed after its scope ended was kept")
	}
	if !isLive(bSpare) {
		t.Fatal("closing scope a removed scope b's spare")
	}
	if _, err := a.Create(ctx, spec); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("Create after the scope's Close: %v, want ErrClosed", err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if isLive(bSpare) {
		t.Fatal("closing scope b left its reset spare")
	}
}

// A scope without reuse gets single-use sandboxes from a pool that reuses
// for others.
func TestPoolScopeWithoutReuse(t *testing.T) {
	ctx, p := reusePool(t, sandbox.PoolOptions{Reuse: true, MaxIdle: 4})
	spec := sandbox.Spec{Image: sandboxtest.Image, Limits: sandbox.Limits{ReadOnlyRoot: true}}
	sc := p.Scope(sandbox.ScopeOptions{})
	t.Cleanup(func() { _ = sc.Close(context.Background()) })
	s, err := sc.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if isLive(s.ID()) {
		t.Fatal("a scope without reuse had its sandbox reset and kept")
	}
}

// A scope's announced demand starts sandboxes ahead; when the scope ends
// unused, the ones no other scope announced are removed.
func TestPoolScopeCloseWithdrawsDemand(t *testing.T) {
	ctx, p := reusePool(t, sandbox.PoolOptions{MaxIdle: 4})
	spec := sandbox.Spec{Image: sandboxtest.Image}
	a, b := p.Scope(sandbox.ScopeOptions{}), p.Scope(sandbox.ScopeOptions{})
	t.Cleanup(func() { _ = a.Close(context.Background()); _ = b.Close(context.Background()) })
	if err := a.Expect(spec, 2); err != nil {
		t.Fatal(err)
	}
	if err := b.Expect(spec, 1); err != nil {
		t.Fatal(err)
	}
	for p.Ready(spec) < 3 {
		if ctx.Err() != nil {
			t.Fatalf("%d of 3 announced sandboxes ready", p.Ready(spec))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := p.Ready(spec); n != 1 {
		t.Fatalf("after scope a ended, %d ready; want 1, scope b's", n)
	}
	s, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if n := p.Ready(spec); n != 0 {
		t.Fatalf("after scope b took its sandbox, %d ready; want 0", n)
	}
}

// A scope that ends while its announced sandboxes are still starting waits
// for them and removes them: nothing started for it outlives its Close.
func TestPoolScopeCloseDiscardsStarting(t *testing.T) {
	ctx, p := reusePool(t, sandbox.PoolOptions{MaxIdle: 4})
	spec := sandbox.Spec{Image: sandboxtest.Image, Env: map[string]string{"SCOPE": "discard"}}
	live := func() int {
		testDocker.mu.Lock()
		defer testDocker.mu.Unlock()
		return len(testDocker.live)
	}
	before := live()
	sc := p.Scope(sandbox.ScopeOptions{})
	if err := sc.Expect(spec, 3); err != nil {
		t.Fatal(err)
	}
	if err := sc.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := p.Ready(spec); n != 0 {
		t.Fatalf("%d ready after the scope closed, want 0", n)
	}
	if n := live(); n != before {
		t.Fatalf("%d sandboxes live after the scope closed, %d before it announced 3", n, before)
	}
	// The pool still serves others: a new scope's announced sandbox is
	// started and handed out.
	other := p.Scope(sandbox.ScopeOptions{})
	defer other.Close(context.Background())
	if err := other.Expect(spec, 1); err != nil {
		t.Fatal(err)
	}
	s, err := other.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close(ctx)
}

// MaxDemand bounds what a scope has started ahead for it across specs: a
// job cannot take more of the shared pool than its own limit.
func TestPoolScopeMaxDemand(t *testing.T) {
	ctx, p := reusePool(t, sandbox.PoolOptions{MaxIdle: 8})
	a := sandbox.Spec{Image: sandboxtest.Image, Env: map[string]string{"SCOPE": "max-a"}}
	b := sandbox.Spec{Image: sandboxtest.Image, Env: map[string]string{"SCOPE": "max-b"}}
	sc := p.Scope(sandbox.ScopeOptions{MaxDemand: 3})
	t.Cleanup(func() { _ = sc.Close(context.Background()) })
	if err := sc.Expect(a, 2); err != nil {
		t.Fatal(err)
	}
	if err := sc.Expect(b, 5); err != nil {
		t.Fatal(err)
	}
	started := func(spec sandbox.Spec) int {
		st, err := p.Stats(spec)
		if err != nil {
			t.Fatal(err)
		}
		return st.Ready + st.Filling
	}
	if na, nb := started(a), started(b); na != 2 || nb != 1 {
		t.Fatalf("started ahead: %d of a, %d of b; want 2 and 1 (MaxDemand 3)", na, nb)
	}
	// Taking one frees room for one more announced.
	for p.Ready(a) < 1 {
		if ctx.Err() != nil {
			t.Fatal("no announced sandbox became ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	s, err := sc.Create(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if err := sc.Expect(b, 1); err != nil {
		t.Fatal(err)
	}
	if nb := started(b); nb != 2 {
		t.Fatalf("after one acquire, %d of b started ahead; want 2", nb)
	}
}
