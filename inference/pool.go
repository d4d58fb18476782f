package inference

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// PoolConfig configures an endpoint pool. Zero values get the defaults
// documented on each field.
type PoolConfig struct {
	// Endpoints are server base URLs (scheme://host:port, optionally with
	// a path prefix; a trailing "/v1" is dropped).
	Endpoints []string
	APIKey    string
	// Timeout bounds one HTTP attempt (default 10m: long generations).
	Timeout time.Duration
	// MaxConcurrentPerEndpoint caps in-flight requests per endpoint; 0 means
	// no cap. Callers beyond the cap of every endpoint wait (FIFO).
	MaxConcurrentPerEndpoint int
	// Retries is how many times an attempt that failed with a connection
	// error or 5xx is re-sent (default 3; negative disables).
	Retries int
	// BackoffBase/BackoffMax shape the full-jitter exponential backoff
	// between attempts (defaults 100ms / 5s).
	BackoffBase, BackoffMax time.Duration
	// BreakerFailures consecutive infra failures eject an endpoint (default 5).
	BreakerFailures int
	// BreakerCooldown is the first ejection period; it doubles on every
	// failed probe up to 16× (default 5s).
	BreakerCooldown time.Duration
	// HealthTimeout bounds a /health probe (default 2s).
	HealthTimeout time.Duration
	// IdleConnsPerHost sizes the keep-alive pool (default: max(4096,
	// 2×MaxConcurrentPerEndpoint)).
	IdleConnsPerHost int
	Logger           *slog.Logger
}

func (c *PoolConfig) defaults() {
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Minute
	}
	if c.Retries == 0 {
		c.Retries = 3
	}
	if c.Retries < 0 {
		c.Retries = 0
	}
	if c.BackoffBase <= 0 {
		c.BackoffBase = 100 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 5 * time.Second
	}
	if c.BreakerFailures <= 0 {
		c.BreakerFailures = 5
	}
	if c.BreakerCooldown <= 0 {
		c.BreakerCooldown = 5 * time.Second
	}
	if c.HealthTimeout <= 0 {
		c.HealthTimeout = 2 * time.Second
	}
	if c.IdleConnsPerHost <= 0 {
		c.IdleConnsPerHost = max(4096, 2*c.MaxConcurrentPerEndpoint)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

type breakerState int

const (
	closed breakerState = iota
	open
	probing
)

type endpoint struct {
	base string
	m    *endpointMetrics
	// guarded by Pool.mu
	inflight  int
	fails     int
	state     breakerState
	openUntil time.Time
	cooldown  time.Duration
	health    epHealth // reachability for Client.Watch (health.go)
}

// affinity pins an episode to the endpoint that served it last, so the
// server's prefix cache holds the episode's growing prompt.
type affinity struct {
	ep *endpoint // guarded by Pool.mu
	// key (a GRPO group) picks the first endpoint by rendezvous hashing, so
	// rollouts sharing a prompt share the server's prefix cache.
	key string
}

type waiter struct {
	ch chan struct{}
}

// Pool routes requests over several endpoints of one model:
// least-outstanding-requests with episode affinity, a per-endpoint
// concurrency cap, passive health with a circuit breaker that ejects a
// failing endpoint and probes it back through /health, and retries with
// jittered backoff on connection errors and 5xx only.
type Pool struct {
	cfg       PoolConfig
	eps       []*endpoint
	caller    *httpCaller
	transport *directTransport
	conns     connStats

	mu      sync.Mutex
	waiters list.List // of *waiter
}

// NewPool validates the endpoints and builds the shared transport.
func NewPool(cfg PoolConfig) (*Pool, error) {
	cfg.defaults()
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("inference pool: no endpoints configured")
	}
	p := &Pool{cfg: cfg}
	seen := map[string]bool{}
	for _, raw := range cfg.Endpoints {
		base, err := normalizeBase(raw)
		if err != nil {
			return nil, err
		}
		if seen[base] {
			return nil, fmt.Errorf("inference pool: endpoint %s listed twice", base)
		}
		seen[base] = true
		p.eps = append(p.eps, &endpoint{base: base, m: newEndpointMetrics(base), cooldown: cfg.BreakerCooldown})
	}
	p.transport = newTransport(cfg.IdleConnsPerHost, &p.conns)
	p.caller = &httpCaller{hc: &http.Client{Transport: p.transport}, apiKey: cfg.APIKey}
	return p, nil
}

