// Package gatewaybench measures the token-capturing gateway (gateway/capture
// with the OpenAI Chat door): its per-call overhead against a plain Go
// reverse proxy to the same engine, and many concurrent sessions at a slow
// engine served by a gateway in a process of its own (Serve), so that the
// load generator and the engine are not counted in its CPU and RSS.
package gatewaybench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/builtin"
	"github.com/rollout-rl/rollout/gateway/capture"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

// Model is the model name the harness asks for (the simulator's).
const Model = "rollout-sim"

// Tools is the harness's one tool: the simulator's bench workload calls it.
var Tools = []openai.Tool{{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
	Name: "noop", Description: "Do nothing with a path",
	Parameters: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)}}}

// SimBench is the simulator workload of a conversation of turns tool calls
// (one call to noop each) and a final answer.
func SimBench(turns int) *sim.Bench {
	return &sim.Bench{Tool: "noop", CallsPerTurn: 1, Turns: turns, Arguments: map[string]any{"path": "a.txt"}}
}

// Harness is a minimal OpenAI-Chat tool-using agent: it posts its history,
// appends the assistant message as it was returned and one tool result
// per call, and stops at a reply without tool calls.
type Harness struct {
	Client *http.Client
	// MaxCalls bounds a conversation (a model that never stops).
	MaxCalls int
	// Busy, when set, reads the engine's summed handler time
	// (sim.Stats.Busy): Conversation then reports the engine's time
	// during each call (calls one at a time).
	Busy func() time.Duration
	// ToolResult is the content of every tool result ("ok" when empty).
	ToolResult string
}

// Call is one timed call: its latency as the harness saw it and, with
// Harness.Busy, the engine's own time within it.
type Call struct{ Latency, Engine time.Duration }

// Latencies are the calls' latencies; net subtracts the engine's time.
func Latencies(calls []Call, net bool) []time.Duration {
	out := make([]time.Duration, len(calls))
	for i, c := range calls {
		out[i] = c.Latency
		if net {
			out[i] -= c.Engine
		}
	}
	return out
}

// Conversation runs one conversation against base (".../v1") and returns
// each call's times.
func (h Harness) Conversation(ctx context.Context, base string) ([]Call, error) {
	msgs := []openai.ChatCompletionMessage{
		{Role: openai.ChatMessageRoleSystem, Content: "You are a coding agent. Use the noop tool."},
		{Role: openai.ChatMessageRoleUser, Content: "Run the bench task on a.txt."},
	}
	var lat []Call
	for range cmp.Or(h.MaxCalls, 16) {
		body, err := json.Marshal(openai.ChatCompletionRequest{Model: Model, Messages: msgs, Tools: Tools})
		if err != nil {
			return lat, err
		}
		var b0 time.Duration
		if h.Busy != nil {
			b0 = h.Busy()
		}
		t0 := time.Now()
		reply, err := h.post(ctx, base+"/chat/completions", body)
		c := Call{Latency: time.Since(t0)}
		if h.Busy != nil {
			c.Engine = h.Busy() - b0
		}
		lat = append(lat, c)
		if err != nil {
			return lat, fmt.Errorf("call %d: %w", len(lat), err)
		}
		msgs = append(msgs, reply)
		if len(reply.ToolCalls) == 0 {
			return lat, nil
		}
		for _, tc := range reply.ToolCalls {
			msgs = append(msgs, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleTool, ToolCallID: tc.ID, Content: cmp.Or(h.ToolResult, "ok")})
		}
	}
	return lat, fmt.Errorf("no final answer within %d calls", len(lat))
}

