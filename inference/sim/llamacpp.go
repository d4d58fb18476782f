package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
)

// The llama.cpp flavour (Config.Engine "llamacpp") imitates llama-server
// started with --jinja: its native routes and the quirks of its
// OpenAI-compatible chat route that a rollout client meets —
//   - /v1/models has no max_model_len, a "meta" block instead; /props
//     reports one slot's context (default_generation_settings.n_ctx);
//   - /tokenize {content, add_special, parse_special, with_pieces},
//     /detokenize {tokens} → {content}, /apply-template {messages, tools,
//     add_generation_prompt} → {prompt};
//   - /completion with a token-id prompt, n_predict, n_probs,
//     post_sampling_probs, return_tokens; stop_type eos/word/limit,
//     truncated, the stop word's tokens kept in tokens but withheld from
//     completion_probabilities, generation_settings echoing llama.cpp's
//     defaults for every sampler field the request left out;
//   - chat logprobs name each token by text with its id in "id", and none
//     at all with top_logprobs 0; no token_ids or prompt_token_ids;
//   - a prompt that does not fit one slot: HTTP 400
//     exceed_context_size_error; a history whose tool-call arguments are
//     not JSON: HTTP 500 "Failed to parse tool call arguments as JSON".

// llamaSamplerDefaults are llama-server's defaults (common_params_sampling)
// for the sampler fields, applied to every field a request leaves out.
var llamaSamplerDefaults = map[string]any{
	"temperature": 0.8, "top_k": 40.0, "top_p": 0.95, "min_p": 0.05, "typical_p": 1.0, "top_n_sigma": -1.0,
	"xtc_probability": 0.0, "xtc_threshold": 0.1, "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2.0,
	"dry_penalty_last_n": -1.0, "mirostat": 0.0, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "repeat_penalty": 1.0,
	"repeat_last_n": 64.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dynatemp_range": 0.0,
	"dynatemp_exponent": 1.0, "min_keep": 0.0, "n_probs": 0.0, "post_sampling_probs": false, "ignore_eos": false,
}

var llamaSamplerOrder = []any{"penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"}

func (h *handler) llamaRoutes() {
	health := func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, map[string]string{"status": "ok"}) }
	h.mux.HandleFunc("GET /health", health)
	h.mux.HandleFunc("GET /v1/health", health)
	h.mux.HandleFunc("GET /v1/models", h.llamaModels)
	h.mux.HandleFunc("GET /models", h.llamaModels)
	h.mux.HandleFunc("GET /props", h.llamaProps)
	h.mux.Handle("GET /metrics", h.metricsHandler())
	h.mux.HandleFunc("POST /tokenize", h.llamaTokenize)
	h.mux.HandleFunc("POST /detokenize", h.llamaDetokenize)
	h.mux.HandleFunc("POST /apply-template", h.llamaApplyTemplate)
	h.mux.HandleFunc("POST /completion", h.llamaCompletion)
	h.mux.HandleFunc("POST /completions", h.llamaCompletion)
	h.mux.HandleFunc("POST /v1/chat/completions", h.chat)
	h.mux.HandleFunc("POST /chat/completions", h.chat)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeLlamaError(w, &apiError{Status: 404, Type: "not_found_error", Msg: fmt.Sprintf("File Not Found (%s %s is not served by the simulator's llama.cpp flavour)", r.Method, r.URL.Path)}, nil)
	})
}

func (h *handler) llama() bool { return h.cfg.Engine == EngineLlamaCpp }

// nCtxTrain is the simulated model's training context.
const nCtxTrain = 40960

// writeLlamaError writes llama-server's error shape.
func writeLlamaError(w http.ResponseWriter, e *apiError, extra map[string]any) {
	body := map[string]any{"code": e.Status, "message": e.Msg, "type": e.Type}
	for k, v := range extra {
		body[k] = v
	}
	writeJSON(w, e.Status, map[string]any{"error": body})
}

func (h *handler) llamaBadRequest(w http.ResponseWriter, format string, a ...any) {
	writeLlamaError(w, &apiError{Status: 400, Type: "invalid_request_error", Msg: fmt.Sprintf(format, a...)}, nil)
}

// exceedContext writes llama.cpp's answer to a prompt that does not fit
// one slot.
func (h *handler) exceedContext(w http.ResponseWriter, n int) {
	writeLlamaError(w, &apiError{Status: 400, Type: "exceed_context_size_error",
		Msg: fmt.Sprintf("request (%d tokens) exceeds the available context size (%d tokens), try increasing it", n, h.cfg.MaxModelLen)},
		map[string]any{"n_prompt_tokens": n, "n_ctx": h.cfg.MaxModelLen})
}

