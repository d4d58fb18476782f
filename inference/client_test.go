package inference_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	openai "github.com/sashabaranov/go-openai"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/inference"
)

// Shapes copied from vLLM's documented responses (inference.md §2.2, §3,
// §4, §5, §6.2, §9, §10).
const (
	vllmChatResp = `{"id":"chatcmpl-1","object":"chat.completion","created":1760000000,"model":"m",
 "choices":[{"index":0,"message":{"role":"assistant","content":"hi","refusal":null,"annotations":null,"audio":null,
   "function_call":null,"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Tokyo\"}"}}],
   "reasoning":"thinking hard"},
  "logprobs":{"content":[{"token":"token_id:5","logprob":-0.5,"bytes":null,"top_logprobs":[]},{"token":"token_id:7","logprob":-0.25,"bytes":null,"top_logprobs":[]}]},
  "finish_reason":"tool_calls","stop_reason":null,"token_ids":[5,7],"routed_experts":null}],
 "service_tier":null,"system_fingerprint":"vllm","usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"prompt_tokens_details":null},
 "prompt_logprobs":null,"prompt_token_ids":[1,2,3],"prompt_text":null,"kv_transfer_params":null}`
	oldChatResp = `{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"x","reasoning_content":"old name"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`
)

type recorded struct {
	mu     sync.Mutex
	bodies map[string][]map[string]any
}

func (r *recorded) add(path string, body []byte) {
	var m map[string]any
	_ = json.Unmarshal(body, &m)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bodies == nil {
		r.bodies = map[string][]map[string]any{}
	}
	r.bodies[path] = append(r.bodies[path], m)
}

func (r *recorded) last(path string) map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.bodies[path]
	if len(b) == 0 {
		return nil
	}
	return b[len(b)-1]
}

func (r *recorded) count(path string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.bodies[path])
}

func fakeServer(t *testing.T, routes map[string]func(w http.ResponseWriter, body []byte)) (*httptest.Server, *recorded) {
	t.Helper()
	rec := &recorded{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec.add(r.URL.Path, body)
		if h, ok := routes[r.Method+" "+r.URL.Path]; ok {
			h(w, body)
			return
		}
		if r.URL.Path == "/health" {
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, rec
}

func reply(s string) func(http.ResponseWriter, []byte) {
	return func(w http.ResponseWriter, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, s)
	}
}

func replyStatus(code int, s string) func(http.ResponseWriter, []byte) {
	return func(w http.ResponseWriter, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, s)
	}
}

func newPool(t *testing.T, cfg inference.PoolConfig) *inference.Pool {
	t.Helper()
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = time.Millisecond
	}
	p, err := inference.NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func TestChatRequestAndResponseShapes(t *testing.T) {
	srv, rec := fakeServer(t, map[string]func(http.ResponseWriter, []byte){
		"GET /v1/models":            reply(`{"object":"list","data":[{"id":"m","object":"model","max_model_len":4096}]}`),
		"POST /v1/chat/completions": reply(vllmChatResp),
	})
	c := openClient(t, inference.Config{Backend: "chat", Endpoints: []string{srv.URL}, ChatTokenIDs: true,
		Sampling: inference.Sampling{ChatTemplateKwargs: map[string]any{"enable_thinking": false}}})
	ctx := context.Background()
	zero := 0.0
	topK := 20
	ep, err := c.Start(ctx, inference.EpisodeSpec{ID: "e1", Tools: []openai.Tool{terminalTool},
		Sampling: inference.Sampling{Temperature: &zero, TopK: &topK, ExtraBody: map[string]any{"cache_salt": "v3", "top_k": 5}}})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := ep.Generate(ctx, []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	body := rec.last("/v1/chat/completions")
	if v, ok := body["temperature"]; !ok || v.(float64) != 0 {
		t.Errorf("temperature 0 not sent: %v", body)
	}
	if body["return_token_ids"] != true || body["logprobs"] != true || body["model"] != "m" {
		t.Errorf("vLLM fields missing: %v", body)
	}
	if body["cache_salt"] != "v3" || body["top_k"].(float64) != 5 {
		t.Errorf("extra_body not merged (or did not win): %v", body)
	}
	if kw, _ := body["chat_template_kwargs"].(map[string]any); kw["enable_thinking"] != false {
		t.Errorf("chat_template_kwargs not sent: %v", body)
	}
	if tools, _ := body["tools"].([]any); len(tools) != 1 {
		t.Errorf("tools not sent: %v", body["tools"])
	}
	if tr.Reasoning != "thinking hard" || tr.Content != "hi" || len(tr.ToolCalls) != 1 || tr.ToolCalls[0].Function.Name != "get_weather" {
		t.Errorf("turn = %+v", tr)
	}
	if tr.PromptTokens != 3 || len(tr.CompletionIDs) != 2 || tr.Logprobs[1] != -0.25 || !tr.Parsed || tr.FinishReason != "tool_calls" {
		t.Errorf("turn = %+v", tr)
	}
	seq, err := ep.Finish(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(seq.Tokens) != 5 || seq.Mask[3] != 1 || seq.Mask[2] != 0 || seq.Logprobs[0] != 1.0 {
		t.Errorf("chat sequence = %+v", seq)
	}
}

func TestChatReadsReasoningContent(t *testing.T) {
	srv, _ := fakeServer(t, map[string]func(http.ResponseWriter, []byte){
		"POST /v1/chat/completions": reply(oldChatResp),
	})
	// No /v1/models (a proxy): a named model still works in chat mode.
	c := openClient(t, inference.Config{Backend: "chat", Endpoints: []string{srv.URL}, Model: "m", Retries: -1})
	ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: "e"})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: "q"}})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Reasoning != "old name" {
		t.Fatalf("reasoning_content not read: %+v", tr)
	}
	seq, _ := ep.Finish(context.Background(), nil)
	if len(seq.Tokens) != 0 {
		t.Fatalf("no ids returned, want empty sequence, got %d", len(seq.Tokens))
	}
}