func normalizeBase(raw string) (string, error) {
	s := strings.TrimSpace(raw)
	if !strings.HasPrefix(s, "http://") && !strings.HasPrefix(s, "https://") {
		return "", fmt.Errorf("inference endpoint %q: want an http:// or https:// base URL", raw)
	}
	s = strings.TrimRight(s, "/")
	s = strings.TrimSuffix(s, "/v1")
	if len(s) <= len("https://") {
		return "", fmt.Errorf("inference endpoint %q: no host", raw)
	}
	return s, nil
}

// Endpoints lists the normalised base URLs.
func (p *Pool) Endpoints() []string {
	out := make([]string, len(p.eps))
	for i, ep := range p.eps {
		out[i] = ep.base
	}
	return out
}

// NewConns is the number of TCP connections dialled so far; with a warm
// pool it stays flat under load (no connection churn).
func (p *Pool) NewConns() int64 { return p.conns.dials.Load() }

// ClosedConns is the number of connections closed so far (by either side);
// under steady load it stays flat when keep-alive works.
func (p *Pool) ClosedConns() int64 { return p.conns.closes.Load() }

// Close drops idle connections.
func (p *Pool) Close() { p.transport.CloseIdleConnections() }

// EndpointState is a snapshot for status pages and tests.
type EndpointState struct {
	Base     string
	InFlight int
	Healthy  bool
	Failures int
}

// State snapshots every endpoint.
func (p *Pool) State() []EndpointState {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]EndpointState, len(p.eps))
	for i, ep := range p.eps {
		out[i] = EndpointState{Base: ep.base, InFlight: ep.inflight, Healthy: ep.state == closed, Failures: ep.fails}
	}
	return out
}

var errNoEndpoint = errors.New("no healthy endpoint")

// acquire reserves a slot on an endpoint, waiting for capacity. avoid is
// the endpoint of a failed previous attempt: used only if nothing else is.
func (p *Pool) acquire(ctx context.Context, aff *affinity, avoid *endpoint) (*endpoint, error) {
	var downSince time.Time
	for {
		p.mu.Lock()
		ep, probe, wake := p.pickLocked(aff, avoid)
		if ep != nil && !probe {
			ep.inflight++
			ep.m.inFlight.Inc()
			if aff != nil {
				aff.ep = ep
			}
			p.mu.Unlock()
			return ep, nil
		}
		if probe {
			p.mu.Unlock()
			ok := p.probe(ctx, ep)
			p.mu.Lock()
			if !ok && ctx.Err() != nil {
				// The caller gave up mid-probe: no verdict on the endpoint.
				ep.state = open
				p.wakeLocked(-1)
				p.mu.Unlock()
				return nil, &Error{Class: ErrInfra, Op: "route", Endpoint: ep.base, Msg: "probing an ejected endpoint", Err: ctx.Err()}
			}
			p.probeDoneLocked(ep, ok)
			p.mu.Unlock()
			continue
		}
		// Nothing usable: either every endpoint is full (wait for a
		// release) or every endpoint is ejected (wait for the earliest
		// cooldown, bounded by the attempt timeout).
		w := &waiter{ch: make(chan struct{}, 1)}
		el := p.waiters.PushBack(w)
		p.mu.Unlock()
		var timer <-chan time.Time
		var t *time.Timer
		if !wake.IsZero() {
			if downSince.IsZero() {
				downSince = time.Now()
			}
			if time.Since(downSince) > p.cfg.Timeout {
				p.removeWaiter(el, w)
				return nil, &Error{Class: ErrInfra, Op: "route", Msg: fmt.Sprintf("every endpoint of %s is ejected", strings.Join(p.Endpoints(), ", ")), Err: errNoEndpoint}
			}
			t = time.NewTimer(time.Until(wake))
			timer = t.C
		}
		select {
		case <-w.ch:
		case <-timer:
			p.removeWaiter(el, w)
		case <-ctx.Done():
			p.removeWaiter(el, w)
			if t != nil {
				t.Stop()
			}
			return nil, &Error{Class: ErrInfra, Op: "route", Msg: "waiting for endpoint capacity", Err: ctx.Err()}
		}
		if t != nil {
			t.Stop()
		}
	}
}

// removeWaiter unlinks w; if it was already signalled, the wake-up passes
// to the next waiter so no capacity is lost.
func (p *Pool) removeWaiter(el *list.Element, w *waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if el.Value != nil {
		p.waiters.Remove(el)
		el.Value = nil
		return
	}
	select {
	case <-w.ch:
		p.wakeLocked(1)
	default:
	}
}