func (h *handler) llamaModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, 200, map[string]any{"object": "list", "data": []any{map[string]any{
		"id": h.cfg.Model, "object": "model", "created": h.cfg.Now().Unix(), "owned_by": "llamacpp",
		"meta": map[string]any{"vocab_type": 2, "n_vocab": h.tok.VocabSize(), "n_ctx_train": nCtxTrain,
			"n_ctx": h.cfg.MaxModelLen * h.cfg.Slots, "n_embd": 64, "n_params": 1000000, "size": 4000000},
	}}})
}

func (h *handler) llamaProps(w http.ResponseWriter, _ *http.Request) {
	gs := h.generationSettings(nil, -1)
	writeJSON(w, 200, map[string]any{
		"default_generation_settings": gs, "total_slots": h.cfg.Slots, "model_path": h.cfg.Model + ".gguf",
		"chat_template": "(simulated " + h.tmpl.name + " template)", "bos_token": h.tmpl.bos, "eos_token": h.tmpl.eot,
		"build_info": "rollout-sim", "modalities": map[string]bool{"vision": false, "audio": false},
	})
}

// generationSettings is llama.cpp's view of a request's sampler: its
// defaults overlaid by what the request sent.
func (h *handler) generationSettings(sent map[string]any, nPredict int) map[string]any {
	gs := map[string]any{}
	for k, v := range llamaSamplerDefaults {
		gs[k] = v
	}
	for k := range llamaSamplerDefaults {
		if v, ok := sent[k]; ok && v != nil {
			gs[k] = v
		}
	}
	gs["samplers"] = llamaSamplerOrder
	if v, ok := sent["samplers"]; ok {
		gs["samplers"] = v
	}
	gs["seed"] = 4294967295.0
	if v, ok := sent["seed"]; ok && v != nil {
		gs["seed"] = v
	}
	gs["n_ctx"] = h.cfg.MaxModelLen
	gs["n_predict"] = nPredict
	gs["model"] = h.cfg.Model
	gs["stream"] = false
	gs["stop"] = []any{}
	if v, ok := sent["stop"]; ok && v != nil {
		gs["stop"] = v
	}
	return gs
}

// llamaEncode tokenises text as llama.cpp does: BOS first when add_special
// and the model adds one; control markers parsed unless parse_special is
// false.
func (h *handler) llamaEncode(text string, addSpecial, parseSpecial bool) []int {
	var ids []int
	if addSpecial && h.tmpl.bos != "" {
		ids = append(ids, h.tok.mustID(h.tmpl.bos))
	}
	for _, id := range h.tok.Encode(text) {
		if !parseSpecial && h.tok.IsControl(id) {
			// Control tokens are plain text without parse_special;
			// user-defined markers (<tool_call>) are always matched.
			for _, b := range h.tok.Bytes(id) {
				ids = append(ids, int(b))
			}
			continue
		}
		ids = append(ids, id)
	}
	return ids
}

// llamaTemplateText renders a conversation as llama.cpp's --jinja path
// does: the template's own BOS text is dropped when the model adds BOS at
// tokenisation, so add_special gives one BOS, not two.
func (h *handler) llamaTemplateText(c chatRender) (string, *apiError) {
	if e := toolArgsError(c.Messages, true); e != nil {
		return "", e
	}
	if h.cfg.PrefillAssistant && len(c.Messages) > 0 && c.Messages[len(c.Messages)-1].Role == "assistant" {
		c.ContinueFinalMessage = true
	}
	text, _, e := h.render(c)
	if e != nil {
		return "", e
	}
	if h.tmpl.bos != "" {
		text = strings.TrimPrefix(text, h.tmpl.bos)
	}
	return text, nil
}

// toolArgsError checks that every assistant tool call's arguments are JSON,
// as both servers' template paths parse them: llama.cpp answers HTTP 500
// "Failed to parse tool call arguments as JSON"; vLLM's json.loads raises,
// which its chat preprocessing turns into HTTP 400. Empty arguments are
// accepted (vLLM substitutes {}).
func toolArgsError(msgs []Message, llama bool) *apiError {
	for i, m := range msgs {
		if m.Role != "assistant" {
			continue
		}
		for j, tc := range m.ToolCalls {
			raw := strings.TrimSpace(string(tc.Function.Arguments))
			if raw == "" || raw == "null" {
				continue
			}
			if strings.HasPrefix(raw, `"`) {
				var s string
				if json.Unmarshal(tc.Function.Arguments, &s) != nil {
					continue // reported by the renderer
				}
				if strings.TrimSpace(s) == "" || json.Valid([]byte(s)) {
					continue
				}
			} else {
				continue // an object or list: already JSON
			}
			if llama {
				return &apiError{Status: 500, Type: "server_error",
					Msg: fmt.Sprintf("Failed to parse tool call arguments as JSON: messages[%d].tool_calls[%d]: [json.exception.parse_error.101] parse error: syntax error while parsing value", i, j)}
			}
			return badRequest("Expecting value: messages[%d].tool_calls[%d].function.arguments is not valid JSON (JSONDecodeError)", i, j)
		}
	}
	return nil
}

