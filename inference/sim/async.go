package sim

import (
	"context"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// In-flight weight updates, as vLLM and SGLang expose them for
// asynchronous RL:
//
//	vLLM:   POST /pause?mode=keep|wait|abort&clear_cache=..  {"status":"paused"}
//	        POST /resume                                     {"status":"resumed"}
//	        GET  /is_paused                                  {"is_paused":bool}
//	        POST /abort_requests {"request_ids":[..]}        (none: all)
//	SGLang: POST /pause_generation {"mode":"abort"|"in_place"|"retract"}
//	        POST /continue_generation
//	        POST /abort_request {"rid":..,"abort_all":bool}
//	        GET  /get_weight_version, POST /update_weight_version,
//	        POST /update_weights_from_disk {"model_path","weight_version"}
//
// A generation is modelled as producing its tokens evenly over its
// latency. abort cuts it: the response carries the tokens produced so far
// with finish_reason "abort". keep freezes it until resume; the tokens
// after the freeze are drawn under the version then current. wait blocks
// the pause until in-flight generations end. While paused, new generation
// requests wait for resume. The policy version changes with the weight
// routes; every generation response carries it (header X-Policy-Version,
// and SGLang's meta_info.weight_version). A request whose prompt is an
// aborted generation's prompt plus its partial tokens continues that
// generation's plan: the rest of the same text, logprobs drawn under the
// version now current.

// VersionHeader is the response header carrying the policy version.
const VersionHeader = "X-Policy-Version"

// GenerationRecord is what the simulator sampled for one generation
// request (Config.RecordGenerations).
type GenerationRecord struct {
	RequestID string
	Prompt    []int
	IDs       []int
	Logprobs  []float64
	Versions  []int64 // per id
	Finish    string
	// FrozenAt is the number of ids produced when a keep-mode pause froze
	// the request (-1: never frozen).
	FrozenAt int
}

// maxGenerationRecords bounds the recorded generations.
const maxGenerationRecords = 1 << 16

type genRun struct {
	rid     string
	wake    chan struct{}
	aborted bool
	// abortVersion is the version when the abort came: the weights a
	// trainer loads after the pause never touched this generation.
	abortVersion int64
}

type continuation struct {
	ids    []int
	finish string
	stop   any
	seed   uint64
}

type control struct {
	mu         sync.Mutex
	paused     bool
	mode       string
	resumed    chan struct{} // closed while not paused
	runs       map[*genRun]struct{}
	idle       chan struct{} // closed and replaced when runs empties
	version    int64
	versionSet bool
	weightName string // SGLang's weight_version string
	// names maps each version a generation was drawn under to its
	// weight_version string (SGLang's per-token spans name versions).
	names   map[int64]string
	conts   map[uint64]continuation
	records []GenerationRecord
	pauses  int64
	aborted int64
}

func newControl() *control {
	c := &control{resumed: make(chan struct{}), runs: map[*genRun]struct{}{}, idle: make(chan struct{}), conts: map[uint64]continuation{}, weightName: "default", names: map[int64]string{0: "default"}}
	close(c.resumed)
	return c
}

func (c *control) wakeAllLocked() {
	for g := range c.runs {
		select {
		case g.wake <- struct{}{}:
		default:
		}
	}
}

// admit waits while generation is paused.
func (c *control) admit(ctx context.Context, stopping <-chan struct{}) bool {
	for {
		c.mu.Lock()
		if !c.paused {
			c.mu.Unlock()
			return true
		}
		ch := c.resumed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		case <-stopping:
			return false
		}
	}
}

func (c *control) currentVersion() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