func TestErrorClassification(t *testing.T) {
	closedURL := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		u := "http://" + ln.Addr().String()
		ln.Close()
		return u
	}()
	cases := []struct {
		name       string
		handler    func(http.ResponseWriter, []byte)
		url        string
		class      error
		ctxLen     bool
		content    bool
		wantCalls  int
		msgContain string
	}{
		{name: "unreachable", url: closedURL, class: inference.ErrInfra, msgContain: "unreachable"},
		{name: "400 context", handler: replyStatus(400, `{"error":{"message":"This model's maximum context length is 4096 tokens","type":"BadRequestError","code":400}}`), class: inference.ErrRequest, ctxLen: true, wantCalls: 1},
		{name: "422", handler: replyStatus(422, `{"detail":"field required"}`), class: inference.ErrRequest, wantCalls: 1, msgContain: "field required"},
		{name: "500 retried", handler: replyStatus(500, `{"error":{"message":"engine dead"}}`), class: inference.ErrInfra, wantCalls: 3, msgContain: "engine dead"},
		{name: "llama.cpp 400 context", handler: replyStatus(400, `{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}`), class: inference.ErrRequest, ctxLen: true, wantCalls: 1},
		{name: "llama.cpp 400 context by type", handler: replyStatus(400, `{"error":{"code":400,"message":"prompt does not fit","type":"exceed_context_size_error"}}`), class: inference.ErrRequest, ctxLen: true, wantCalls: 1},
		{name: "sglang 400 context", handler: replyStatus(400, `{"object":"error","message":"The input (5000 tokens) is longer than the model's context length (4096 tokens).","type":"BadRequestError","code":400}`), class: inference.ErrRequest, ctxLen: true, wantCalls: 1},
		{name: "llama.cpp 500 template content not retried", handler: replyStatus(500, `{"error":{"code":500,"message":"Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse error","type":"server_error"}}`), class: inference.ErrRequest, content: true, wantCalls: 1, msgContain: "Failed to parse tool call arguments"},
		{name: "jinja 500 content not retried", handler: replyStatus(500, `{"detail":"jinja2.exceptions.UndefinedError: 'dict object' has no attribute 'name'"}`), class: inference.ErrRequest, content: true, wantCalls: 1},
		{name: "400 validation is content", handler: replyStatus(400, `{"error":{"message":"top_logprobs must be between 0 and 20","type":"BadRequestError","code":400}}`), class: inference.ErrRequest, content: true, wantCalls: 1},
		{name: "malformed not retried", handler: reply(`{"id": "x", "choices": [`), class: inference.ErrInfra, wantCalls: 1, msgContain: "malformed"},
		{name: "not json", handler: reply(`<html>oops</html>`), class: inference.ErrInfra, wantCalls: 1},
		{name: "truncated not retried", handler: func(w http.ResponseWriter, _ []byte) {
			w.Header().Set("Content-Length", "1000")
			io.WriteString(w, `{"id":"cmpl`)
		}, class: inference.ErrInfra, wantCalls: 1},
		{name: "missing logprobs", handler: reply(`{"choices":[{"index":0,"text":"a","token_ids":[1],"finish_reason":"length","logprobs":null}]}`), class: inference.ErrInfra, wantCalls: 1, msgContain: "logprobs missing"},
		{name: "misaligned logprobs", handler: reply(`{"choices":[{"index":0,"text":"ab","token_ids":[1,2],"finish_reason":"length","logprobs":{"tokens":["token_id:1"],"token_logprobs":[-0.1]}}]}`), class: inference.ErrInfra, wantCalls: 1, msgContain: "1 logprobs for 2 token ids"},
		{name: "wrong token in logprobs", handler: reply(`{"choices":[{"index":0,"text":"ab","token_ids":[1,2],"finish_reason":"length","logprobs":{"tokens":["token_id:1","token_id:9"],"token_logprobs":[-0.1,-0.2]}}]}`), class: inference.ErrInfra, wantCalls: 1, msgContain: "token_ids[1] = 2"},
		{name: "no choices", handler: reply(`{"choices":[]}`), class: inference.ErrInfra, wantCalls: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url
			var rec *recorded
			if url == "" {
				var srv *httptest.Server
				srv, rec = fakeServer(t, map[string]func(http.ResponseWriter, []byte){
					"GET /v1/models":       reply(`{"data":[{"id":"m","max_model_len":100}]}`),
					"POST /tokenize":       reply(`{"count":3,"max_model_len":100,"tokens":[1,2,3],"token_strs":null}`),
					"POST /v1/completions": tc.handler,
				})
				url = srv.URL
			}
			c := openClient(t, inference.Config{Backend: "vllm", Endpoints: []string{url}, Model: "m", Retries: 2, BackoffBase: time.Millisecond, BreakerFailures: 100})
			ctx := context.Background()
			var err error
			ep, serr := c.Start(ctx, inference.EpisodeSpec{ID: "ep-" + tc.name, Sampling: inference.Sampling{MaxTokens: 10}})
			if serr != nil {
				err = serr
			} else {
				_, err = ep.Generate(ctx, []openai.ChatCompletionMessage{{Role: "user", Content: "q"}})
			}
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, tc.class) {
				t.Fatalf("class: %v", err)
			}
			other := inference.ErrRequest
			if tc.class == inference.ErrRequest {
				other = inference.ErrInfra
			}
			if errors.Is(err, other) {
				t.Fatalf("both classes: %v", err)
			}
			if errors.Is(err, inference.ErrContextLength) != tc.ctxLen {
				t.Fatalf("context length = %v: %v", !tc.ctxLen, err)
			}
			if tc.content && !errors.Is(err, inference.ErrContent) {
				t.Fatalf("not a content error: %v", err)
			}
			var ie *inference.Error
			if !errors.As(err, &ie) || ie.Endpoint == "" {
				t.Fatalf("no endpoint named: %v", err)
			}
			if !strings.Contains(err.Error(), "ep-"+tc.name) && tc.url == "" {
				t.Fatalf("request not named: %v", err)
			}
			if tc.msgContain != "" && !strings.Contains(err.Error(), tc.msgContain) {
				t.Fatalf("message %q lacks %q", err, tc.msgContain)
			}
			if rec != nil && tc.wantCalls > 0 && rec.count("/v1/completions") != tc.wantCalls {
				t.Fatalf("%d calls, want %d", rec.count("/v1/completions"), tc.wantCalls)
			}
		})
	}
}