func (h *handler) llamaTokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Content      *string `json:"content"`
		AddSpecial   bool    `json:"add_special"`
		ParseSpecial *bool   `json:"parse_special"`
		WithPieces   bool    `json:"with_pieces"`
	}
	if e := decodeRequest(r, &req); e != nil {
		writeLlamaError(w, e, nil)
		return
	}
	if req.Content == nil {
		h.llamaBadRequest(w, "\"content\" must be provided")
		return
	}
	ids := h.llamaEncode(*req.Content, req.AddSpecial, req.ParseSpecial == nil || *req.ParseSpecial)
	if !req.WithPieces {
		writeJSON(w, 200, map[string]any{"tokens": ids})
		return
	}
	pieces := make([]any, len(ids))
	for i, id := range ids {
		var piece any = h.tok.TokenString(id)
		if id < 256 && strings.HasPrefix(piece.(string), "bytes:") {
			piece = []int{id}
		}
		pieces[i] = map[string]any{"id": id, "piece": piece}
	}
	writeJSON(w, 200, map[string]any{"tokens": pieces})
}

func (h *handler) llamaDetokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Tokens []int `json:"tokens"`
	}
	if e := decodeRequest(r, &req); e != nil {
		writeLlamaError(w, e, nil)
		return
	}
	text, err := h.tok.Decode(req.Tokens, false)
	if err != nil {
		h.llamaBadRequest(w, "%v", err)
		return
	}
	writeJSON(w, 200, map[string]any{"content": text})
}

func (h *handler) llamaApplyTemplate(w http.ResponseWriter, r *http.Request) {
	var req chatRender
	if e := decodeRequest(r, &req); e != nil {
		writeLlamaError(w, e, nil)
		return
	}
	if len(req.Messages) == 0 {
		h.llamaBadRequest(w, "'messages' is required")
		return
	}
	text, e := h.llamaTemplateText(req)
	if e != nil {
		writeLlamaError(w, e, nil)
		return
	}
	writeJSON(w, 200, map[string]any{"prompt": text})
}

type llamaCompletionRequest struct {
	Prompt            json.RawMessage `json:"prompt"`
	NPredict          *int            `json:"n_predict"`
	MaxTokens         *int            `json:"max_tokens"`
	NProbs            int             `json:"n_probs"`
	PostSamplingProbs bool            `json:"post_sampling_probs"`
	ReturnTokens      bool            `json:"return_tokens"`
	Stop              stopList        `json:"stop"`
	Seed              *int64          `json:"seed"`
	Stream            bool            `json:"stream"`
}

