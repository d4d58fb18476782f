package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxBody bounds request bodies; a prompt of max_model_len ids as JSON is
// far below it.
const maxBody = 64 << 20

func (h *handler) routes() {
	if h.cfg.Engine == EngineLlamaCpp {
		h.llamaRoutes()
		return
	}
	h.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	h.mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, 200, map[string]string{"version": simVersion})
	})
	h.mux.HandleFunc("GET /v1/models", h.models)
	h.mux.HandleFunc("GET /load", func(w http.ResponseWriter, _ *http.Request) {
		// The request asking counts itself, as vLLM's load tracking does.
		writeJSON(w, 200, map[string]int64{"server_load": h.inFlight.Load()})
	})
	h.mux.Handle("GET /metrics", h.metricsHandler())
	h.mux.HandleFunc("POST /tokenize", h.tokenize)
	h.mux.HandleFunc("POST /detokenize", h.detokenize)
	h.mux.HandleFunc("POST /v1/completions", h.completions)
	h.mux.HandleFunc("POST /v1/chat/completions", h.chat)
	h.mux.HandleFunc("POST /inference/v1/generate", h.vllmGenerate)
	h.mux.HandleFunc("POST /v1/chat/completions/render", h.chatRender)
	h.mux.HandleFunc("POST /v1/completions/render", h.completionsRender)
	h.mux.HandleFunc("POST /generate", h.generateDispatch)
	h.asyncRoutes()
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: 404, Type: "NotFoundError", Msg: fmt.Sprintf("route %s %s is not served by the simulator", r.Method, r.URL.Path)})
	})
}

// simVersion is reported by /version and in system_fingerprint.
const simVersion = "0.11.0-rollout-sim"

// fingerprint is the system_fingerprint of every response.
const fingerprint = "vllm-" + simVersion

// readModelRequest decodes r's JSON body into req and checks the model it
// names (model points into req): false when it has answered with the
// error, as every generation route does before anything else.
func (h *handler) readModelRequest(w http.ResponseWriter, r *http.Request, req any, model *string) bool {
	if e := decodeRequest(r, req); e != nil {
		writeError(w, e)
		return false
	}
	if e := h.checkModel(*model); e != nil {
		writeError(w, e)
		return false
	}
	return true
}