func (p *Pool) wakeLocked(n int) {
	for ; n > 0 || n < 0; n-- {
		f := p.waiters.Front()
		if f == nil {
			return
		}
		w := p.waiters.Remove(f).(*waiter)
		f.Value = nil
		w.ch <- struct{}{}
	}
}

// pickLocked chooses an endpoint. It returns probe=true with an ejected
// endpoint whose cooldown is over (now marked probing), or wake = the
// earliest end of a cooldown when every endpoint is ejected.
func (p *Pool) pickLocked(aff *affinity, avoid *endpoint) (ep *endpoint, probe bool, wake time.Time) {
	now := time.Now()
	capN := p.cfg.MaxConcurrentPerEndpoint
	var best, fallback *endpoint
	alive := false
	for _, e := range p.eps {
		switch e.state {
		case open:
			if !now.Before(e.openUntil) {
				e.state = probing
				return e, true, time.Time{}
			}
			if wake.IsZero() || e.openUntil.Before(wake) {
				wake = e.openUntil
			}
			continue
		case probing:
			alive = true // its outcome will wake us
			continue
		}
		alive = true
		if capN > 0 && e.inflight >= capN {
			continue
		}
		if e == avoid {
			fallback = e
			continue
		}
		if best == nil || e.inflight < best.inflight {
			best = e
		}
	}
	if aff != nil && aff.ep != nil && aff.ep != avoid && aff.ep.state == closed && (capN <= 0 || aff.ep.inflight < capN) {
		return aff.ep, false, time.Time{}
	}
	if aff != nil && aff.ep == nil && aff.key != "" && best != nil {
		if h := p.rendezvousLocked(aff.key, avoid); h != nil && h.inflight <= 2*best.inflight+4 {
			return h, false, time.Time{}
		}
	}
	if best == nil {
		best = fallback
	}
	if best != nil || alive {
		return best, false, time.Time{}
	}
	return nil, false, wake
}

// rendezvousLocked is the usable endpoint with the highest hash of
// (key, endpoint): stable per key, spread evenly over keys, and only the
// keys of a removed endpoint move.
func (p *Pool) rendezvousLocked(key string, avoid *endpoint) *endpoint {
	capN := p.cfg.MaxConcurrentPerEndpoint
	var top *endpoint
	var topH uint64
	for _, e := range p.eps {
		if e.state != closed || e == avoid || (capN > 0 && e.inflight >= capN) {
			continue
		}
		h := fnv.New64a()
		h.Write([]byte(key))
		h.Write([]byte{0})
		h.Write([]byte(e.base))
		if v := h.Sum64(); top == nil || v > topH {
			top, topH = e, v
		}
	}
	return top
}

func (p *Pool) probe(ctx context.Context, ep *endpoint) bool {
	pctx, cancel := context.WithTimeout(ctx, p.cfg.HealthTimeout)
	defer cancel()
	err := p.caller.doJSON(pctx, ep.base, http.MethodGet, "/health", "", nil, nil)
	if err != nil {
		p.cfg.Logger.Warn("inference endpoint probe failed", "endpoint", ep.base, "err", err)
	}
	return err == nil
}

func (p *Pool) probeDoneLocked(ep *endpoint, ok bool) {
	if ok {
		ep.state = closed
		ep.fails = 0
		ep.cooldown = p.cfg.BreakerCooldown
		ep.m.healthy.Set(1)
		p.cfg.Logger.Info("inference endpoint back in rotation", "endpoint", ep.base)
	} else {
		ep.state = open
		ep.cooldown = min(2*ep.cooldown, 16*p.cfg.BreakerCooldown)
		ep.openUntil = time.Now().Add(ep.cooldown)
	}
	p.wakeLocked(-1)
}

// release returns the slot and feeds the breaker. Cancelled callers and
// 4xx say nothing about the endpoint's health.
func (p *Pool) release(ep *endpoint, err error, callerGone bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ep.inflight--
	ep.m.inFlight.Dec()
	if !callerGone {
		p.feedLocked(ep, err)
	}
	p.wakeLocked(1)
}

