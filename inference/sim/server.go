package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Server is a running simulator.
type Server struct {
	// URL is the base URL, e.g. "http://127.0.0.1:40123" (no trailing slash).
	URL string

	h        *handler
	srv      *http.Server
	ln       net.Listener
	cancel   context.CancelFunc
	done     chan struct{}
	closeOne sync.Once
	closeErr error

	activeConns atomic.Int64
	newConns    atomic.Int64
}

// Stats is a snapshot of the request counters.
type Stats struct {
	Requests    int64            // all requests
	ByRoute     map[string]int64 // by route pattern, e.g. "POST /v1/chat/completions"
	ByStatus    map[int]int64    // by HTTP status written (0: connection dropped)
	Faults      map[string]int64 // injected faults by kind
	InFlight    int64            // requests being served
	ActiveConns int64            // open client connections
	NewConns    int64            // connections accepted since start
	// GeneratedTokens and PromptTokens count the ids of the generation
	// routes.
	GeneratedTokens int64
	PromptTokens    int64
	// Busy is the summed wall time of the handlers, from the request's
	// headers read to the handler's return (body read, work, response
	// written): the engine's own latency, which a client's latency minus
	// Busy leaves as the client's and the network's share.
	Busy time.Duration
}

// Start serves the simulator on cfg.Addr (default 127.0.0.1:0) until Close
// or until ctx ends.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	h, err := newHandler(cfg)
	if err != nil {
		return nil, err
	}
	addr := h.cfg.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("simulator listen on %s: %w", addr, err)
	}
	base, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &Server{URL: "http://" + ln.Addr().String(), h: h, ln: ln, cancel: cancel, done: make(chan struct{})}
	s.srv = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return base },
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				s.newConns.Add(1)
				s.activeConns.Add(1)
			case http.StateClosed, http.StateHijacked:
				s.activeConns.Add(-1)
			}
		},
		ErrorLog: slog.NewLogLogger(slog.Default().Handler(), slog.LevelDebug),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("simulator stopped", "url", s.URL, "err", err)
		}
	}()
	// Stop with the caller's context as well as with Close.
	go func() {
		select {
		case <-ctx.Done():
			_ = s.Close()
		case <-s.done:
		}
	}()
	return s, nil
}

// Close stops the server: hung requests are released, in-flight requests
// get a short grace period, then every connection is closed. It waits for
// the serving goroutines to finish and is safe to call more than once.
func (s *Server) Close() error {
	s.closeOne.Do(func() {
		s.h.stopOnce.Do(func() { close(s.h.stopping) })
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := s.srv.Shutdown(ctx)
		s.cancel()
		if err != nil {
			err = s.srv.Close()
		}
		<-s.done
		s.h.wg.Wait()
		s.closeErr = err
	})
	return s.closeErr
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	st := s.h.stats()
	st.ActiveConns = s.activeConns.Load()
	st.NewConns = s.newConns.Load()
	return st
}

// NewHandler returns the simulator as an http.Handler, for embedding in
// another server. Hung requests end when the request context ends.
func NewHandler(cfg Config) (http.Handler, error) {
	return newHandler(cfg)
}

// handler holds the state shared by all routes.
type handler struct {
	cfg  Config
	tok  *Tokenizer
	tmpl *template
	mux  *http.ServeMux

	stopping chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup // request goroutines (hangs, streams)

	faultMu  sync.Mutex
	faultRNG *rand.Rand

	episodeMu sync.Mutex
	episodes  map[uint64]uint64 // unseeded episodes started, by first user message

	mu       sync.Mutex
	total    int64
	busy     time.Duration
	byRoute  map[string]int64
	byStatus map[int]int64
	faults   map[string]int64
	inFlight atomic.Int64
	promptN  atomic.Int64
	genN     atomic.Int64
	success  map[string]int64 // finished requests by finish reason
	samplers []SamplerRecord  // with Config.RecordSamplers
	ctl      *control         // pause, abort, policy version (async.go)
}