// llamaCompletion serves POST /completion.
func (h *handler) llamaCompletion(w http.ResponseWriter, r *http.Request) {
	body, e := readJSONBody(r)
	if e != nil {
		writeLlamaError(w, e, nil)
		return
	}
	var req llamaCompletionRequest
	var sent map[string]any
	if err := json.Unmarshal(body, &req); err != nil {
		h.llamaBadRequest(w, "invalid request: %v", err)
		return
	}
	_ = json.Unmarshal(body, &sent) // an object: the line above succeeded
	if req.Stream {
		h.llamaBadRequest(w, "stream is not implemented yet in the simulator's llama.cpp flavour")
		return
	}
	var prompt []int
	var text string
	switch {
	case json.Unmarshal(req.Prompt, &prompt) == nil && len(prompt) > 0:
		for i, id := range prompt {
			if err := h.tok.check(id); err != nil {
				h.llamaBadRequest(w, "prompt token %d: %v", i, err)
				return
			}
		}
	case json.Unmarshal(req.Prompt, &text) == nil:
		prompt = h.llamaEncode(text, true, true)
	default:
		h.llamaBadRequest(w, "\"prompt\" must be a string or a list of token ids")
		return
	}
	if len(prompt) == 0 {
		h.llamaBadRequest(w, "empty prompt")
		return
	}
	nctx := h.cfg.MaxModelLen
	if len(prompt) >= nctx {
		h.exceedContext(w, len(prompt))
		return
	}
	room := nctx - len(prompt)
	n := -1
	if req.NPredict != nil {
		n = *req.NPredict
	} else if req.MaxTokens != nil {
		n = *req.MaxTokens
	}
	gs := h.generationSettings(sent, n)
	ctxLimited := n < 0 || n > room
	if ctxLimited {
		n = room
	}
	var seed *int64
	if req.Seed != nil && *req.Seed >= 0 {
		seed = req.Seed
	}
	var c genChoice
	f := faultNone
	if n > 0 {
		all, ff, ok := h.runGeneration(w, r, [][]int{prompt}, genParams{MaxTokens: &n, Seed: seed, Stop: req.Stop}, 0)
		if !ok {
			return
		}
		c, f = all[0][0], ff
	}
	stopType, word, truncated := "limit", "", false
	ids := c.IDs
	probIDs, probLPs := c.IDs, c.Logprobs
	switch {
	case n == 0 || c.Finish == "length":
		truncated = ctxLimited && len(c.IDs) >= n
	case c.StopReason != nil:
		stopType, word = "word", fmt.Sprint(c.StopReason)
		// The stop word was sampled: its tokens are in "tokens" but not in
		// the content or the probabilities.
		ids = append(append([]int{}, c.IDs...), h.tok.Encode(word)...)
	default:
		stopType = "eos"
	}
	contentIDs := ids
	if stopType == "eos" {
		contentIDs = ids[:len(ids)-1]
	} else if stopType == "word" {
		contentIDs = c.IDs
	}
	content, _ := h.tok.Decode(contentIDs, false)
	promptText, _ := h.tok.Decode(prompt, false)
	resp := map[string]any{
		"index": 0, "content": content, "tokens": []int{}, "id_slot": 0, "stop": true, "model": h.cfg.Model,
		"tokens_predicted": len(ids), "tokens_evaluated": len(prompt), "generation_settings": gs, "prompt": promptText,
		"has_new_line": strings.Contains(content, "\n"), "truncated": truncated, "stop_type": stopType, "stopping_word": word,
		"tokens_cached": 0, "timings": map[string]any{"prompt_n": len(prompt), "predicted_n": len(ids)},
	}
	if req.ReturnTokens {
		resp["tokens"] = ids
	}
	if req.NProbs > 0 {
		// llama.cpp lists at most the vocabulary.
		resp["completion_probabilities"] = h.llamaProbs(probIDs, probLPs, min(req.NProbs, h.tok.VocabSize()), req.PostSamplingProbs)
	}
	h.writeBody(w, f, resp)
}

// llamaProbs builds completion_probabilities: logprobs of the full
// distribution, or with post_sampling_probs the probabilities after the
// sampler chain (renormalised, so they differ from exp(logprob)).
func (h *handler) llamaProbs(ids []int, lps []float64, k int, post bool) []any {
	out := make([]any, 0, len(ids))
	var held []byte // bytes of the ids withheld since the last entry
	for j, id := range ids {
		if !h.scored(ids, j) {
			held = append(held, h.tok.Bytes(id)...)
			continue
		}
		e := h.llamaProbEntry(id, lps[j], post)
		// As llama-server: the entry that completes a character carries
		// the text of the withheld ids before it too.
		e["bytes"] = bytesOf(append(held, h.llamaPiece(id)...))
		held = nil
		var top []any
		for _, t := range h.topLogprobs(id, lps[j], k) {
			top = append(top, h.llamaProbEntry(t.ID, t.LP, post))
		}
		if post {
			e["top_probs"] = top
		} else {
			e["top_logprobs"] = top
		}
		out = append(out, e)
	}
	return out
}

// scored reports whether llama.cpp records a probability for ids[j]: only
// when the text generated up to and including it does not end inside a
// UTF-8 character (its validate_utf8 check on the last four bytes).
func (h *handler) scored(ids []int, j int) bool {
	var tail []byte
	for i := j; i >= 0 && len(tail) < 4; i-- {
		tail = append(h.tok.Bytes(ids[i]), tail...) // Bytes returns a fresh slice
	}
	if len(tail) > 4 {
		tail = tail[len(tail)-4:]
	}
	n := len(tail)
	for i := 1; i <= n; i++ {
		c := tail[n-i]
		switch {
		case c&0xE0 == 0xC0 && i < 2, c&0xF0 == 0xE0 && i < 3, c&0xF8 == 0xF0 && i < 4:
			return false
		}
	}
	return true
}