// feedLocked updates the breaker with one outcome; 4xx says nothing about
// the endpoint's health.
func (p *Pool) feedLocked(ep *endpoint, err error) {
	ep.health.observe(err, time.Now())
	switch {
	case err == nil:
		ep.fails = 0
	case !countsAgainstEndpoint(err):
	default:
		ep.fails++
		if ep.state == closed && ep.fails >= p.cfg.BreakerFailures {
			ep.state = open
			ep.openUntil = time.Now().Add(ep.cooldown)
			ep.m.healthy.Set(0)
			p.cfg.Logger.Warn("inference endpoint ejected", "endpoint", ep.base, "consecutive_failures", ep.fails, "cooldown", ep.cooldown, "err", err)
		}
	}
}

// do runs fn against a chosen endpoint with retries. fn gets the attempt's
// context (bounded by Timeout) and the endpoint's base URL. It returns the
// base URL that succeeded.
func (p *Pool) do(ctx context.Context, aff *affinity, op, reqID string, fn func(ctx context.Context, base, attemptID string) error) (string, error) {
	var avoid *endpoint
	for attempt := 0; ; attempt++ {
		ep, err := p.acquire(ctx, aff, avoid)
		if err != nil {
			var e *Error
			if errors.As(err, &e) {
				e.Op, e.RequestID = op, reqID
			}
			return "", err
		}
		actx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
		t0 := time.Now()
		// A retry gets its own id: the server may still be running the
		// attempt that timed out, and vLLM rejects duplicate running ids.
		attemptID := reqID
		if attempt > 0 && reqID != "" {
			attemptID = reqID + "-r" + strconv.Itoa(attempt)
		}
		actx, span := startRequest(actx, op, ep.base, attemptID, attempt)
		err = fn(actx, ep.base, attemptID)
		endRequest(span, err)
		cancel()
		ep.m.observer(op).Observe(time.Since(t0).Seconds())
		callerGone := ctx.Err() != nil
		p.release(ep, err, callerGone)
		if err == nil {
			return ep.base, nil
		}
		ep.m.countError(err)
		if callerGone {
			return "", err
		}
		if !retryable(err) || attempt >= p.cfg.Retries {
			return "", err
		}
		ep.m.retries.Inc()
		avoid = ep
		if aff != nil {
			p.mu.Lock()
			aff.ep = nil
			p.mu.Unlock()
		}
		d := p.backoff(attempt)
		p.cfg.Logger.Debug("inference retry", "endpoint", ep.base, "op", op, "request_id", reqID, "attempt", attempt+1, "backoff", d, "err", err)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", err
		}
	}
}

func (p *Pool) backoff(attempt int) time.Duration {
	d := p.cfg.BackoffBase << min(attempt, 20)
	if d <= 0 || d > p.cfg.BackoffMax {
		d = p.cfg.BackoffMax
	}
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// call is do + doJSON: one JSON request through the pool.
func (p *Pool) call(ctx context.Context, aff *affinity, method, path, reqID string, body, out any) (string, error) {
	op := method + " " + path
	return p.do(ctx, aff, op, reqID, func(actx context.Context, base, attemptID string) error {
		return p.caller.doJSON(actx, base, method, path, attemptID, body, out)
	})
}

// Health probes every endpoint's /health now and returns the failures by
// base URL (empty when all are up). It does not change breaker state.
func (p *Pool) Health(ctx context.Context) map[string]error {
	out := map[string]error{}
	for _, ep := range p.eps {
		pctx, cancel := context.WithTimeout(ctx, p.cfg.HealthTimeout)
		err := p.caller.doJSON(pctx, ep.base, http.MethodGet, "/health", "", nil, nil)
		cancel()
		if err != nil {
			out[ep.base] = err
		}
	}
	return out
}

func (p *Pool) metricsFor(base string) *endpointMetrics {
	for _, ep := range p.eps {
		if ep.base == base {
			return ep.m
		}
	}
	return nil
}

// WatchHealth probes every endpoint's /health each interval until ctx ends,
// so a dead server is ejected before real traffic hits it: a failed probe
// counts as an infra failure, and BreakerFailures of them in a row eject
// the endpoint (ejected endpoints are probed back by the routing path).
// Run it in a goroutine the caller owns.
func (p *Pool) WatchHealth(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = 5 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, ep := range p.eps {
			p.mu.Lock()
			skip := ep.state != closed
			p.mu.Unlock()
			if skip {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, p.cfg.HealthTimeout)
			err := p.caller.doJSON(pctx, ep.base, http.MethodGet, "/health", "", nil, nil)
			cancel()
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			p.feedLocked(ep, err)
			p.mu.Unlock()
		}
	}
}
