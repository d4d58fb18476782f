package sandbox

import (
	"context"
	"errors"
	"fmt"
)

// PoolScope is one client's share of a Pool that several clients use at
// once: rollout serve keeps one pool for all its jobs, and each job works
// through a scope of its own.
//
// Never-used warm sandboxes are interchangeable between scopes (nothing
// ran in them), so a scope takes any ready one of its spec, and the pool's
// MaxIdle and eviction span every scope. What a scope's rollouts used stays
// with it: with reuse, a sandbox reset in place is handed only to the next
// Acquire of the same scope, never to another client's rollout, and Close
// removes the scope's reset spares and withdraws its announced demand.
type PoolScope struct {
	p    *Pool
	opts ScopeOptions
	// closed, expected and demanding are guarded by p.mu. expected are
	// the warm sets the scope announced demand on; demanding, by reuse
	// key, those of them whose demand is not yet acquired (a few groups'
	// worth, where expected grows with every task of a long run).
	closed    bool
	expected  map[*WarmSet]struct{}
	demanding map[string]map[*WarmSet]struct{}
}

// demandChangedLocked files ws under sc.demanding by whether the scope
// still has demand on it.
func (sc *PoolScope) demandChangedLocked(ws *WarmSet) {
	if ws.demand[sc] > 0 {
		if sc.demanding == nil {
			sc.demanding = map[string]map[*WarmSet]struct{}{}
		}
		if sc.demanding[ws.reuseKey] == nil {
			sc.demanding[ws.reuseKey] = map[*WarmSet]struct{}{}
		}
		sc.demanding[ws.reuseKey][ws] = struct{}{}
		return
	}
	if m := sc.demanding[ws.reuseKey]; m != nil {
		delete(m, ws)
		if len(m) == 0 {
			delete(sc.demanding, ws.reuseKey)
		}
	}
}

// ScopeOptions configure a PoolScope.
type ScopeOptions struct {
	// Reuse asks for the scope's used sandboxes to be reset in place for
	// its own next rollouts (only when the pool was made with
	// PoolOptions.Reuse; otherwise every sandbox is single-use).
	Reuse bool
	// MaxDemand bounds the scope's announced demand not yet acquired,
	// across specs (0: unbounded): one client cannot have more sandboxes
	// started ahead for it than this (a job's limits.sandboxes).
	MaxDemand int
}

// Scope returns a new scope of p. Close it when the client is done.
func (p *Pool) Scope(opts ScopeOptions) *PoolScope {
	return &PoolScope{p: p, opts: opts}
}

// Create is Acquire through the scope (runner.Sandboxes): one of the
// scope's reset spares, a ready warm sandbox of spec, or a new one.
func (sc *PoolScope) Create(ctx context.Context, spec Spec) (Sandbox, error) {
	return sc.p.acquireIn(ctx, sc, spec)
}

// Expect announces n upcoming Creates of spec by this scope
// (runner.Expecter); the pool starts that many ahead of time.
func (sc *PoolScope) Expect(spec Spec, n int) error { return sc.p.expect(sc, spec, n) }

// Close ends the scope: its announced demand is withdrawn, and the
// sandboxes started for it that no one else announced are removed (those
// still starting once they are up: Close waits for that); its reset
// spares are removed, and sandboxes it still holds are removed, not
// reset, when they are closed. Later Creates fail with ErrClosed.
func (sc *PoolScope) Close(ctx context.Context) error {
	p := sc.p
	p.mu.Lock()
	if sc.closed {
		p.mu.Unlock()
		return nil
	}
	sc.closed = true
	var drop []Warmable
	for ws := range sc.expected {
		delete(ws.demand, sc)
		want := ws.base
		for _, n := range ws.demand {
			want += n
		}
		excess := len(ws.ready) + ws.filling - ws.discard - want
		for ; excess > 0 && len(ws.ready) > 0; excess-- {
			drop = append(drop, ws.ready[0])
			ws.ready = ws.ready[1:]
			p.idle--
		}
		ws.discard += max(excess, 0)
		metricPoolIdle.WithLabelValues(ws.spec.Image).Set(float64(len(ws.ready)))
	}
	sets := sc.expected
	sc.expected, sc.demanding = nil, nil
	for k, sp := range p.spares {
		if k.scope == sc {
			drop = append(drop, sp...)
			p.idle -= len(sp)
			delete(p.spares, k)
		}
	}
	p.changedLocked()
	p.mu.Unlock()
	var errs []error
	for _, sb := range drop {
		errs = append(errs, sb.Close(ctx))
	}
	return errors.Join(append(errs, p.waitDiscarded(ctx, sets))...)
}

// waitDiscarded waits until the sandboxes being started for sets that are
// to be discarded are gone.
func (p *Pool) waitDiscarded(ctx context.Context, sets map[*WarmSet]struct{}) error {
	for {
		p.mu.Lock()
		left := 0
		for ws := range sets {
			left += ws.discard + ws.removing
		}
		changed := p.changed
		closed := p.closed
		p.mu.Unlock()
		if left == 0 || closed {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("close pool scope: %d sandboxes still starting: %w", left, ctx.Err())
		}
	}
}
