package inference

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Fail fast: a run checks its endpoints before the first generation
// (Client.Ready) and watches them while it runs (Client.Watch), so that a
// dead or misconfigured server ends the run with an error naming it instead
// of a run that retries forever.

var (
	// ErrUnreachable is wrapped when endpoints did not answer: at start
	// within ready_timeout, or while running for unreachable_timeout.
	ErrUnreachable = errors.New("inference endpoints unreachable")
	// ErrModelNotServed is wrapped when an endpoint answers /v1/models
	// without the configured model (or the endpoints serve different ones).
	ErrModelNotServed = errors.New("model not served")
	// ErrEndpointRefused is wrapped when an endpoint refuses the start
	// check for a reason a retry will not change (401/403: the API key).
	ErrEndpointRefused = errors.New("endpoint refused the check")
)

// Defaults of the fail-fast knobs (Config.ReadyTimeout, UnreachableTimeout).
const (
	DefaultReadyTimeout       = 10 * time.Second
	DefaultUnreachableTimeout = 60 * time.Second
)

// epHealth is an endpoint's reachability as the traffic and the watch
// probes see it. Guarded by Pool.mu.
type epHealth struct {
	// failingSince is the first failure of the current run of failures;
	// zero after an answer.
	failingSince time.Time
	lastErr      error
}

// observe records one outcome. Only "no answer" counts against
// reachability: a connection failure, a timeout or a 5xx. A 4xx (429
// included) is an answer.
func (h *epHealth) observe(err error, now time.Time) {
	if err == nil || !unanswered(err) {
		h.failingSince, h.lastErr = time.Time{}, nil
		return
	}
	if h.failingSince.IsZero() {
		h.failingSince = now
	}
	h.lastErr = err
}

func unanswered(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return true
	}
	return errors.Is(e.Class, ErrInfra) && (e.Status == 0 || e.Status >= 500)
}

// downFor is how long every endpoint of p has been without an answer, and
// what each last failed with; ok is false while one of them answers.
func (p *Pool) downFor(now time.Time) (d time.Duration, detail string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var latest time.Time
	parts := make([]string, 0, len(p.eps))
	for _, ep := range p.eps {
		h := ep.health
		if h.failingSince.IsZero() {
			return 0, "", false
		}
		if h.failingSince.After(latest) {
			latest = h.failingSince
		}
		parts = append(parts, fmt.Sprintf("%s (%v)", ep.base, h.lastErr))
	}
	return now.Sub(latest), strings.Join(parts, "; "), true
}

// probeReach asks every endpoint's /health once, concurrently, and records
// the outcomes for downFor. It does not touch the circuit breaker.
func (p *Pool) probeReach(ctx context.Context) {
	var wg sync.WaitGroup
	for _, ep := range p.eps {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, p.cfg.HealthTimeout)
			err := p.caller.doJSON(pctx, ep.base, http.MethodGet, "/health", "", nil, nil)
			cancel()
			if ctx.Err() != nil {
				return // our own cancellation says nothing about the endpoint
			}
			p.mu.Lock()
			ep.health.observe(err, time.Now())
			p.mu.Unlock()
		})
	}
	wg.Wait()
}

// pools are the client's distinct pools (generation, then tokenizer).
func (c *Client) pools() []*Pool {
	if c.tok != c.pool {
		return []*Pool{c.pool, c.tok}
	}
	return []*Pool{c.pool}
}

// WatchOptions configure Client.Watch.
type WatchOptions struct {
	// After is how long every endpoint of a pool may stay without an
	// answer before Watch fails (default: the config's
	// unreachable_timeout, else 60s).
	After time.Duration
	// Interval between probes of every endpoint's /health (default 1s).
	Interval time.Duration
	// Stopping, once closed, shortens After to StoppingAfter: a run that
	// is stopping (intake stopped, in-flight rollouts finishing) does not
	// wait for dead endpoints to come back.
	Stopping      <-chan struct{}
	StoppingAfter time.Duration // default 3s
}

// Watch probes the endpoints every Interval until ctx ends (it then
// returns nil) or until every endpoint of the generation or the tokenizer
// pool has been without an answer for After: it then returns an error
// wrapping ErrUnreachable and naming each endpoint with its last failure.
// Generation traffic counts too (Pool.feedLocked). Run it in a goroutine
// the caller owns, and cancel the run on its error.
func (c *Client) Watch(ctx context.Context, o WatchOptions) error {
	if o.After <= 0 {
		o.After = c.cfg.UnreachableTimeout
	}
	if o.After <= 0 {
		o.After = DefaultUnreachableTimeout
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.StoppingAfter <= 0 {
		o.StoppingAfter = 3 * time.Second
	}
	after := o.After
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	stopping := o.Stopping
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-stopping:
			after, stopping = min(after, o.StoppingAfter), nil
			continue
		case <-t.C:
		}
		for _, p := range c.pools() {
			p.probeReach(ctx)
			if ctx.Err() != nil {
				return nil
			}
			if d, detail, down := p.downFor(time.Now()); down && d >= after {
				return fmt.Errorf("%w: no endpoint answered for %s (inference.unreachable_timeout %s): %s",
					ErrUnreachable, d.Round(time.Second), after, detail)
			}
		}
	}
}