func TestTokenizeDetokenizeShapes(t *testing.T) {
	srv, rec := fakeServer(t, map[string]func(http.ResponseWriter, []byte){
		"POST /tokenize":   reply(`{"count":3,"max_model_len":32768,"tokens":[151644,872,198],"token_strs":null}`),
		"POST /detokenize": reply(`{"prompt":"<|im_start|>user\n"}`),
	})
	p := newPool(t, inference.PoolConfig{Endpoints: []string{srv.URL}})
	ctx := context.Background()
	gp := true
	tk, err := p.Tokenize(ctx, inference.CallOptions{}, &inference.TokenizeRequest{Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}}, Tools: []openai.Tool{terminalTool}, AddGenerationPrompt: &gp})
	if err != nil || tk.MaxModelLen != 32768 || len(tk.Tokens) != 3 {
		t.Fatalf("tokenize: %+v %v", tk, err)
	}
	body := rec.last("/tokenize")
	if body["add_generation_prompt"] != true || body["tools"] == nil {
		t.Fatalf("tokenize body %v", body)
	}
	s, err := p.Detokenize(ctx, inference.CallOptions{}, "", []int32{151644, 872, 198})
	if err != nil || s != "<|im_start|>user\n" {
		t.Fatalf("detokenize: %q %v", s, err)
	}
	prompt := "hello"
	if _, err := p.Tokenize(ctx, inference.CallOptions{}, &inference.TokenizeRequest{Prompt: &prompt}); err != nil {
		t.Fatal(err)
	}
	if b := rec.last("/tokenize"); b["prompt"] != "hello" || b["messages"] != nil {
		t.Fatalf("prompt form body %v", b)
	}
}

