package sandbox

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var metricParallel = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "rollout_sandbox_create_parallelism",
	Help: "Creates allowed in flight, adapted to the daemon's create latency.",
})

func init() { prometheus.MustRegister(metricParallel) }

// createGate bounds the creates in flight and adapts the bound to how the
// daemon copes (dockerd slows down sharply under parallel creates): a create
// slower than slow halves the bound (at most once per slow interval, never
// below 1); a fast one raises it by one, up to max.
type CreateGate struct {
	mu       sync.Mutex
	max      int
	limit    int
	inflight int
	slow     time.Duration
	lastCut  time.Time
	waiters  []chan struct{}
}

func NewCreateGate(max int, slow time.Duration) *CreateGate {
	g := &CreateGate{max: max, limit: max, slow: slow}
	metricParallel.Set(float64(max))
	return g
}

func (g *CreateGate) Acquire(ctx context.Context) error {
	g.mu.Lock()
	if g.inflight < g.limit && len(g.waiters) == 0 {
		g.inflight++
		g.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	g.waiters = append(g.waiters, ch)
	g.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		defer g.mu.Unlock()
		for i, w := range g.waiters {
			if w == ch {
				g.waiters = append(g.waiters[:i], g.waiters[i+1:]...)
				return ctx.Err()
			}
		}
		// Granted while giving up: pass the turn on.
		g.inflight--
		g.wakeLocked()
		return ctx.Err()
	}
}

// release ends a create that took d; failed creates do not steer the bound.
func (g *CreateGate) Release(d time.Duration, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	if ok {
		g.observeLocked(d, time.Now())
	}
	g.wakeLocked()
}

func (g *CreateGate) observeLocked(d time.Duration, now time.Time) {
	switch {
	case d > g.slow:
		if now.Sub(g.lastCut) >= g.slow {
			g.limit = max(1, g.limit/2)
			g.lastCut = now
		}
	case g.limit < g.max:
		g.limit++
	}
	metricParallel.Set(float64(g.limit))
}

func (g *CreateGate) wakeLocked() {
	for g.inflight < g.limit && len(g.waiters) > 0 {
		w := g.waiters[0]
		g.waiters = g.waiters[1:]
		g.inflight++
		close(w)
	}
}

// Parallelism is the current bound on creates in flight.
func (g *CreateGate) Parallelism() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limit
}

// slotSem counts the containers a backend holds (warm ones included) under
// MaxContainers. It is a hard bound: a slot is taken before a container is
// created and given back only once it is removed. Unlike a channel it lets
// a waiter also watch other events (the pool's), through changed().
type SlotSem struct {
	mu      sync.Mutex
	Cap     int
	used    int
	changed chan struct{} // closed and replaced on every release
}

func NewSlotSem(n int) *SlotSem { return &SlotSem{Cap: n, changed: make(chan struct{})} }

// tryAcquire takes a slot when one is free.
func (s *SlotSem) tryAcquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used >= s.Cap {
		return false
	}
	s.used++
	return true
}

// acquire waits for a slot as long as ctx allows.
func (s *SlotSem) Acquire(ctx context.Context) error {
	for {
		s.mu.Lock()
		if s.used < s.Cap {
			s.used++
			s.mu.Unlock()
			return nil
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release gives a slot back and wakes every waiter.
func (s *SlotSem) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used <= 0 {
		panic("sandbox: slot released twice")
	}
	s.used--
	close(s.changed)
	s.changed = make(chan struct{})
}

// wait returns a channel closed at the next release.
func (s *SlotSem) Wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// InUse is the number of slots taken.
func (s *SlotSem) InUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// rateLimiter is a token bucket for container creates.
type RateLimiter struct {
	mu    sync.Mutex
	rate  float64
	burst float64
	avail float64
	last  time.Time
}

func NewRateLimiter(perSec float64, burst int) *RateLimiter {
	return &RateLimiter{rate: perSec, burst: float64(burst), avail: float64(burst), last: time.Now()}
}

func (r *RateLimiter) Wait(ctx context.Context) error {
	for {
		r.mu.Lock()
		now := time.Now()
		r.avail = math.Min(r.burst, r.avail+now.Sub(r.last).Seconds()*r.rate)
		r.last = now
		if r.avail >= 1 {
			r.avail--
			r.mu.Unlock()
			return nil
		}
		need := time.Duration((1 - r.avail) / r.rate * float64(time.Second))
		r.mu.Unlock()
		t := time.NewTimer(need)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}
