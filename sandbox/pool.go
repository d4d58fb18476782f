package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// PoolOptions configure a warm pool. Zero values take defaults.
type PoolOptions struct {
	// MaxIdle bounds warm containers across all specs (default 64).
	MaxIdle int
	// Reuse resets a used sandbox in place and keeps it for the next
	// Acquire of the same spec instead of removing it, for specs with a
	// read-only root under runc on backends that can (Docker, runc;
	// reuse.go).
	// Other specs are single-use as without it.
	Reuse bool
	// MaxUses bounds the rollouts one container serves with Reuse
	// (default 100); then it is removed.
	MaxUses int
}

// Pool keeps started, never-used sandboxes per spec so that Acquire does
// not pay a container start. Warm sets are keyed by the spec's fingerprint
// (everything but Labels); a sandbox is never returned to the pool after
// use, unless PoolOptions.Reuse resets it in place. Pool implements Backend.
type Pool struct {
	d    PoolSource
	opts PoolOptions

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// root is the scope of the pool's own Acquire and Expect (a run's
	// single job); Scope gives others (rollout serve's jobs).
	root *PoolScope

	mu   sync.Mutex
	sets map[string]*WarmSet
	// spares are used sandboxes reset in place (PoolOptions.Reuse), by
	// scope and reuseKey: any spec of the same scope that differs only in
	// Files and Labels takes one, its own files placed at hand-out.
	spares map[spareKey][]Warmable
	// returning counts, by the same key, the sandboxes a reusing scope
	// holds that will come back as spares when closed (uses left), and
	// those being reset: they serve its announced demand, so refill starts
	// nothing for it (reuse.go).
	returning map[spareKey]int
	idle      int // ready + filling across sets
	closed    bool
	// changed is closed and replaced whenever a start finishes.
	changed chan struct{}

	resetsOK, resetsFailed atomic.Int64
}

// Resets counts the resets in place (PoolOptions.Reuse) so far: done, and
// failed (those containers were removed instead).
func (p *Pool) Resets() (ok, failed int64) { return p.resetsOK.Load(), p.resetsFailed.Load() }

type WarmSet struct {
	key      string
	reuseKey string // the spares it can take (reuse.go)
	spec     Spec
	base     int // Warm: kept ready at all times
	// demand is Expect's announced acquires not yet made, by scope.
	demand  map[*PoolScope]int
	ready   []Warmable
	filling int
	// discard counts the sandboxes being started that a closed scope
	// wanted and no one else does: they are removed once up (removing
	// counts those removals under way).
	discard, removing int
	waiters           []chan Warmable
}

var _ Backend = (*Pool)(nil)

// errAcquireClosed is Acquire's error once the pool is closed.
var errAcquireClosed = fmt.Errorf("acquire sandbox: %w: pool closed", ErrClosed)

// warmable is a sandbox a Pool can hold before handing it out.
type Warmable interface {
	Sandbox
	Broken() error
	SetPooled(bool)
	SetLabels(map[string]string)
	Touch()
}

// poolSource is a backend a Pool fills from (*Docker, *Kubernetes).
type PoolSource interface {
	Validate(spec *Spec) error
	// createWarm creates a sandbox; extraLabels go on the container or pod.
	// slot says whether the caller already holds its slot of slotSem();
	// block=false fails at once instead of waiting for the backend's own
	// admission (a warm fill never waits).
	CreateWarm(ctx context.Context, spec Spec, extraLabels map[string]string, slot SlotMode, block bool) (Warmable, error)
	// slotSem bounds the sandboxes the backend holds, warm ones included.
	SlotSem() *SlotSem
	Logger() *slog.Logger
}

// NewPool returns a pool creating through d. Close the pool before d.
func NewPool(d PoolSource, opts PoolOptions) *Pool {
	if opts.MaxIdle <= 0 {
		opts.MaxIdle = 64
	}
	if opts.MaxUses <= 0 {
		opts.MaxUses = 100
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{d: d, opts: opts, ctx: ctx, cancel: cancel, sets: map[string]*WarmSet{},
		spares: map[spareKey][]Warmable{}, returning: map[spareKey]int{}, changed: make(chan struct{})}
	p.root = &PoolScope{p: p, opts: ScopeOptions{Reuse: true}}
	return p
}

// Fingerprint identifies the container a spec produces (labels excluded):
// sandboxes of equal fingerprints are interchangeable before first use.
func (p *Pool) Fingerprint(spec Spec) (string, error) {
	if err := p.d.Validate(&spec); err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return fingerprint(spec)
}

// fingerprint hashes a validated spec, labels excluded.
func fingerprint(spec Spec) (string, error) {
	spec.Labels = nil
	b, err := json.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8]), nil
}