func TestPoolRetriesMoveToHealthyEndpoint(t *testing.T) {
	var bad, good atomic.Int64
	badSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bad.Add(1)
		w.WriteHeader(503)
	}))
	defer badSrv.Close()
	goodSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		good.Add(1)
		io.WriteString(w, `{"data":[{"id":"m"}]}`)
	}))
	defer goodSrv.Close()
	p := newPool(t, inference.PoolConfig{Endpoints: []string{badSrv.URL, goodSrv.URL}, BreakerFailures: 2, BreakerCooldown: time.Hour})
	for i := 0; i < 20; i++ {
		if _, err := p.Models(context.Background()); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if bad.Load() > 2 {
		t.Fatalf("ejected endpoint still got %d requests", bad.Load())
	}
	st := p.State()
	if st[0].Healthy || !st[1].Healthy {
		t.Fatalf("state %+v", st)
	}
}

func TestBreakerProbesBack(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	var healthCalls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			healthCalls.Add(1)
		}
		if down.Load() {
			w.WriteHeader(500)
			return
		}
		io.WriteString(w, `{"data":[{"id":"m"}]}`)
	}))
	defer srv.Close()
	p := newPool(t, inference.PoolConfig{Endpoints: []string{srv.URL}, Retries: -1, BreakerFailures: 2, BreakerCooldown: 20 * time.Millisecond, Timeout: 5 * time.Second})
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if _, err := p.Models(ctx); err == nil {
			t.Fatal("want error while down")
		}
	}
	if p.State()[0].Healthy {
		t.Fatal("not ejected after 2 failures")
	}
	down.Store(false)
	// The next call waits for the cooldown, probes /health, and succeeds.
	if _, err := p.Models(ctx); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
	if healthCalls.Load() == 0 || !p.State()[0].Healthy {
		t.Fatalf("no probe (%d) or still ejected", healthCalls.Load())
	}
}

func TestConcurrencyCapAndCancellation(t *testing.T) {
	release := make(chan struct{})
	var inflight, peak atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		inflight.Add(-1)
		io.WriteString(w, `{"data":[{"id":"m"}]}`)
	}))
	defer srv.Close()
	p := newPool(t, inference.PoolConfig{Endpoints: []string{srv.URL}, MaxConcurrentPerEndpoint: 3})
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := p.Models(context.Background())
			errs <- err
		}()
	}
	// A cancelled caller queued behind the cap gives up promptly.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := p.Models(ctx); done <- err }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if peak.Load() > 3 {
		t.Fatalf("peak in flight %d > cap 3", peak.Load())
	}
	if st := p.State(); st[0].InFlight != 0 {
		t.Fatalf("leaked slots: %+v", st)
	}
}

func TestCancellationAbortsRequest(t *testing.T) {
	gone := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		close(gone)
	}))
	defer srv.Close()
	p := newPool(t, inference.PoolConfig{Endpoints: []string{srv.URL}})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := p.Models(ctx); errc <- err }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	<-gone // the server saw the connection go away
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