// Ready waits until every endpoint answers GET /v1/models (or, on servers
// without that route, GET /health), for at most wait (default: the
// config's ready_timeout, else 10s). When /v1/models answers, the
// configured model must be in it; with no model configured, every endpoint
// must serve the first endpoint's first model. Errors name every endpoint
// that failed and how, and wrap ErrUnreachable (no answer in time),
// ErrModelNotServed or ErrEndpointRefused (answers that a retry will not
// change). ctx ending aborts the wait with its cause.
func (c *Client) Ready(ctx context.Context, wait time.Duration) error {
	if wait <= 0 {
		wait = c.cfg.ReadyTimeout
	}
	if wait <= 0 {
		wait = DefaultReadyTimeout
	}
	deadline := time.Now().Add(wait)
	type target struct {
		p    *Pool
		ep   *endpoint
		role string
	}
	var pending []target
	for i, p := range c.pools() {
		role := "endpoint"
		if i > 0 {
			role = "tokenizer endpoint"
		}
		for _, ep := range p.eps {
			pending = append(pending, target{p, ep, role})
		}
	}
	want := c.cfg.Model
	var firstFrom string
	for {
		type outcome struct {
			t      target
			models []string // nil: /v1/models not served
			err    error
		}
		outs := make([]outcome, len(pending))
		var wg sync.WaitGroup
		for i, t := range pending {
			wg.Go(func() {
				models, err := t.p.readyProbe(ctx, t.ep)
				outs[i] = outcome{t, models, err}
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			return fmt.Errorf("inference start check: %w", context.Cause(ctx))
		}
		var still []target
		var fails []string
		for _, o := range outs {
			switch {
			case o.err != nil && errors.Is(o.err, ErrEndpointRefused):
				return fmt.Errorf("inference start check: %s %s: %w", o.t.role, o.t.ep.base, o.err)
			case o.err != nil:
				still = append(still, o.t)
				fails = append(fails, fmt.Sprintf("%s %s: %v", o.t.role, o.t.ep.base, o.err))
			case o.models == nil:
				// Reachable; the model cannot be checked here.
			case want == "" && len(o.models) == 0:
				still = append(still, o.t)
				fails = append(fails, fmt.Sprintf("%s %s: /v1/models lists no model", o.t.role, o.t.ep.base))
			case want == "":
				want, firstFrom = o.models[0], o.t.ep.base
			}
			if o.err == nil && o.models != nil && want != "" && !slices.Contains(o.models, want) {
				how := "model " + want + " (inference.model)"
				if firstFrom != "" {
					how = "model " + want + " (served by " + firstFrom + "; set inference.model)"
				}
				return fmt.Errorf("inference start check: %s %s does not serve %s: it serves %s: %w",
					o.t.role, o.t.ep.base, how, strings.Join(o.models, ", "), ErrModelNotServed)
			}
		}
		if len(still) == 0 {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%w: not ready after %s (inference.ready_timeout): %s", ErrUnreachable, wait, strings.Join(fails, "; "))
		}
		pending = still
		select {
		case <-ctx.Done():
			return fmt.Errorf("inference start check: %w", context.Cause(ctx))
		case <-time.After(min(500*time.Millisecond, time.Until(deadline))):
		}
	}
}

// readyProbe asks one endpoint for /v1/models; models is nil when the
// server has no such route but answers /health.
func (p *Pool) readyProbe(ctx context.Context, ep *endpoint) ([]string, error) {
	pctx, cancel := context.WithTimeout(ctx, p.cfg.HealthTimeout)
	defer cancel()
	var resp ModelsResponse
	err := p.caller.doJSON(pctx, ep.base, http.MethodGet, "/v1/models", "", nil, &resp)
	if err == nil {
		ids := make([]string, 0, len(resp.Data))
		for _, m := range resp.Data {
			ids = append(ids, m.ID)
		}
		return ids, nil
	}
	var e *Error
	if errors.As(err, &e) {
		switch {
		case e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden:
			return nil, fmt.Errorf("%w (check inference.api_key): %w", ErrEndpointRefused, err)
		case e.Status == http.StatusNotFound || e.Status == http.StatusMethodNotAllowed:
			// Some servers (the Atropos custom server, proxies) have no
			// /v1/models: being up is all that can be checked.
			herr := p.caller.doJSON(pctx, ep.base, http.MethodGet, "/health", "", nil, nil)
			if herr == nil || !unanswered(herr) {
				return nil, nil
			}
			return nil, fmt.Errorf("no /v1/models, and /health: %w", herr)
		}
	}
	return nil, err
}