func (h Harness) post(ctx context.Context, u string, body []byte) (openai.ChatCompletionMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return openai.ChatCompletionMessage{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.Client.Do(req)
	if err != nil {
		return openai.ChatCompletionMessage{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return openai.ChatCompletionMessage{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return openai.ChatCompletionMessage{}, fmt.Errorf("status %d: %.300s", resp.StatusCode, raw)
	}
	var out openai.ChatCompletionResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		return openai.ChatCompletionMessage{}, fmt.Errorf("decode the reply: %w", err)
	}
	if len(out.Choices) == 0 {
		return openai.ChatCompletionMessage{}, errors.New("reply without choices")
	}
	return out.Choices[0].Message, nil
}

// OverheadConfig configures Overhead.
type OverheadConfig struct {
	// Engine is the simulator flavour (sim.EngineVLLM, sim.EngineLlamaCpp)
	// and Backend the gateway's tokens-mode backend for it.
	Engine, Backend string
	// Conversations per side; Turns tool calls per conversation (plus the
	// final answer).
	Conversations, Turns int
	// LocalRender makes the gateway render in-process from the
	// simulator's model files (inference.Config.LocalRender: the
	// simulator's model as a Hugging Face directory, for either flavour).
	LocalRender bool
	// ToolResult is every tool result's content ("ok" when empty): a
	// long one makes a long history.
	ToolResult string
}

// OverheadReport is the same conversations through a plain reverse proxy
// to the simulator's chat route and through the gateway (tokens mode on
// the same simulator).
type OverheadReport struct {
	Calls                  int // per side
	ProxyP50, ProxyP90     time.Duration
	GatewayP50, GatewayP90 time.Duration
	// The same less the engine's own time within each call (the
	// simulator's handler time, sim.Stats.Busy), and that engine time's
	// mean per call on each side.
	ProxyNetP50, ProxyNetP90     time.Duration
	GatewayNetP50, GatewayNetP90 time.Duration
	ProxyEngine, GatewayEngine   time.Duration
	// Engine requests per call on each side, and the gateway's by route.
	ProxyRequestsPerCall, GatewayRequestsPerCall float64
	GatewayRoutes                                map[string]float64
	// Sessions closed with exactly one branch and every call recorded OK.
	CleanSessions, Sessions int
}

// Overhead alternates conversations through the proxy and the gateway on
// one zero-latency in-process simulator and reports per-call latencies.
func Overhead(ctx context.Context, cfg OverheadConfig) (OverheadReport, error) {
	srv, err := sim.Start(ctx, sim.Config{Family: "hermes", Engine: cfg.Engine, Bench: SimBench(cfg.Turns), MaxModelLen: 1 << 18})
	if err != nil {
		return OverheadReport{}, fmt.Errorf("start simulator: %w", err)
	}
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	if err != nil {
		return OverheadReport{}, err
	}
	proxy := &http.Server{Handler: httputil.NewSingleHostReverseProxy(u)}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return OverheadReport{}, err
	}
	go func() { _ = proxy.Serve(pl) }()
	defer proxy.Close()

	var model string
	if cfg.LocalRender {
		dir, err := os.MkdirTemp("", "rollout-bench-model-*")
		if err != nil {
			return OverheadReport{}, err
		}
		defer os.RemoveAll(dir)
		if err := sim.WriteHFModel(dir, "hermes"); err != nil {
			return OverheadReport{}, fmt.Errorf("write the simulator's model directory: %w", err)
		}
		model = dir
	}
	gw, err := NewGateway(srv.URL, cfg.Backend, 1<<20, model)
	if err != nil {
		return OverheadReport{}, err
	}
	defer gw.Close()
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return OverheadReport{}, err
	}
	gsrv := &http.Server{Handler: capture.Handler(gw.Gateway, builtin.FrontDoors())}
	go func() { _ = gsrv.Serve(gl) }()
	defer gsrv.Close()

	tr := &http.Transport{MaxIdleConnsPerHost: 4, Proxy: nil}
	defer tr.CloseIdleConnections()
	h := Harness{Client: &http.Client{Transport: tr}, Busy: func() time.Duration { return srv.Stats().Busy }, MaxCalls: cfg.Turns + 2, ToolResult: cfg.ToolResult}
	var (
		rep         OverheadReport
		plat, glat  []Call
		preq, greq  int64
		gatewayByRt = map[string]int64{}
	)
	for i := range cfg.Conversations + 1 { // the first round warms up
		st0 := srv.Stats()
		lat, err := h.Conversation(ctx, "http://"+pl.Addr().String()+"/v1")
		if err != nil {
			return rep, fmt.Errorf("through the reverse proxy: %w", err)
		}
		st1 := srv.Stats()
		s, err := gw.Open(ctx, inference.EpisodeSpec{ID: "bench" + strconv.Itoa(i)})
		if err != nil {
			return rep, err
		}
		glt, err := h.Conversation(ctx, "http://"+gl.Addr().String()+"/s/"+s.ID()+"/v1")
		if err != nil {
			_, _ = s.Close(ctx)
			return rep, fmt.Errorf("through the gateway: %w", err)
		}
		st2 := srv.Stats()
		clean, err := CloseClean(ctx, s)
		if err != nil {
			return rep, err
		}
		if i == 0 {
			continue
		}
		rep.Sessions++
		if clean {
			rep.CleanSessions++
		}
		plat, glat = append(plat, lat...), append(glat, glt...)
		preq += st1.Requests - st0.Requests
		greq += st2.Requests - st1.Requests
		for k, v := range st2.ByRoute {
			gatewayByRt[k] += v - st1.ByRoute[k]
		}
	}
	if len(plat) == 0 || len(glat) == 0 {
		return rep, errors.New("no calls timed")
	}
	rep.Calls = len(glat)
	praw, graw := Latencies(plat, false), Latencies(glat, false)
	rep.ProxyP50, rep.ProxyP90 = Quantile(praw, .5), Quantile(praw, .9)
	rep.GatewayP50, rep.GatewayP90 = Quantile(graw, .5), Quantile(graw, .9)
	pn, gn := Latencies(plat, true), Latencies(glat, true)
	rep.ProxyNetP50, rep.GatewayNetP50 = Quantile(pn, .5), Quantile(gn, .5)
	rep.ProxyNetP90, rep.GatewayNetP90 = Quantile(pn, .9), Quantile(gn, .9)
	for _, c := range plat {
		rep.ProxyEngine += c.Engine
	}
	for _, c := range glat {
		rep.GatewayEngine += c.Engine
	}
	rep.ProxyEngine /= time.Duration(len(plat))
	rep.GatewayEngine /= time.Duration(len(glat))
	rep.ProxyRequestsPerCall = float64(preq) / float64(len(plat))
	rep.GatewayRequestsPerCall = float64(greq) / float64(len(glat))
	rep.GatewayRoutes = map[string]float64{}
	for k, v := range gatewayByRt {
		if v > 0 {
			rep.GatewayRoutes[k] = float64(v) / float64(len(glat))
		}
	}
	return rep, nil
}