func TestAffinityKeepsEpisodeOnOneEndpoint(t *testing.T) {
	hits := map[string]*atomic.Int64{}
	var urls []string
	for i := 0; i < 3; i++ {
		var n atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			io.WriteString(w, `{"data":[{"id":"m"}]}`)
		}))
		defer srv.Close()
		hits[srv.URL] = &n
		urls = append(urls, srv.URL)
	}
	p := newPool(t, inference.PoolConfig{Endpoints: urls})
	var aff inference.Affinity
	var first string
	for i := 0; i < 10; i++ {
		// The fake answers every route with a models list; it decodes as a
		// chat response with no choices, which is enough to see routing.
		if _, _, err := p.ChatCompletion(context.Background(), inference.CallOptions{Affinity: &aff}, &inference.ChatRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	for u, n := range hits {
		if n.Load() != 0 && n.Load() != 10 {
			t.Fatalf("episode spread over endpoints: %s got %d", u, n.Load())
		}
		if n.Load() == 10 {
			first = u
		}
	}
	if first == "" {
		t.Fatal("no endpoint got all calls")
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []inference.Config{
		{Backend: "", Endpoints: []string{"http://x"}},
		{Backend: "tgi", Endpoints: []string{"http://x"}},
		{Backend: "vllm"},
		{Backend: "vllm", Endpoints: []string{"localhost:8000"}},
		{Backend: "vllm", Endpoints: []string{"http://a", "http://a/v1"}},
	} {
		if _, err := inference.New(cfg); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
}

func TestMetricsPerEndpoint(t *testing.T) {
	srv, _ := fakeServer(t, map[string]func(http.ResponseWriter, []byte){
		"GET /v1/models":            reply(`{"data":[{"id":"m"}]}`),
		"POST /v1/chat/completions": replyStatus(400, `{"error":{"message":"bad"}}`),
	})
	c := openClient(t, inference.Config{Backend: "chat", Endpoints: []string{srv.URL}})
	ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: "q"}}); !errors.Is(err, inference.ErrRequest) {
		t.Fatalf("err = %v", err)
	}
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" && l.GetValue() == srv.URL {
					found[mf.GetName()] = true
					if mf.GetName() == "rollout_inference_errors_total" {
						for _, l2 := range m.GetLabel() {
							if l2.GetName() == "class" && l2.GetValue() == "request" && m.GetCounter().GetValue() != 1 {
								t.Errorf("request errors = %v", m.GetCounter().GetValue())
							}
						}
					}
				}
			}
		}
	}
	for _, name := range []string{"rollout_inference_in_flight", "rollout_inference_request_duration_seconds", "rollout_inference_errors_total", "rollout_inference_endpoint_healthy"} {
		if !found[name] {
			t.Errorf("metric %s missing for the endpoint", name)
		}
	}
}

func TestConfigYAML(t *testing.T) {
	const doc = `
backend: vllm
endpoints: [http://gpu1:8000, http://gpu2:8000/v1]
model: ""
timeout: 10m
max_concurrent_per_endpoint: 64
retries: 3
backoff_base: 100ms
breaker_cooldown: 5s
chat_token_ids: false
sampling:
  temperature: 0
  max_tokens: 1024
  chat_template_kwargs: {enable_thinking: true}
  extra_body: {cache_salt: "policy-v12"}
`
	var cfg inference.Config
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Timeout != 10*time.Minute || cfg.BackoffBase != 100*time.Millisecond || cfg.MaxConcurrentPerEndpoint != 64 || len(cfg.Endpoints) != 2 {
		t.Fatalf("cfg = %+v", cfg)
	}
	if cfg.Sampling.Temperature == nil || *cfg.Sampling.Temperature != 0 || cfg.Sampling.ChatTemplateKwargs["enable_thinking"] != true {
		t.Fatalf("sampling = %+v", cfg.Sampling)
	}
	c, err := inference.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Pool().Endpoints(); got[1] != "http://gpu2:8000" {
		t.Fatalf("endpoints %v", got)
	}
}

func TestWatchHealthEjectsDeadEndpoint(t *testing.T) {
	var healthy atomic.Bool
	probed := make(chan struct{}, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			select {
			case probed <- struct{}{}:
			default:
			}
			if !healthy.Load() {
				w.WriteHeader(503)
			}
		}
	}))
	defer srv.Close()
	p := newPool(t, inference.PoolConfig{Endpoints: []string{srv.URL}, BreakerFailures: 2, BreakerCooldown: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.WatchHealth(ctx, time.Millisecond) }()
	// Two failed probes eject the endpoint (the breaker updates just after
	// the probe's response, hence the short poll).
	for p.State()[0].Healthy {
		select {
		case <-probed:
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	<-done
	if st := p.State()[0]; st.Failures < 2 {
		t.Fatalf("state %+v", st)
	}
}

func TestGroupAffinitySharesEndpoint(t *testing.T) {
	var urls []string
	for i := 0; i < 4; i++ {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, `{"data":[{"id":"m"}]}`)
		}))
		defer srv.Close()
		urls = append(urls, srv.URL)
	}
	p := newPool(t, inference.PoolConfig{Endpoints: urls})
	groups := map[string]map[string]bool{}
	for g := 0; g < 8; g++ {
		key := fmt.Sprint("group-", g)
		groups[key] = map[string]bool{}
		for r := 0; r < 4; r++ {
			_, ep, err := p.ChatCompletion(context.Background(), inference.CallOptions{Affinity: inference.NewAffinity(key)}, &inference.ChatRequest{})
			if err != nil {
				t.Fatal(err)
			}
			groups[key][ep] = true
		}
	}
	used := map[string]bool{}
	for key, eps := range groups {
		if len(eps) != 1 {
			t.Fatalf("%s spread over %v", key, eps)
		}
		for ep := range eps {
			used[ep] = true
		}
	}
	if len(used) < 2 {
		t.Fatalf("8 groups all hashed to %v", used)
	}
}