// run models one generation of n tokens taking d. It returns the tokens
// produced, whether an abort cut it, where a keep-mode pause froze it
// (-1: never), and false when the client or server went away.
func (c *control) run(ctx context.Context, stopping <-chan struct{}, rid string, n int, d time.Duration) (k int, aborted bool, frozenAt int, end int64, alive bool) {
	g := &genRun{rid: rid, wake: make(chan struct{}, 1)}
	c.mu.Lock()
	c.runs[g] = struct{}{}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.runs, g)
		if len(c.runs) == 0 {
			close(c.idle)
			c.idle = make(chan struct{})
		}
		c.mu.Unlock()
	}()
	produced := func(rem time.Duration) int {
		if d <= 0 {
			return n
		}
		return min(n, int(int64(n)*int64(d-rem)/int64(d)))
	}
	remaining := d
	frozenAt = -1
	for {
		c.mu.Lock()
		ab, abv := g.aborted, g.abortVersion
		frozen := c.paused && c.mode == "keep"
		resumed := c.resumed
		cur := c.version
		c.mu.Unlock()
		if ab {
			return produced(remaining), true, frozenAt, abv, true
		}
		if frozen {
			if frozenAt < 0 {
				frozenAt = produced(remaining)
			}
			select {
			case <-resumed:
			case <-g.wake:
			case <-ctx.Done():
				return 0, false, frozenAt, 0, false
			case <-stopping:
				return 0, false, frozenAt, 0, false
			}
			continue
		}
		if remaining <= 0 {
			return n, false, frozenAt, cur, true
		}
		t0 := time.Now()
		t := time.NewTimer(remaining)
		select {
		case <-t.C:
			remaining = 0
		case <-g.wake:
			t.Stop()
			remaining -= time.Since(t0)
		case <-ctx.Done():
			t.Stop()
			return 0, false, frozenAt, 0, false
		case <-stopping:
			t.Stop()
			return 0, false, frozenAt, 0, false
		}
	}
}

// pause stops admission; abort cuts every running generation, keep freezes
// them, wait returns once they have all ended.
func (c *control) pause(ctx context.Context, mode string) error {
	c.mu.Lock()
	if !c.paused {
		c.paused = true
		c.resumed = make(chan struct{})
	}
	c.mode = mode
	c.pauses++
	if mode == "abort" {
		for g := range c.runs {
			g.aborted, g.abortVersion = true, c.version
		}
		c.aborted += int64(len(c.runs))
	}
	c.wakeAllLocked()
	c.mu.Unlock()
	if mode != "wait" {
		return nil
	}
	for {
		c.mu.Lock()
		n, idle := len(c.runs), c.idle
		c.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *control) resume() {
	c.mu.Lock()
	if c.paused {
		c.paused = false
		close(c.resumed)
	}
	c.wakeAllLocked()
	c.mu.Unlock()
}

// abort cuts the running generations whose request id is in ids (all when
// ids is empty) and returns how many.
func (c *control) abort(ids []string) int {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for g := range c.runs {
		if len(ids) == 0 || want[g.rid] {
			g.aborted, g.abortVersion = true, c.version
			n++
			select {
			case g.wake <- struct{}{}:
			default:
			}
		}
	}
	c.aborted += int64(n)
	return n
}

func (c *control) setVersion(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, err := strconv.ParseInt(strings.TrimSpace(name), 10, 64); err == nil {
		c.version = v
	} else {
		c.version++
		if name == "" {
			name = strconv.FormatInt(c.version, 10)
		}
	}
	c.weightName = name
	c.versionSet = true
	if len(c.names) < 1<<16 {
		c.names[c.version] = name
	}
}

// versionName is the weight_version string of version v.
func (c *control) versionName(v int64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.names[v]; ok {
		return n
	}
	return strconv.FormatInt(v, 10)
}

func hashPrompt(ids []int) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, id := range ids {
		b[0], b[1], b[2], b[3] = byte(id), byte(id>>8), byte(id>>16), byte(id>>24)
		h.Write(b[:])
	}
	return h.Sum64()
}

const maxContinuations = 1 << 14

func (c *control) storeContinuation(fullPrompt []int, ct continuation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.conts) >= maxContinuations {
		for k := range c.conts { // drop an arbitrary old one
			delete(c.conts, k)
			break
		}
	}
	c.conts[hashPrompt(fullPrompt)] = ct
}