func (p *Pool) set(spec Spec) (*WarmSet, error) {
	key, err := p.Fingerprint(spec)
	if err != nil {
		return nil, err
	}
	ws := p.sets[key]
	if ws == nil {
		clean := spec
		clean.Labels = nil
		clean.Env = maps.Clone(spec.Env)
		ws = &WarmSet{key: key, spec: clean, demand: map[*PoolScope]int{}}
		ws.reuseKey = reuseKey(ws)
		p.sets[key] = ws
	}
	return ws, nil
}

// Warm keeps n started sandboxes of spec ready at all times.
func (p *Pool) Warm(spec Spec, n int) error {
	if n < 0 {
		return fmt.Errorf("warm pool: %w: negative size %d", ErrInvalid, n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("warm pool: %w", ErrClosed)
	}
	ws, err := p.set(spec)
	if err != nil {
		return err
	}
	ws.base = n
	p.refillLocked(ws)
	return nil
}

// Expect announces n upcoming Acquires of spec (a GRPO group of G rollouts
// on one image): that many sandboxes are started ahead of time.
func (p *Pool) Expect(spec Spec, n int) error { return p.root.Expect(spec, n) }

func (p *Pool) expect(sc *PoolScope, spec Spec, n int) error {
	if n < 0 {
		return fmt.Errorf("warm pool: %w: negative demand %d", ErrInvalid, n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || sc.closed {
		return fmt.Errorf("warm pool: %w", ErrClosed)
	}
	ws, err := p.set(spec)
	if err != nil {
		return err
	}
	if m := sc.opts.MaxDemand; m > 0 {
		outstanding := 0
		for _, sets := range sc.demanding {
			for e := range sets {
				outstanding += e.demand[sc]
			}
		}
		n = min(n, max(m-outstanding, 0))
	}
	ws.demand[sc] += n
	if sc.expected == nil {
		sc.expected = map[*WarmSet]struct{}{}
	}
	sc.expected[ws] = struct{}{}
	sc.demandChangedLocked(ws)
	if p.reusable(ws.spec, sc) {
		// The new demand may take spares that another set of the scope
		// counted on (coverLocked): each of them starts what it now lacks.
		for o := range sc.demanding[ws.reuseKey] {
			if o != ws {
				p.refillLocked(o)
			}
		}
	}
	p.refillLocked(ws)
	return nil
}

// Ready is the number of warm sandboxes of spec waiting.
func (p *Pool) Ready(spec Spec) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	key, err := p.Fingerprint(spec)
	if err != nil || p.sets[key] == nil {
		return 0
	}
	return len(p.sets[key].ready)
}

// Create is Acquire (Backend).
func (p *Pool) Create(ctx context.Context, spec Spec) (Sandbox, error) { return p.Acquire(ctx, spec) }

// Acquire hands out a warm sandbox of spec, waits for one being started,
// or creates one. Every container counts against the backend's
// MaxContainers, warm ones included: when none is free, an idle warm
// sandbox of another spec is removed to make room, else Acquire waits for
// a slot (a hard bound, never exceeded).
func (p *Pool) Acquire(ctx context.Context, spec Spec) (Sandbox, error) {
	return p.acquireIn(ctx, p.root, spec)
}

func (p *Pool) acquireIn(ctx context.Context, sc *PoolScope, spec Spec) (Sandbox, error) {
	start := time.Now()
	p.mu.Lock()
	if p.closed || sc.closed {
		p.mu.Unlock()
		return nil, errAcquireClosed
	}
	ws, err := p.set(spec)
	if err != nil {
		p.mu.Unlock()
		return nil, fmt.Errorf("acquire sandbox: %w", err)
	}
	if ws.demand[sc] > 1 {
		ws.demand[sc]--
	} else {
		delete(ws.demand, sc)
	}
	sc.demandChangedLocked(ws)
	for {
		// p.mu is held here. The scope's own reset spares go first: a
		// never-used sandbox can serve any scope, a spare only this one.
		if got := p.popSpareLocked(ws, sc); got != nil {
			p.mu.Unlock()
			if err := PlaceFiles(ctx, got, spec.Files); err != nil {
				p.d.Logger().Warn("warm pool: a reset sandbox refused the spec's files, removing it", "err", err)
				_ = got.Close(context.WithoutCancel(ctx))
				p.mu.Lock()
				if p.closed || sc.closed {
					p.mu.Unlock()
					return nil, errAcquireClosed
				}
				continue
			}
			return p.handOut(got, ws, sc, spec, start), nil
		}
		if got := p.popReadyLocked(ws); got != nil {
			p.refillLocked(ws)
			p.mu.Unlock()
			return p.handOut(got, ws, sc, spec, start), nil
		}
		if ws.filling > len(ws.waiters) {
			// One being started is ours.
			got, err := p.waitFill(ctx, ws)
			if err != nil {
				return nil, err
			}
			if got != nil {
				return p.handOut(got, ws, sc, spec, start), nil
			}
			// Its start failed: try again (a create of our own meets the
			// error and returns it).
			p.mu.Lock()
			if p.closed || sc.closed {
				p.mu.Unlock()
				return nil, errAcquireClosed
			}
			continue
		}
		if p.d.SlotSem().tryAcquire() {
			p.refillLocked(ws)
			p.mu.Unlock()
			sb, err := p.d.CreateWarm(ctx, spec, nil, SlotHeld, true)
			if err != nil {
				return nil, fmt.Errorf("acquire sandbox: %w", err)
			}
			MetricAcquire.WithLabelValues("create").Observe(time.Since(start).Seconds())
			p.hook(sb, ws, sc)
			return sb, nil
		}
		if victim := p.evictLocked(); victim != nil {
			// Idle warm sandboxes never block a rollout: remove one (of
			// another spec: ours has none ready) to free its slot.
			p.mu.Unlock()
			_ = victim.Close(context.WithoutCancel(ctx))
			p.mu.Lock()
			continue
		}
		slotFreed, poolChanged := p.d.SlotSem().Wait(), p.changed
		p.mu.Unlock()
		select {
		case <-slotFreed:
		case <-poolChanged:
		case <-ctx.Done():
			return nil, fmt.Errorf("acquire sandbox: waiting for a free slot (%d in use): %w", p.d.SlotSem().Cap, ctx.Err())
		}
		p.mu.Lock()
		if p.closed || sc.closed {
			p.mu.Unlock()
			return nil, errAcquireClosed
		}
	}
}

// popReadyLocked takes a healthy ready sandbox of ws, discarding broken ones.
func (p *Pool) popReadyLocked(ws *WarmSet) Warmable {
	defer metricPoolIdle.WithLabelValues(ws.spec.Image).Set(float64(len(ws.ready)))
	return p.popHealthyLocked(&ws.ready)
}

// popHealthyLocked takes the first healthy sandbox of q (ready or spare),
// removing the broken ones before it.
func (p *Pool) popHealthyLocked(q *[]Warmable) Warmable {
	for len(*q) > 0 {
		sb := (*q)[0]
		*q = (*q)[1:]
		p.idle--
		if sb.Broken() != nil {
			p.wg.Go(func() { _ = sb.Close(p.ctx) })
			continue
		}
		return sb
	}
	return nil
}

// evictLocked takes a reset spare or the oldest ready sandbox of any set,
// or nil.
func (p *Pool) evictLocked() Warmable {
	for k, sp := range p.spares {
		if len(sp) > 0 {
			if len(sp) == 1 {
				delete(p.spares, k)
			} else {
				p.spares[k] = sp[1:]
			}
			p.idle--
			return sp[0]
		}
	}
	return p.takeReadyLocked(func(ws *WarmSet) bool { return len(ws.ready) > 0 })
}

// surplusReadyLocked takes the oldest ready sandbox of a set that has more
// than its base and no announced demand, or nil.
func (p *Pool) surplusReadyLocked() Warmable {
	return p.takeReadyLocked(func(ws *WarmSet) bool { return len(ws.ready) > ws.base && len(ws.demand) == 0 })
}

// takeReadyLocked takes the oldest ready sandbox of the first set that ok
// accepts (ok implies a ready one), or nil.
func (p *Pool) takeReadyLocked(ok func(*WarmSet) bool) Warmable {
	for _, ws := range p.sets {
		if !ok(ws) {
			continue
		}
		sb := ws.ready[0]
		ws.ready = ws.ready[1:]
		p.idle--
		metricPoolIdle.WithLabelValues(ws.spec.Image).Set(float64(len(ws.ready)))
		return sb
	}
	return nil
}

// waitFill waits (p.mu held on entry, released on return) for a sandbox
// being started for ws; nil when that start failed.
func (p *Pool) waitFill(ctx context.Context, ws *WarmSet) (Warmable, error) {
	wait := make(chan Warmable, 1)
	ws.waiters = append(ws.waiters, wait)
	p.mu.Unlock()
	select {
	case got := <-wait:
		return got, nil
	case <-ctx.Done():
		p.mu.Lock()
		for i, w := range ws.waiters {
			if w == wait {
				ws.waiters = append(ws.waiters[:i], ws.waiters[i+1:]...)
				break
			}
		}
		select {
		case sb := <-wait:
			if sb != nil {
				ws.ready = append(ws.ready, sb)
				p.idle++
			}
		default:
		}
		p.mu.Unlock()
		return nil, fmt.Errorf("acquire sandbox: %w", ctx.Err())
	}
}

func (p *Pool) handOut(got Warmable, ws *WarmSet, sc *PoolScope, spec Spec, start time.Time) Sandbox {
	got.SetPooled(false)
	p.hook(got, ws, sc)
	got.SetLabels(maps.Clone(spec.Labels))
	got.Touch()
	MetricAcquire.WithLabelValues("pool").Observe(time.Since(start).Seconds())
	return got
}

// refillLocked starts fillers up to base + demand warm sandboxes, within
// MaxIdle and the backend's free slots (a filler holds its slot from the
// start, so the warm pool can never exceed MaxContainers).
func (p *Pool) refillLocked(ws *WarmSet) {
	missing := ws.base - len(ws.ready) - (ws.filling - ws.discard)
	for sc, n := range ws.demand {
		if p.reusable(ws.spec, sc) {
			// The scope's reset spares serve this spec too, and so do the
			// sandboxes it holds, once given back: start only what they
			// cannot.
			n -= p.coverLocked(ws, sc)
		}
		missing += max(n, 0)
	}
	for ; missing > 0 && p.idle < p.opts.MaxIdle && p.d.SlotSem().tryAcquire(); missing-- {
		ws.filling++
		p.idle++
		spec := ws.spec
		p.wg.Go(func() { p.fill(ws, spec) })
	}
}

// changedLocked wakes Acquires waiting for the pool's state to change.
func (p *Pool) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Pool) fill(ws *WarmSet, spec Spec) {
	sb, err := p.d.CreateWarm(p.ctx, spec, map[string]string{LabelPool: ws.key}, SlotHeld, false)
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.changedLocked()
	ws.filling--
	// Never more to discard than still starting (a waiter may have taken
	// one counted surplus).
	defer func() { ws.discard = min(ws.discard, ws.filling) }()
	if err != nil {
		p.idle--
		if ws.discard > 0 {
			ws.discard--
		}
		if p.ctx.Err() == nil {
			p.d.Logger().Warn("warm pool: create failed", "image", spec.Image, "err", err)
		}
		// A waiter counted on this start: let it create its own.
		if len(ws.waiters) > 0 && ws.filling < len(ws.waiters) {
			w := ws.waiters[0]
			ws.waiters = ws.waiters[1:]
			w <- nil
		}
		return
	}
	if p.closed {
		p.idle--
		p.wg.Go(func() { _ = sb.Close(context.Background()) })
		return
	}
	sb.SetPooled(true)
	if len(ws.waiters) > 0 {
		w := ws.waiters[0]
		ws.waiters = ws.waiters[1:]
		p.idle--
		w <- sb
		return
	}
	if ws.discard > 0 {
		ws.discard--
		ws.removing++
		p.idle--
		p.wg.Go(func() {
			_ = sb.Close(context.WithoutCancel(p.ctx))
			p.mu.Lock()
			defer p.mu.Unlock()
			ws.removing--
			p.changedLocked()
		})
		return
	}
	ws.ready = append(ws.ready, sb)
	metricPoolIdle.WithLabelValues(spec.Image).Set(float64(len(ws.ready)))
}

// Close removes every warm sandbox, closeParallel at a time (one
// after the other, a pool of 64 took 64 engine removals in a row, and on an
// engine that stopped answering — Docker 20.10's removal deadlock,
// moby/moby#42545 — each waits out its timeouts); acquired ones are the
// callers' to close.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.cancel()
	p.changedLocked()
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	var ready []Warmable
	for _, ws := range p.sets {
		ready = append(ready, ws.ready...)
		ws.ready = nil
		for _, w := range ws.waiters {
			w <- nil
		}
		ws.waiters = nil
		metricPoolIdle.WithLabelValues(ws.spec.Image).Set(0)
	}
	for k, sp := range p.spares {
		ready = append(ready, sp...)
		delete(p.spares, k)
	}
	p.idle = 0
	p.mu.Unlock()
	return errors.Join(CloseAll(ctx, ready, CloseParallel)...)
}

// PoolStats is a snapshot of a pool's bookkeeping: what a test or an
// operator needs to see that warm sandboxes, resets and announced demand
// are accounted as intended, without reaching into the pool's locks.
type PoolStats struct {
	Ready     int // warm sandboxes of the spec ready to be served
	Filling   int // warm sandboxes of the spec being created
	Returning int // sandboxes being reset before they serve again (every spec)
	Demanding int // warm sets the pool's own scope announced demand on
}

// Stats reports the pool's state for spec (a spec the backend refuses is
// ErrInvalid).
func (p *Pool) Stats(spec Spec) (PoolStats, error) {
	key, err := p.Fingerprint(spec)
	if err != nil {
		return PoolStats{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var st PoolStats
	if ws := p.sets[key]; ws != nil {
		st.Ready, st.Filling = len(ws.ready), ws.filling
	}
	for _, n := range p.returning {
		st.Returning += n
	}
	for _, sets := range p.root.demanding {
		st.Demanding += len(sets)
	}
	return st, nil
}