func newHandler(cfg Config) (*handler, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("simulator config: %w", err)
	}
	h := &handler{
		cfg:      c,
		tok:      NewTokenizer(),
		tmpl:     templates[c.Template],
		mux:      http.NewServeMux(),
		stopping: make(chan struct{}),
		faultRNG: rand.New(rand.NewPCG(uint64(c.Seed), 0x5eed_fa017)),
		byRoute:  map[string]int64{},
		byStatus: map[int]int64{},
		faults:   map[string]int64{},
		success:  map[string]int64{},
		episodes: map[uint64]uint64{},
		ctl:      newControl(),
	}
	h.routes()
	return h, nil
}

func (h *handler) stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := Stats{Requests: h.total, Busy: h.busy, ByRoute: map[string]int64{}, ByStatus: map[int]int64{}, Faults: map[string]int64{},
		InFlight: h.inFlight.Load(), GeneratedTokens: h.genN.Load(), PromptTokens: h.promptN.Load()}
	for k, v := range h.byRoute {
		st.ByRoute[k] = v
	}
	for k, v := range h.byStatus {
		st.ByStatus[k] = v
	}
	for k, v := range h.faults {
		st.Faults[k] = v
	}
	return st
}

// statusWriter records the status; it forwards Flush for SSE and exposes
// the underlying writer to http.ResponseController.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.wg.Add(1)
	defer h.wg.Done()
	h.inFlight.Add(1)
	defer h.inFlight.Add(-1)
	sw := &statusWriter{ResponseWriter: w}
	_, pattern := h.mux.Handler(r)
	start := time.Now()
	defer func() {
		if l := h.cfg.Logger; l != nil {
			l.Info("request", "route", pattern, "status", sw.status, "duration", time.Since(start), "request_id", r.Header.Get("X-Request-Id"))
		}
		took := time.Since(start)
		h.mu.Lock()
		h.total++
		h.busy += took
		if pattern == "" {
			pattern = "unmatched"
		}
		h.byRoute[pattern]++
		h.byStatus[sw.status]++
		h.mu.Unlock()
	}()
	if h.cfg.RecordSamplers && samplerRoutes[pattern] {
		h.recordSampler(pattern, r)
	}
	h.mux.ServeHTTP(sw, r)
}

// samplerRoutes are the generation routes whose sampler fields are
// recorded with Config.RecordSamplers.
var samplerRoutes = map[string]bool{
	"POST /completion": true, "POST /completions": true, "POST /v1/chat/completions": true, "POST /chat/completions": true,
	"POST /v1/completions": true, "POST /inference/v1/generate": true, "POST /generate": true,
}

// samplerKeys are the request fields that shape the sampling distribution,
// under every engine's spelling.
var samplerKeys = []string{"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "repeat_penalty", "presence_penalty",
	"frequency_penalty", "typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "dry_multiplier", "mirostat",
	"dynatemp_range", "dynatemp_exponent", "repeat_last_n", "min_keep", "n_probs", "post_sampling_probs", "logit_bias", "seed", "sampling_seed"}

// SamplerRecord is the sampler one generation request stated: Fields holds
// the sampler keys present in the body (top level, or inside
// sampling_params for vLLM's generate and SGLang), as decoded JSON.
type SamplerRecord struct {
	Route  string
	Fields map[string]any
}

// maxSamplerRecords bounds the recorded requests (the first ones are kept).
const maxSamplerRecords = 4096

func (h *handler) recordSampler(route string, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return
	}
	rec := SamplerRecord{Route: route, Fields: map[string]any{}}
	pick := func(m map[string]json.RawMessage) {
		for _, k := range samplerKeys {
			if raw, ok := m[k]; ok {
				var v any
				if json.Unmarshal(raw, &v) == nil {
					rec.Fields[k] = v
				}
			}
		}
	}
	pick(top)
	if raw, ok := top["sampling_params"]; ok {
		var sp map[string]json.RawMessage
		if json.Unmarshal(raw, &sp) == nil {
			pick(sp)
		}
	}
	h.mu.Lock()
	if len(h.samplers) < maxSamplerRecords {
		h.samplers = append(h.samplers, rec)
	}
	h.mu.Unlock()
}