func (c *control) takeContinuation(prompt []int) (continuation, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := hashPrompt(prompt)
	ct, ok := c.conts[k]
	if ok {
		delete(c.conts, k)
	}
	return ct, ok
}

func (c *control) record(r GenerationRecord) {
	c.mu.Lock()
	if len(c.records) < maxGenerationRecords {
		c.records = append(c.records, r)
	}
	c.mu.Unlock()
}

// versionLogprobs draws n logprobs for a generation under version v from
// position from on.
func versionLogprobs(seed uint64, choice int, v int64, from, n int) []float64 {
	rng := rand.New(rand.NewPCG(seed^uint64(v)*0x9e3779b97f4a7c15, uint64(choice)|uint64(from)<<20|3<<40))
	out := make([]float64, n)
	for j := range out {
		out[j] = sampleLogprob(rng)
	}
	return out
}

// Generations returns what the simulator sampled for each generation
// request so far (Config.RecordGenerations; at most 65,536).
func (s *Server) Generations() []GenerationRecord {
	s.h.ctl.mu.Lock()
	defer s.h.ctl.mu.Unlock()
	return append([]GenerationRecord(nil), s.h.ctl.records...)
}

// AsyncStats counts pause calls and generations cut by aborts.
type AsyncStats struct {
	Pauses, Aborted int64
	Version         int64
	Paused          bool
	Running         int // generations being produced (frozen ones included)
}

// Async returns the pause and version state.
func (s *Server) Async() AsyncStats {
	c := s.h.ctl
	c.mu.Lock()
	defer c.mu.Unlock()
	return AsyncStats{Pauses: c.pauses, Aborted: c.aborted, Version: c.version, Paused: c.paused, Running: len(c.runs)}
}

// SetPolicyVersion loads "weights" of version v (as a trainer would
// through SGLang's update_weights_from_disk).
func (s *Server) SetPolicyVersion(v int64) { s.h.ctl.setVersion(strconv.FormatInt(v, 10)) }

// ---- routes ----

