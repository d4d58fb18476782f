package inference

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Asynchronous RL: policy versions and in-flight weight updates.
//
// Every Client carries an update gate. Generation requests pass through it:
// they are admitted only while no update is in progress, and each admission
// reads the policy version then in force. BeginUpdate closes the gate and
// pauses the engines of the pool in the chosen mode; EndUpdate resumes them,
// sets the new version and reopens the gate. Engines without a pause API
// (llama.cpp, the Atropos server) get the drain-and-wait fallback: the gate
// closes and BeginUpdate returns once every admitted generation has ended.

// Pause modes, with vLLM's names (POST /pause?mode=...).
const (
	// PauseKeep freezes in-flight generations on the engine; they continue
	// after resume, under the new weights.
	PauseKeep = "keep"
	// PauseWait drains: in-flight generations finish under the old weights.
	PauseWait = "wait"
	// PauseAbort cuts in-flight generations; each returns its partial tokens
	// (finish_reason "abort") and is continued after resume as a partial
	// rollout (prompt + tokens already sampled).
	PauseAbort = "abort"
)

// PauseModes lists the modes BeginUpdate accepts.
func PauseModes() []string { return []string{PauseKeep, PauseWait, PauseAbort} }

// VersionHeader is the response header an engine (or a proxy in front of
// it) may set to the policy version that produced a generation. The
// simulator sets it; SGLang's meta_info.weight_version is read as well.
const VersionHeader = "X-Policy-Version"

// ErrUpdate classifies update-coordination errors (bad mode, no update in
// progress, an engine refusing to pause).
var ErrUpdate = errors.New("policy update")

// Cut records where a generation's policy version changed.
type Cut struct {
	Turn int // 1-based turn
	// Position is the index in Sequence.Tokens of the first token sampled
	// after the update; -1 when the engine continued the request itself
	// (keep mode) and the switch point is not observable.
	Position int
	Kind     string // PauseAbort or PauseKeep
	From, To int64
}

// UpdateStats describes one BeginUpdate/EndUpdate cycle.
type UpdateStats struct {
	Mode     string
	Fallback bool // drain-and-wait: the engines have no pause API
	// Aborted counts generations cut by an abort-mode pause, Drained those
	// that finished while the pause waited (wait mode, fallback).
	InFlight int
	// PauseTook is BeginUpdate's duration (engine pauses, drains);
	// ResumeTook is EndUpdate's.
	PauseTook, ResumeTook time.Duration
}

type gate struct {
	mu       sync.Mutex
	version  int64
	updating bool
	mode     string
	open     chan struct{} // closed while no update is in progress
	inflight int
	idle     chan struct{} // closed and replaced when inflight drops to 0
	epoch    int64         // completed updates
	observed int64         // highest version reported by an engine or a trainer
}

func newGate() *gate {
	g := &gate{open: make(chan struct{}), idle: make(chan struct{})}
	close(g.open)
	return g
}

// ticket is one admitted generation.
type ticket struct {
	version int64
	epoch   int64
}

// enter waits until no update is in progress and admits one generation.
func (g *gate) enter(ctx context.Context) (ticket, error) {
	for {
		g.mu.Lock()
		if !g.updating {
			g.inflight++
			t := ticket{version: g.current(), epoch: g.epoch}
			g.mu.Unlock()
			return t, nil
		}
		open := g.open
		g.mu.Unlock()
		select {
		case <-open:
		case <-ctx.Done():
			return ticket{}, &Error{Class: ErrInfra, Op: "policy update", Msg: "waiting for a policy update to finish", Err: ctx.Err()}
		}
	}
}

func (g *gate) exit() {
	g.mu.Lock()
	g.inflight--
	if g.inflight == 0 {
		close(g.idle)
		g.idle = make(chan struct{})
	}
	g.mu.Unlock()
}

func (g *gate) current() int64 { return max(g.version, g.observed) }

// observe raises the known version (engine-reported or trainer-reported).
func (g *gate) observe(v int64) {
	g.mu.Lock()
	g.observed = max(g.observed, v)
	g.mu.Unlock()
}

// PolicyVersion is the version new generations are stamped with: the last
// version EndUpdate set, or a higher one an engine or trainer reported.
func (c *Client) PolicyVersion() int64 {
	c.gate.mu.Lock()
	defer c.gate.mu.Unlock()
	return c.gate.current()
}

// ObserveVersion records a policy version the trainer reports (CollectGroups
// credits) or an engine reported: versions only move forward.
func (c *Client) ObserveVersion(v int64) { c.gate.observe(v) }