// llamaPiece is a token's bytes as /completion's probabilities spell
// them: llama-server renders pieces there without special tokens, so a
// control token (<|im_end|>) is spelled empty (observed on b11669), while
// /detokenize writes it out.
func (h *handler) llamaPiece(id int) []byte {
	if h.tok.IsControl(id) {
		return nil
	}
	return h.tok.Bytes(id)
}

func (h *handler) llamaProbEntry(id int, lp float64, post bool) map[string]any {
	piece := h.llamaPiece(id)
	token := ""
	if len(piece) > 0 {
		token = h.tok.TokenString(id)
	}
	e := map[string]any{"id": id, "token": token, "bytes": bytesOf(piece)}
	if post {
		// Truncation renormalises: the post-sampling probability is higher.
		e["prob"] = math.Min(1, math.Round(math.Exp(lp)*1.25*1e6)/1e6)
	} else {
		e["logprob"] = lp
	}
	return e
}

// llamaChatLogprobs is logprobs.content of llama.cpp's chat route: tokens
// by text, ids in "id", top_logprobs of k entries.
func (h *handler) llamaChatLogprobs(c genChoice, k int) []any {
	out := make([]any, 0, len(c.IDs))
	var held []byte // bytes of the ids withheld since the last entry
	for j, id := range c.IDs {
		if !h.scored(c.IDs, j) {
			held = append(held, h.tok.Bytes(id)...)
			continue // withheld, as on /completion
		}
		e := map[string]any{"id": id, "token": h.tok.TokenString(id), "bytes": bytesOf(append(held, h.tok.Bytes(id)...)), "logprob": c.Logprobs[j]}
		held = nil
		var top []any
		for _, t := range h.topLogprobs(id, c.Logprobs[j], k) {
			top = append(top, map[string]any{"id": t.ID, "token": h.tok.TokenString(t.ID), "bytes": bytesOf(h.tok.Bytes(t.ID)), "logprob": t.LP})
		}
		e["top_logprobs"] = top
		out = append(out, e)
	}
	return out
}

// llamaChat is the chat route of the llama.cpp flavour.
func (h *handler) llamaChat(w http.ResponseWriter, r *http.Request, req *chatRequest, choice string) {
	if req.Stream {
		h.llamaBadRequest(w, "stream is not implemented yet in the simulator's llama.cpp flavour")
		return
	}
	text, e := h.llamaTemplateText(req.chatRender)
	if e != nil {
		writeLlamaError(w, e, nil)
		return
	}
	prompt := h.llamaEncode(text, true, true)
	nctx := h.cfg.MaxModelLen
	if len(prompt) >= nctx {
		h.exceedContext(w, len(prompt))
		return
	}
	room := nctx - len(prompt)
	maxT := room
	if m := req.MaxCompletionTokens; m != nil && *m >= 0 && *m < room {
		maxT = *m
	} else if m := req.MaxTokens; m != nil && *m >= 0 && *m < room {
		maxT = *m
	}
	if maxT == 0 {
		h.llamaBadRequest(w, "max_tokens must be positive")
		return
	}
	p := genParams{MaxTokens: &maxT, N: req.N, Seed: req.Seed, Stop: req.Stop}
	seed := seedOf(req.Seed, prompt, h.cfg.Seed)
	id := "chatcmpl-" + randomHex(seed, 16)
	all, f, ok := h.runGeneration(w, r, [][]int{prompt}, p, 0)
	if !ok {
		return
	}
	outs, e := h.parseChoices(req, choice, all[0], id)
	if e != nil {
		writeLlamaError(w, e, nil)
		return
	}
	k := topK(req.TopLogprobs)
	var choices []any
	gen := 0
	for i, o := range outs {
		gen += len(o.IDs)
		msg := map[string]any{"role": "assistant", "content": o.Content}
		if len(o.Calls) > 0 {
			msg["tool_calls"] = o.Calls
		}
		if o.Reasoning != nil {
			msg["reasoning_content"] = *o.Reasoning
		}
		c := map[string]any{"index": i, "message": msg, "finish_reason": o.Finish}
		if req.Logprobs && k > 0 {
			c["logprobs"] = map[string]any{"content": h.llamaChatLogprobs(o.genChoice, k)}
		}
		choices = append(choices, c)
	}
	h.writeBody(w, f, map[string]any{"id": id, "object": "chat.completion", "created": h.cfg.Now().Unix(), "model": h.cfg.Model,
		"choices": choices, "system_fingerprint": "b-rollout-sim", "usage": map[string]any{"prompt_tokens": len(prompt), "completion_tokens": gen, "total_tokens": len(prompt) + gen},
		"timings": map[string]any{"prompt_n": len(prompt), "predicted_n": gen}})
}