// Samplers returns the sampler of every generation request served so far
// (Config.RecordSamplers; at most the first 4096).
func (s *Server) Samplers() []SamplerRecord {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return append([]SamplerRecord(nil), s.h.samplers...)
}

func (h *handler) countFault(kind string) {
	h.mu.Lock()
	h.faults[kind]++
	h.mu.Unlock()
}

// fault is the injected failure chosen for one request.
type fault int

const (
	faultNone fault = iota
	faultError
	faultHang
	faultDrop
	faultMalformed
	faultTruncate
)

func (f fault) String() string {
	return [...]string{"none", "error", "hang", "drop", "malformed", "truncate"}[f]
}

// drawFault draws from the server's seeded fault stream: one draw per
// generation request, in arrival order.
func (h *handler) drawFault() fault {
	fr := h.cfg.Faults
	if fr.total() == 0 {
		return faultNone
	}
	h.faultMu.Lock()
	u := h.faultRNG.Float64()
	h.faultMu.Unlock()
	for _, c := range []struct {
		rate float64
		f    fault
	}{{fr.ErrorRate, faultError}, {fr.HangRate, faultHang}, {fr.DropRate, faultDrop}, {fr.MalformedRate, faultMalformed}, {fr.TruncateRate, faultTruncate}} {
		if u < c.rate {
			h.countFault(c.f.String())
			return c.f
		}
		u -= c.rate
	}
	return faultNone
}

// preFault applies the faults that happen before any work. It reports
// whether the request is finished.
func (h *handler) preFault(w http.ResponseWriter, r *http.Request, f fault) bool {
	switch f {
	case faultError:
		writeError(w, &apiError{Status: 500, Type: "InternalServerError", Msg: "simulated engine failure (fault injection)"})
		return true
	case faultHang:
		select {
		case <-r.Context().Done():
		case <-h.stopping:
			writeError(w, &apiError{Status: 503, Type: "ServiceUnavailableError", Msg: "server shutting down"})
		}
		return true
	case faultDrop:
		// Aborting the handler makes net/http close the connection without
		// writing a response.
		panic(http.ErrAbortHandler)
	}
	return false
}

// writeBody writes a JSON body, applying the response-level faults.
func (h *handler) writeBody(w http.ResponseWriter, f fault, v any) {
	body, err := marshal(v)
	if err != nil {
		writeError(w, &apiError{Status: 500, Type: "InternalServerError", Msg: "encode response: " + err.Error()})
		return
	}
	switch f {
	case faultMalformed:
		body = append([]byte(`{"id": "sim-malformed", "choices": [{"index": 0, "text": `), body[:len(body)/3]...)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
		return
	case faultTruncate:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = w.Write(body[:len(body)/2])
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		panic(http.ErrAbortHandler)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := marshal(v)
	if err != nil {
		status, body = 500, []byte(`{"error":{"message":"encode response","type":"InternalServerError","param":null,"code":500}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// marshal encodes like Python's json.dumps: "<" and ">" stay literal, which
// matters for readability of markers such as <tool_call> in raw bodies.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// writeError writes vLLM's error shape.
func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Status, map[string]any{"error": map[string]any{
		"message": e.Msg, "type": e.Type, "param": nil, "code": e.Status,
	}})
}

// wait sleeps for d, returning false when the request or the server ends
// first.
func (h *handler) wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-h.stopping:
		return false
	}
}

// latency is the modelled generation time for n tokens.
func (h *handler) latency(n int, seed uint64) time.Duration {
	l := h.cfg.Latency
	d := l.TTFT + time.Duration(n)*l.PerToken
	if l.Jitter > 0 {
		d += time.Duration(rand.New(rand.NewPCG(seed, 0x717e)).Int64N(int64(l.Jitter)))
	}
	return d
}