// decodeRequest reads a JSON body into v. vLLM accepts only
// application/json and ignores unknown fields.
func decodeRequest(r *http.Request, v any) *apiError {
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		return &apiError{Status: http.StatusUnsupportedMediaType, Type: "UnsupportedMediaType",
			Msg: fmt.Sprintf("Unsupported Media Type: Only 'application/json' is allowed (got %q)", ct)}
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "BadRequestError", Msg: fmt.Sprintf("request body exceeds %d bytes", maxBody)}
		}
		return badRequest("read request body: %v", err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

func (h *handler) models(w http.ResponseWriter, _ *http.Request) {
	created := h.cfg.Now().Unix()
	writeJSON(w, 200, map[string]any{"object": "list", "data": []any{map[string]any{
		"id": h.cfg.Model, "object": "model", "created": created, "owned_by": "vllm",
		"root": h.cfg.Model, "parent": nil, "max_model_len": h.cfg.MaxModelLen,
		"permission": []any{map[string]any{
			"id": "modelperm-rollout-sim", "object": "model_permission", "created": created,
			"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
			"allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false,
			"organization": "*", "group": nil, "is_blocking": false,
		}},
	}}})
}

func (h *handler) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"model_name": h.cfg.Model}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:num_requests_running", Help: "Number of requests in model execution batches.", ConstLabels: labels},
			func() float64 { return float64(h.inFlight.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting", Help: "Number of requests waiting to be processed.", ConstLabels: labels},
			func() float64 { return 0 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:kv_cache_usage_perc", Help: "KV-cache usage. 1 means 100 percent usage.", ConstLabels: labels},
			func() float64 { return 0 }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vllm:prompt_tokens_total", Help: "Number of prefill tokens processed.", ConstLabels: labels},
			func() float64 { return float64(h.promptN.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vllm:generation_tokens_total", Help: "Number of generation tokens processed.", ConstLabels: labels},
			func() float64 { return float64(h.genN.Load()) }),
		&successCollector{h: h, desc: prometheus.NewDesc("vllm:request_success_total", "Count of successfully processed requests.",
			[]string{"finished_reason"}, labels)},
	)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// successCollector exports the finish-reason counters kept under h.mu.
type successCollector struct {
	h    *handler
	desc *prometheus.Desc
}

func (c *successCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *successCollector) Collect(ch chan<- prometheus.Metric) {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	for reason, n := range c.h.success {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), reason)
	}
}

func (h *handler) countFinished(prompt int, choices []genChoice) {
	h.promptN.Add(int64(prompt))
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range choices {
		h.genN.Add(int64(len(c.IDs)))
		h.success[c.Finish]++
	}
}

// chatTemplateKwargs is the subset of chat_template_kwargs the templates read.
type chatTemplateKwargs map[string]any

// builtinTools is Llama 3.1's builtin_tools (names of its built-in tools).
func (k chatTemplateKwargs) builtinTools() []string {
	l, _ := k["builtin_tools"].([]any)
	var out []string
	for _, v := range l {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func (k chatTemplateKwargs) thinkingDisabled() bool {
	v, ok := k["enable_thinking"].(bool)
	return ok && !v
}

// chatRender is the part of a request that selects the rendering.
type chatRender struct {
	Messages             []Message          `json:"messages"`
	Tools                []Tool             `json:"tools"`
	AddGenerationPrompt  *bool              `json:"add_generation_prompt"`
	ContinueFinalMessage bool               `json:"continue_final_message"`
	ChatTemplate         *string            `json:"chat_template"`
	ChatTemplateKwargs   chatTemplateKwargs `json:"chat_template_kwargs"`
}

// render turns a chat request into prompt ids exactly as the chat route
// feeds them to the engine.
func (h *handler) render(c chatRender) (string, []int, *apiError) {
	if c.ChatTemplate != nil {
		return "", nil, badRequest("Refused request with untrusted chat template")
	}
	if e := toolArgsError(c.Messages, false); e != nil {
		return "", nil, e
	}
	if c.Tools != nil && len(c.Tools) == 0 {
		return "", nil, badRequest("`tools` must not be an empty array")
	}
	for i, t := range c.Tools {
		if t.Function.Name == "" {
			return "", nil, badRequest("tools[%d].function.name must not be empty", i)
		}
	}
	msgs, err := prepareMessages(c.Messages)
	if err != nil {
		return "", nil, badRequest("%v", err)
	}
	o := renderOptions{AddGenerationPrompt: c.AddGenerationPrompt == nil || *c.AddGenerationPrompt,
		ContinueFinalMessage: c.ContinueFinalMessage, EnableThinkingSetFalse: c.ChatTemplateKwargs.thinkingDisabled(),
		BuiltinTools: c.ChatTemplateKwargs.builtinTools()}
	if c.ContinueFinalMessage && c.AddGenerationPrompt == nil {
		o.AddGenerationPrompt = false
	}
	text, err := h.tmpl.render(h.tmpl, h.cfg.Family, msgs, c.Tools, o)
	if err != nil {
		return "", nil, badRequest("%v", err)
	}
	return text, h.tok.Encode(text), nil
}

type tokenizeRequest struct {
	chatRender
	Prompt           *string `json:"prompt"`
	AddSpecialTokens *bool   `json:"add_special_tokens"`
	ReturnTokenStrs  bool    `json:"return_token_strs"`
}

func (h *handler) tokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if e := decodeRequest(r, &req); e != nil {
		writeError(w, e)
		return
	}
	var ids []int
	switch {
	case req.Prompt != nil && req.Messages != nil:
		writeError(w, badRequest("give either prompt or messages, not both"))
		return
	case req.Prompt != nil:
		ids = h.encodeText(*req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
	case req.Messages != nil:
		_, rendered, e := h.render(req.chatRender)
		if e != nil {
			writeError(w, e)
			return
		}
		if req.AddSpecialTokens != nil && *req.AddSpecialTokens && h.tmpl.bos != "" {
			ids = append([]int{h.tok.mustID(h.tmpl.bos)}, rendered...)
		} else {
			ids = rendered
		}
	default:
		writeError(w, badRequest("tokenize needs a prompt (string) or messages"))
		return
	}
	var strs any
	if req.ReturnTokenStrs {
		s := make([]string, len(ids))
		for i, id := range ids {
			s[i] = h.tok.TokenString(id)
		}
		strs = s
	}
	writeJSON(w, 200, map[string]any{"count": len(ids), "max_model_len": h.cfg.MaxModelLen, "tokens": ids, "token_strs": strs})
}

func (h *handler) detokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Tokens *[]int `json:"tokens"`
	}
	if e := decodeRequest(r, &req); e != nil {
		writeError(w, e)
		return
	}
	if req.Tokens == nil {
		writeError(w, badRequest("detokenize needs tokens"))
		return
	}
	text, err := h.tok.Decode(*req.Tokens, false)
	if err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	writeJSON(w, 200, map[string]any{"prompt": text})
}

// generateRequestBody is the GenerateRequest the render routes return,
// ready to POST to /inference/v1/generate.
func (h *handler) generateRequestBody(id string, ids []int, sp map[string]any) map[string]any {
	return map[string]any{"request_id": id, "token_ids": ids, "features": nil, "sampling_params": sp,
		"model": h.cfg.Model, "stream": false, "stream_options": nil, "cache_salt": nil, "priority": 0}
}

// renderSampling maps the request's sampling fields onto SamplingParams
// keys; unset fields are omitted so the generate route applies its own
// defaults.
func renderSampling(n int, maxTokens *int, seed *int64, stop stopList, temperature *float64, logprobs *int) map[string]any {
	sp := map[string]any{"n": max(n, 1), "detokenize": true}
	if maxTokens != nil {
		sp["max_tokens"] = *maxTokens
	}
	if seed != nil {
		sp["seed"] = *seed
	}
	if len(stop) > 0 {
		sp["stop"] = []string(stop)
	}
	if temperature != nil {
		sp["temperature"] = *temperature
	}
	if logprobs != nil {
		sp["logprobs"] = *logprobs
	}
	return sp
}

// chatRender serves POST /v1/chat/completions/render: template and
// tokenise only.
func (h *handler) chatRender(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if !h.readModelRequest(w, r, &req, &req.Model) {
		return
	}
	_, ids, e := h.render(req.chatRender)
	if e != nil {
		writeError(w, e)
		return
	}
	maxT := req.MaxCompletionTokens
	if maxT == nil {
		maxT = req.MaxTokens
	}
	var lp *int
	if req.Logprobs {
		k := topK(req.TopLogprobs)
		lp = &k
	}
	id := requestID(r, req.RequestID, "chatcmpl-", seedOf(req.Seed, ids, h.cfg.Seed))
	writeJSON(w, 200, h.generateRequestBody(id, ids, renderSampling(req.N, maxT, req.Seed, req.Stop, req.Temperature, lp)))
}

// completionsRender serves POST /v1/completions/render: one
// GenerateRequest per prompt.
func (h *handler) completionsRender(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if !h.readModelRequest(w, r, &req, &req.Model) {
		return
	}
	pl, e := h.decodePrompt(req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
	if e != nil {
		writeError(w, e)
		return
	}
	maxT := req.MaxTokens
	if maxT == nil {
		d := 16
		maxT = &d
	}
	out := make([]any, len(pl.ids))
	for i, ids := range pl.ids {
		id := requestID(r, req.RequestID, "cmpl-", seedOf(req.Seed, ids, h.cfg.Seed))
		out[i] = h.generateRequestBody(id, ids, renderSampling(req.N, maxT, req.Seed, req.Stop, nil, req.Logprobs))
	}
	writeJSON(w, 200, out)
}

// encodeText tokenises a plain-text prompt (not a rendered chat): BOS when
// add_special_tokens, and for SentencePiece-style templates the dummy
// prefix space that makes a segment tokenised on its own differ from the
// same text inside a conversation.
func (h *handler) encodeText(text string, addSpecial bool) []int {
	if h.tmpl.dummyPrefix && text != "" {
		text = " " + text
	}
	if addSpecial {
		text = h.tmpl.bos + text
	}
	return h.tok.Encode(text)
}