// CloseClean closes a session and reports whether its record is what a
// well-behaved harness yields: one branch, every call OK, nothing
// rewritten or unanchored.
func CloseClean(ctx context.Context, s *capture.Session) (bool, error) {
	rec, err := s.Close(ctx)
	if err != nil {
		return false, fmt.Errorf("close session: %w", err)
	}
	if len(rec.Branches) != 1 || rec.Rewritten != 0 || rec.Unanchored != 0 {
		return false, nil
	}
	for _, c := range rec.Calls {
		if c.Status != gateway.CallOK {
			return false, nil
		}
	}
	return true, nil
}

// Quantile is the q-quantile of d (nearest rank).
func Quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// Gateway is a capture.Gateway with its inference client.
type Gateway struct {
	*capture.Gateway
	pol inference.Policy
}

// NewGateway is the gateway the bench measures: the hermes parser, a
// tokens-mode backend on engine, room for sessions sessions, rendering
// in-process from the model at localRender when it is not "".
func NewGateway(engine, backend string, sessions int, localRender string) (*Gateway, error) {
	// The inference client's defaults otherwise (retries of connection errors
	// included: 10,000 connections dialled at once overflow a listen backlog).
	pol, err := inference.New(inference.Config{Backend: backend, Endpoints: []string{engine},
		ReadyTimeout: 10 * time.Second, Timeout: 5 * time.Minute, LocalRender: localRender})
	if err != nil {
		return nil, err
	}
	t := 0.6
	gw, err := capture.New(pol, capture.Options{Parser: "hermes", Doors: builtin.FrontDoors(), MaxSessions: sessions,
		Sampling: inference.Sampling{Temperature: &t, MaxTokens: 512}})
	if err != nil {
		closePolicy(pol)
		return nil, err
	}
	return &Gateway{Gateway: gw, pol: pol}, nil
}

// Close closes the inference client.
func (g *Gateway) Close() { closePolicy(g.pol) }

func closePolicy(p inference.Policy) {
	if c, ok := p.(interface{ Close() error }); ok {
		_ = c.Close()
	}
}

// ServeConfig configures Serve.
type ServeConfig struct {
	Engine, Backend string
	Addr            string
	Sessions        int
	// Proxy serves the scale run's baseline instead of a gateway: a plain
	// httputil.ReverseProxy forwarding /v1/… to the engine through the
	// inference client's transport (sized for Sessions connections, as
	// the gateway's), with no sessions and no control routes.
	Proxy bool
	// LocalRender is the gateway's inference.Config.LocalRender.
	LocalRender string
}