func (h *handler) asyncRoutes() {
	h.mux.HandleFunc("POST /pause", h.vllmPause)
	h.mux.HandleFunc("POST /resume", func(w http.ResponseWriter, _ *http.Request) {
		h.ctl.resume()
		writeJSON(w, 200, map[string]string{"status": "resumed"})
	})
	h.mux.HandleFunc("GET /is_paused", func(w http.ResponseWriter, _ *http.Request) {
		h.ctl.mu.Lock()
		p := h.ctl.paused
		h.ctl.mu.Unlock()
		writeJSON(w, 200, map[string]bool{"is_paused": p})
	})
	h.mux.HandleFunc("POST /abort_requests", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			RequestIDs []string `json:"request_ids"`
		}
		if r.ContentLength != 0 {
			if e := decodeRequest(r, &req); e != nil {
				writeError(w, e)
				return
			}
		}
		n := h.ctl.abort(req.RequestIDs)
		writeJSON(w, 200, map[string]any{"status": "aborted", "aborted": n})
	})
	h.mux.HandleFunc("POST /pause_generation", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Mode string `json:"mode"`
		}
		if r.ContentLength != 0 {
			if e := decodeRequest(r, &req); e != nil {
				writeError(w, e)
				return
			}
		}
		var mode string
		switch req.Mode {
		case "", "abort":
			mode = "abort"
		case "in_place", "retract":
			mode = "keep"
		default:
			writeError(w, badRequest("mode must be one of abort, in_place, retract, got %q", req.Mode))
			return
		}
		if err := h.ctl.pause(r.Context(), mode); err != nil {
			return
		}
		writeJSON(w, 200, map[string]string{"message": "Generation paused successfully.", "status": "ok"})
	})
	h.mux.HandleFunc("POST /continue_generation", func(w http.ResponseWriter, _ *http.Request) {
		h.ctl.resume()
		writeJSON(w, 200, map[string]string{"message": "Generation continued successfully.", "status": "ok"})
	})
	h.mux.HandleFunc("POST /abort_request", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Rid      string `json:"rid"`
			AbortAll bool   `json:"abort_all"`
		}
		if e := decodeRequest(r, &req); e != nil {
			writeError(w, e)
			return
		}
		var ids []string
		if !req.AbortAll {
			if req.Rid == "" {
				writeError(w, badRequest("rid is required unless abort_all is true"))
				return
			}
			ids = []string{req.Rid}
		}
		h.ctl.abort(ids)
		w.WriteHeader(http.StatusOK)
	})
	h.mux.HandleFunc("GET /get_weight_version", func(w http.ResponseWriter, _ *http.Request) {
		h.ctl.mu.Lock()
		name := h.ctl.weightName
		h.ctl.mu.Unlock()
		writeJSON(w, 200, map[string]string{"weight_version": name})
	})
	h.mux.HandleFunc("POST /update_weight_version", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			NewVersion       string `json:"new_version"`
			AbortAllRequests bool   `json:"abort_all_requests"`
		}
		if e := decodeRequest(r, &req); e != nil {
			writeError(w, e)
			return
		}
		if req.NewVersion == "" {
			writeError(w, badRequest("new_version is required"))
			return
		}
		if req.AbortAllRequests {
			h.ctl.abort(nil)
		}
		h.ctl.setVersion(req.NewVersion)
		writeJSON(w, 200, map[string]any{"success": true, "message": "Weight version updated to " + req.NewVersion + "."})
	})
	h.mux.HandleFunc("POST /update_weights_from_disk", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ModelPath     string  `json:"model_path"`
			WeightVersion *string `json:"weight_version"`
		}
		if e := decodeRequest(r, &req); e != nil {
			writeError(w, e)
			return
		}
		if req.ModelPath == "" {
			writeError(w, badRequest("model_path is required"))
			return
		}
		name := ""
		if req.WeightVersion != nil {
			name = *req.WeightVersion
		}
		h.ctl.setVersion(name)
		writeJSON(w, 200, map[string]any{"success": true, "message": "Succeeded to update model weights.", "num_paused_requests": 0})
	})
}

func (h *handler) vllmPause(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	mode := q.Get("mode")
	if mode == "" {
		mode = "abort" // vLLM's default
	}
	if b, _ := strconv.ParseBool(q.Get("wait_for_inflight_requests")); b {
		mode = "wait" // the deprecated knob
	}
	switch mode {
	case "keep", "wait", "abort":
	default:
		writeError(w, badRequest("Invalid pause mode: %q. Must be one of ['abort', 'wait', 'keep'].", mode))
		return
	}
	if cc := q.Get("clear_cache"); cc != "" {
		if _, err := strconv.ParseBool(cc); err != nil {
			writeError(w, badRequest("clear_cache must be a boolean, got %q", cc))
			return
		}
		// The simulator has no KV or prefix cache to clear.
	}
	if err := h.ctl.pause(r.Context(), mode); err != nil {
		return
	}
	writeJSON(w, 200, map[string]string{"status": "paused"})
}

// requestIDOf names a generation for /abort_requests: the X-Request-Id
// header, else the body's request id.
func requestIDOf(r *http.Request) string {
	return r.Header.Get("X-Request-Id")
}