// SetVersion sets the starting version (a job's policy_version).
func (c *Client) SetVersion(v int64) {
	c.gate.mu.Lock()
	c.gate.version = max(c.gate.version, v)
	c.gate.mu.Unlock()
}

// Updating reports whether an update is in progress.
func (c *Client) Updating() bool {
	c.gate.mu.Lock()
	defer c.gate.mu.Unlock()
	return c.gate.updating
}

// PauseSupported reports whether the backend's engines have a pause API
// (vLLM and SGLang); the others get the drain-and-wait fallback.
func (c *Client) PauseSupported() bool {
	switch c.cfg.Backend {
	case BackendVLLM, BackendVLLMGenerate, BackendChat, BackendSGLang:
		return !c.llama
	}
	return false
}

func (c *Client) sglang() bool { return c.cfg.Backend == BackendSGLang }

// BeginUpdate closes admission and pauses every engine of the pool in mode.
// It returns once the engines are paused (wait mode and the fallback: once
// every admitted generation has ended), so the trainer may load weights.
func (c *Client) BeginUpdate(ctx context.Context, mode string) (UpdateStats, error) {
	t0 := time.Now()
	st := UpdateStats{Mode: mode}
	switch mode {
	case PauseKeep, PauseWait, PauseAbort:
	default:
		return st, fmt.Errorf("%w: pause mode %q, want one of %s", ErrUpdate, mode, strings.Join(PauseModes(), ", "))
	}
	g := c.gate
	g.mu.Lock()
	if g.updating {
		g.mu.Unlock()
		return st, fmt.Errorf("%w: an update (mode %s) is already in progress; EndUpdate first", ErrUpdate, g.mode)
	}
	g.updating, g.mode = true, mode
	g.open = make(chan struct{})
	st.InFlight = g.inflight
	g.mu.Unlock()
	fail := func(err error) (UpdateStats, error) {
		c.reopen()
		return st, err
	}
	if !c.PauseSupported() {
		st.Fallback = true
		c.log.Info("policy update: engines have no pause API; draining in-flight generations", "backend", c.cfg.Backend, "mode", mode)
		if err := c.drain(ctx); err != nil {
			return fail(err)
		}
		st.PauseTook = time.Since(t0)
		return st, nil
	}
	if mode == PauseWait {
		// Drain before pausing: a request admitted just before the gate
		// closed may reach a paused engine and wait there for a resume
		// that a drain would never let come.
		if err := c.drain(ctx); err != nil {
			return fail(err)
		}
	}
	if err := c.pauseEngines(ctx, mode); err != nil {
		// Leave no engine paused behind a failed begin.
		_ = c.resumeEngines(context.WithoutCancel(ctx))
		return fail(err)
	}
	st.PauseTook = time.Since(t0)
	return st, nil
}

// EndUpdate resumes the engines, stamps subsequent tokens with version and
// reopens admission. version must not go backwards.
func (c *Client) EndUpdate(ctx context.Context, version int64) (UpdateStats, error) {
	t0 := time.Now()
	g := c.gate
	g.mu.Lock()
	if !g.updating {
		g.mu.Unlock()
		return UpdateStats{}, fmt.Errorf("%w: no update in progress (BeginUpdate first)", ErrUpdate)
	}
	if version < g.current() {
		cur := g.current()
		g.mu.Unlock()
		return UpdateStats{}, fmt.Errorf("%w: version %d is older than the current version %d", ErrUpdate, version, cur)
	}
	mode := g.mode
	g.mu.Unlock()
	st := UpdateStats{Mode: mode, Fallback: !c.PauseSupported()}
	// The version moves before the engines resume: a keep-mode generation
	// that continues must not be read as the old version's.
	g.mu.Lock()
	g.version = version
	g.epoch++
	g.mu.Unlock()
	var err error
	if c.PauseSupported() {
		err = c.resumeEngines(ctx)
	}
	c.reopen()
	st.ResumeTook = time.Since(t0)
	return st, err
}

func (c *Client) reopen() {
	g := c.gate
	g.mu.Lock()
	if g.updating {
		g.updating = false
		close(g.open)
	}
	g.mu.Unlock()
}

// drain waits until no admitted generation is in flight.
func (c *Client) drain(ctx context.Context) error {
	for {
		c.gate.mu.Lock()
		n, idle := c.gate.inflight, c.gate.idle
		c.gate.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return fmt.Errorf("%w: draining %d in-flight generations: %w", ErrUpdate, n, ctx.Err())
		}
	}
}