// Serve runs a gateway on Addr until ctx ends: the session routes of
// capture.Handler, GET /health, and the bench's control routes POST
// /bench/sessions (open; answers {"id"}) and DELETE /bench/sessions/{id}
// (close; answers {"clean"}: see CloseClean). With cfg.Proxy it serves the
// reverse proxy instead.
func Serve(ctx context.Context, cfg ServeConfig) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	if cfg.Proxy {
		u, err := url.Parse(cfg.Engine)
		if err != nil {
			return fmt.Errorf("engine URL: %w", err)
		}
		rp := httputil.NewSingleHostReverseProxy(u)
		rp.Transport = inference.NewHTTPClient(cmp.Or(cfg.Sessions, capture.DefaultMaxSessions)).Transport
		mux.Handle("/v1/", rp)
		return listen(ctx, cfg.Addr, mux)
	}
	gw, err := NewGateway(cfg.Engine, cfg.Backend, cmp.Or(cfg.Sessions, capture.DefaultMaxSessions), cfg.LocalRender)
	if err != nil {
		return err
	}
	defer gw.Close()
	var (
		mu   sync.Mutex
		open = map[string]*capture.Session{}
		seq  int
	)
	mux.Handle("/", capture.Handler(gw.Gateway, builtin.FrontDoors()))
	mux.HandleFunc("POST /bench/sessions", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seq++
		id := "bench" + strconv.Itoa(seq)
		mu.Unlock()
		s, err := gw.Open(r.Context(), inference.EpisodeSpec{ID: id})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		mu.Lock()
		open[s.ID()] = s
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]string{"id": s.ID()})
	})
	mux.HandleFunc("DELETE /bench/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		s, ok := open[r.PathValue("id")]
		delete(open, r.PathValue("id"))
		mu.Unlock()
		if !ok {
			http.Error(w, "no such session", http.StatusNotFound)
			return
		}
		clean, err := CloseClean(r.Context(), s)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]bool{"clean": clean})
	})
	err = listen(ctx, cfg.Addr, mux)
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mu.Lock()
	defer mu.Unlock()
	for _, s := range open {
		_, _ = s.Close(sctx)
	}
	return err
}

// listen serves h on addr until ctx ends, then shuts down.
func listen(ctx context.Context, addr string, h http.Handler) error {
	// HTTP/1.1 and cleartext HTTP/2: the load generator multiplexes its
	// sessions over a few HTTP/2 connections (Client), so that 10,000
	// sessions fit the open-file limit of a machine where the gateway also
	// holds a connection per call in flight to the engine.
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second, Protocols: &protos,
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 1000}}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// H2CClient is the load generator's client of Serve: cleartext HTTP/2,
// sessions multiplexed over a few connections.
func H2CClient() *http.Client {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &protos, Proxy: nil}}
}

// ScaleReport is what the load generator saw.
type ScaleReport struct {
	Sessions, Calls, CleanSessions int
	Wall                           time.Duration
	CallP50, CallP90               time.Duration
	// PeakOpen is the most sessions open at once (every session is opened
	// before any conversation starts, so all of them).
	PeakOpen int
}

// Scale opens sessions sessions on the gateway served at base (Serve), then
// runs one conversation in each, all at once, then closes them. Sessions
// open before the first call and close after the last, so all are held at
// the same time. Against Serve's reverse proxy (proxy true) it runs as many
// conversations through base+"/v1", with nothing to open or close.
func Scale(ctx context.Context, base string, sessions int, h Harness, proxy bool) (ScaleReport, error) {
	ids := make([]string, sessions)
	for i := range ids {
		if proxy {
			continue
		}
		id, err := control(ctx, h.Client, http.MethodPost, base+"/bench/sessions", "id")
		if err != nil {
			return ScaleReport{}, fmt.Errorf("open session %d: %w", i, err)
		}
		ids[i] = id.(string)
	}
	rep := ScaleReport{Sessions: sessions, PeakOpen: sessions}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		lat  []time.Duration
		ferr error
		nerr int
	)
	start := time.Now()
	for _, id := range ids {
		u := base + "/s/" + id + "/v1"
		if proxy {
			u = base + "/v1"
		}
		wg.Go(func() {
			l, err := h.Conversation(ctx, u)
			mu.Lock()
			defer mu.Unlock()
			lat = append(lat, Latencies(l, false)...)
			if err != nil {
				nerr++
				ferr = cmp.Or(ferr, err)
			}
		})
	}
	wg.Wait()
	rep.Wall = time.Since(start)
	rep.Calls = len(lat)
	if len(lat) > 0 {
		rep.CallP50, rep.CallP90 = Quantile(lat, .5), Quantile(lat, .9)
	}
	for _, id := range ids {
		if proxy {
			break
		}
		c, err := control(ctx, h.Client, http.MethodDelete, base+"/bench/sessions/"+id, "clean")
		if err != nil {
			return rep, fmt.Errorf("close session: %w", err)
		}
		if c.(bool) {
			rep.CleanSessions++
		}
	}
	if ferr != nil {
		return rep, fmt.Errorf("%d of %d conversations failed, first: %w", nerr, sessions, ferr)
	}
	return rep, nil
}

func control(ctx context.Context, cl *http.Client, method, u, field string) (any, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d: %.300s", resp.StatusCode, raw)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, err
	}
	v, ok := out[field]
	if !ok {
		return nil, fmt.Errorf("answer without %q: %.300s", field, raw)
	}
	return v, nil
}