// asyncGeneration applies the pause state and versions to one sampled
// batch: it waits for admission, continues an aborted generation's plan,
// models the generation's progress (abort, keep) and records what was
// sampled. It reports false when the response was written or the client
// left.
func (h *handler) asyncGeneration(w http.ResponseWriter, r *http.Request, prompts [][]int, p genParams, defaultMax int) ([][]genChoice, bool) {
	ctx := r.Context()
	if !h.ctl.admit(ctx, h.stopping) {
		h.gone(w)
		return nil, false
	}
	v0 := h.ctl.currentVersion()
	choices := make([][]genChoice, len(prompts))
	seeds := make([]uint64, len(prompts))
	longest := 0
	for pi, ids := range prompts {
		seeds[pi] = seedOf(p.Seed, ids, h.cfg.Seed)
		if ct, ok := h.ctl.takeContinuation(ids); ok && max(p.N, 1) == 1 {
			rest := ct.ids
			c := genChoice{Finish: ct.finish, StopReason: ct.stop}
			if p.MaxTokens != nil && len(rest) > *p.MaxTokens {
				rest, c.Finish, c.StopReason = rest[:*p.MaxTokens], "length", nil
			}
			c.IDs = append([]int(nil), rest...)
			c.Logprobs = versionLogprobs(ct.seed, 0, v0, len(ids), len(c.IDs))
			choices[pi] = []genChoice{c}
			seeds[pi] = ct.seed
		} else {
			cs, e := h.generate(ids, p, defaultMax)
			if e != nil {
				writeError(w, e)
				return nil, false
			}
			if v0 != 0 {
				for ci := range cs {
					cs[ci].Logprobs = versionLogprobs(seeds[pi], ci, v0, 0, len(cs[ci].IDs))
				}
			}
			choices[pi] = cs
		}
		for _, c := range choices[pi] {
			longest = max(longest, len(c.IDs))
		}
	}
	k, aborted, frozenAt, v1, alive := h.ctl.run(ctx, h.stopping, requestIDOf(r), longest, h.latency(longest, seedOf(p.Seed, prompts[0], h.cfg.Seed)))
	if !alive {
		h.gone(w)
		return nil, false
	}
	if frozenAt < 0 {
		// Not frozen: every token was drawn under the admission version.
		v1 = v0
	}
	for pi, cs := range choices {
		for ci := range cs {
			c := &cs[ci]
			vers := make([]int64, len(c.IDs))
			for j := range vers {
				vers[j] = v0
			}
			if frozenAt >= 0 && v1 != v0 && frozenAt < len(c.IDs) {
				// Tokens after a keep-mode freeze come from the new weights.
				copy(c.Logprobs[frozenAt:], versionLogprobs(seeds[pi], ci, v1, frozenAt, len(c.IDs)-frozenAt))
				for j := frozenAt; j < len(vers); j++ {
					vers[j] = v1
				}
			}
			if aborted && k < len(c.IDs) {
				full := append(append([]int(nil), prompts[pi]...), c.IDs[:k]...)
				h.ctl.storeContinuation(full, continuation{ids: append([]int(nil), c.IDs[k:]...), finish: c.Finish, stop: c.StopReason, seed: seeds[pi]})
				c.IDs, c.Logprobs, vers = c.IDs[:k], c.Logprobs[:k], vers[:k]
				c.Finish, c.StopReason = "abort", nil
			}
			c.Versions = vers
			if h.cfg.RecordGenerations {
				h.ctl.record(GenerationRecord{RequestID: requestIDOf(r), Prompt: prompts[pi], IDs: append([]int(nil), c.IDs...),
					Logprobs: append([]float64(nil), c.Logprobs...), Versions: vers, Finish: c.Finish, FrozenAt: frozenAt})
			}
		}
	}
	h.ctl.mu.Lock()
	set := h.ctl.versionSet
	h.ctl.mu.Unlock()
	if set {
		w.Header().Set(VersionHeader, strconv.FormatInt(v1, 10))
	}
	return choices, true
}

// weightVersionName is SGLang's meta_info.weight_version.
func (h *handler) weightVersionName() string {
	h.ctl.mu.Lock()
	defer h.ctl.mu.Unlock()
	return h.ctl.weightName
}

// gone answers 503 when the server is stopping; a client that left gets
// nothing.
func (h *handler) gone(w http.ResponseWriter) {
	select {
	case <-h.stopping:
		writeError(w, &apiError{Status: 503, Type: "ServiceUnavailableError", Msg: "server shutting down"})
	default:
	}
}