func (c *Client) pauseEngines(ctx context.Context, mode string) error {
	if c.sglang() {
		// SGLang: abort → abort, keep → in_place; wait is the service's drain.
		m := map[string]string{PauseAbort: "abort", PauseKeep: "in_place", PauseWait: "in_place"}[mode]
		if mode == PauseWait {
			return nil // drained already, with admission closed; nothing to pause
		}
		return c.eachEngine(ctx, http.MethodPost, "/pause_generation", map[string]string{"mode": m})
	}
	q := "/pause?mode=" + mode + "&clear_cache=false"
	if mode == PauseWait {
		// vLLM's wait mode blocks until in-flight requests finish.
		q = "/pause?mode=wait&clear_cache=false"
	}
	return c.eachEngine(ctx, http.MethodPost, q, nil)
}

func (c *Client) resumeEngines(ctx context.Context) error {
	if c.sglang() {
		return c.eachEngine(ctx, http.MethodPost, "/continue_generation", map[string]any{})
	}
	return c.eachEngine(ctx, http.MethodPost, "/resume", nil)
}

// eachEngine calls path on every endpoint of the pool, in parallel, and
// returns the first error naming its endpoint.
func (c *Client) eachEngine(ctx context.Context, method, path string, body any) error {
	eps := c.pool.Endpoints()
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() {
			if err := c.pool.caller.doJSON(ctx, ep, method, path, "policy-update", body, nil); err != nil {
				errs[i] = fmt.Errorf("%w: %s%s: %w", ErrUpdate, ep, path, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// EngineVersion asks one engine for its weight version (GET
// /get_weight_version, SGLang's route; the simulator serves it in every
// flavour). ok is false when the engine has no such route or the version
// is not an integer.
func (c *Client) EngineVersion(ctx context.Context, endpoint string) (v int64, ok bool, err error) {
	var out struct {
		WeightVersion any `json:"weight_version"`
	}
	if err := c.pool.caller.doJSON(ctx, endpoint, http.MethodGet, "/get_weight_version", "", nil, &out); err != nil {
		var e *Error
		if errors.As(err, &e) && e.Status == http.StatusNotFound {
			return 0, false, nil
		}
		return 0, false, err
	}
	v, ok = parseVersion(out.WeightVersion)
	return v, ok, nil
}

func parseVersion(x any) (int64, bool) {
	switch t := x.(type) {
	case float64:
		return int64(t), t == float64(int64(t))
	case string:
		v, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
		return v, err == nil
	case int64:
		return t, true
	}
	return 0, false
}

// versionSink captures the engine-reported version of one response (the
// VersionHeader); carried in the request context.
type versionSink struct {
	mu sync.Mutex
	v  int64
	ok bool
}

type versionSinkKey struct{}

func withVersionSink(ctx context.Context) (context.Context, *versionSink) {
	s := &versionSink{}
	return context.WithValue(ctx, versionSinkKey{}, s), s
}

func recordVersionHeader(ctx context.Context, h http.Header) {
	s, _ := ctx.Value(versionSinkKey{}).(*versionSink)
	if s == nil {
		return
	}
	raw := h.Get(VersionHeader)
	if raw == "" {
		return
	}
	if v, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64); err == nil {
		s.mu.Lock()
		s.v, s.ok = v, true
		s.mu.Unlock()
	}
}

func (s *versionSink) get() (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.v, s.ok
}

// stamp is the version a generation's tokens are recorded under: the
// engine's own report when it gave one and no coordinated update spanned
// the request, else the version in force at admission (for a request an
// update froze in keep mode, the older version: a lower bound, so a
// staleness bound is never under-reported).
func (c *Client) stamp(t ticket, engine int64, engineOK bool) (v int64, spanned bool, to int64) {
	c.gate.mu.Lock()
	epoch, cur := c.gate.epoch, c.gate.current()
	c.gate.mu.Unlock()
	spanned = epoch != t.epoch
	if engineOK {
		c.gate.observe(engine)
		if !spanned {
			return engine, false, engine
		}
		return min(engine, t.version), true, cur
	}
	return t.version, spanned, cur
}

// maxStalledCuts bounds the consecutive aborted generations that return no
// new token (an engine aborting everything, forever).
const maxStalledCuts = 8

// sampleTurn runs one turn's generation through the update gate. A
// generation cut by an abort (finish_reason "abort") is continued once
// admission reopens: the prompt plus the ids already sampled, with the
// remaining max_tokens; nothing is re-tokenised. It returns the joined
// sample, the version of each sampled id and the cuts, with positions
// relative to the turn's first sampled id.
func (e *tokenEpisode) sampleTurn(ctx context.Context, prompt []int32, maxTokens int, reqID string, turnNo int) (sample, []int64, []Cut, error) {
	var acc sample
	var vers []int64
	var cuts []Cut
	cur := prompt
	stalled := 0
	parts := 0
	var first int64 // the first part's version
	for {
		id := reqID
		if parts > 0 {
			id = reqID + "-c" + strconv.Itoa(parts)
		}
		parts++
		t, err := e.c.gate.enter(ctx)
		if err != nil {
			return sample{}, nil, nil, err
		}
		gctx, sink := withVersionSink(ctx)
		s, err := e.c.gen.generate(gctx, e.c.pool, genInput{
			model: e.spec.Model, prompt: cur, promptJSON: e.promptJSON(cur), maxTokens: maxTokens - len(acc.ids), s: e.spec.Sampling,
			opts:    CallOptions{Affinity: &e.aff, RequestID: id},
			experts: e.c.cfg.RoutedExperts, topk: e.c.cfg.RoutedExpertsTopK,
		})
		if err != nil {
			e.c.gate.exit()
			return sample{}, nil, nil, err
		}
		ev, evOK := sink.get()
		if s.versionOK {
			ev, evOK = s.version, true
		}
		// Stamped before leaving the gate: a drain (wait mode) waits for
		// the exit, so an update cannot end between the response and its
		// stamp.
		v, spanned, to := e.c.stamp(t, ev, evOK)
		e.c.gate.exit()
		// The engine's per-token versions, when it reports them, are exact
		// even across a keep-mode freeze; otherwise every id of the part
		// gets the stamp.
		pvers, exact := expandVersions(s.spans, len(s.ids), t.version) // checked by the generator
		partFirst := v
		if exact && len(pvers) > 0 {
			partFirst = pvers[0]
			// The gate keeps the highest version seen: one observe, not
			// one client-wide lock per sampled id.
			e.c.gate.observe(slices.Max(pvers))
		}
		off := len(acc.ids)
		if parts == 1 {
			first = partFirst
		}
		if parts > 1 {
			from := first
			if len(vers) > 0 {
				from = vers[len(vers)-1]
			}
			cuts = append(cuts, Cut{Turn: turnNo, Position: off, Kind: PauseAbort, From: from, To: partFirst})
		}
		switch {
		case exact:
			for i, pv := range pvers {
				if i > 0 && pv != pvers[i-1] {
					cuts = append(cuts, Cut{Turn: turnNo, Position: off + i, Kind: PauseKeep, From: pvers[i-1], To: pv})
				}
			}
		case spanned && s.finish != "abort":
			cuts = append(cuts, Cut{Turn: turnNo, Position: -1, Kind: PauseKeep, From: v, To: to})
		}
		acc.ids = append(acc.ids, s.ids...)
		acc.logprobs = append(acc.logprobs, s.logprobs...)
		for _, u := range s.unscored {
			acc.unscored = append(acc.unscored, off+u)
		}
		if exact {
			vers = append(vers, pvers...)
		} else {
			for range s.ids {
				vers = append(vers, v)
			}
		}
		if s.routing != nil {
			// Each part's prompt holds the earlier parts' ids: the last
			// part's routing covers the whole turn.
			acc.routing = s.routing
		}
		acc.finish, acc.stop, acc.endpoint, acc.text, acc.pieces = s.finish, s.stop, s.endpoint, s.text, s.pieces
		if s.finish != "abort" {
			break
		}
		if len(s.ids) == 0 {
			stalled++
			if stalled > maxStalledCuts {
				return sample{}, nil, nil, badAnswer(s.endpoint, e.c.gen.name(), id, "%d consecutive generations aborted without a new token", stalled)
			}
		} else {
			stalled = 0
		}
		if len(acc.ids) >= maxTokens {
			// Cut exactly at the budget: a length stop.
			acc.finish, acc.stop = "length", stopNone
			break
		}
		cur = append(slices.Clip(prompt), acc.ids...)
	}
	if parts > 1 {
		// Each part's text was decoded on its own (a cut may split a
		// character): decode the joined ids instead.
		acc.text, acc.pieces = nil, nil
	}
	if len(vers) == 0 {
		vers = append(vers, e.c.PolicyVersion())
	}
	return acc, vers, cuts, nil
}
