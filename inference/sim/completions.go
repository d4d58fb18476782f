package sim

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"
)

// stopList accepts a string or a list of strings.
type stopList []string

func (s *stopList) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*s = nil
		return nil
	}
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("stop must be a string or a list of strings")
	}
	*s = many
	return nil
}

// promptList decodes a completions prompt: str, [str], [int] or [[int]].
type promptList struct {
	ids   [][]int
	texts []string // parallel to ids when the prompt was text; "" for id prompts
}

func (h *handler) decodePrompt(raw json.RawMessage, addSpecial bool) (promptList, *apiError) {
	var pl promptList
	trim := bytes.TrimSpace(raw)
	if len(trim) == 0 || bytes.Equal(trim, []byte("null")) {
		return pl, badRequest("prompt is required")
	}
	addText := func(s string) {
		pl.ids = append(pl.ids, h.encodeText(s, addSpecial))
		pl.texts = append(pl.texts, s)
	}
	// One decode, chosen by the first byte (and an array's first
	// element's), not a trial of every shape: a prompt of ids is decoded
	// once, as vLLM's pydantic model does.
	switch {
	case trim[0] == '"':
		var s string
		if json.Unmarshal(trim, &s) == nil {
			addText(s)
			return pl, nil
		}
	case trim[0] == '[':
		inner := bytes.TrimSpace(trim[1:])
		switch {
		case len(inner) > 0 && inner[0] == '"':
			var ss []string
			if json.Unmarshal(trim, &ss) == nil && len(ss) > 0 {
				for _, s := range ss {
					addText(s)
				}
				return pl, nil
			}
		case len(inner) > 0 && inner[0] == '[':
			var many [][]int
			if json.Unmarshal(trim, &many) == nil && len(many) > 0 {
				for _, ids := range many {
					pl.ids = append(pl.ids, ids)
					pl.texts = append(pl.texts, "")
				}
				return pl, nil
			}
		default:
			var one []int
			if json.Unmarshal(trim, &one) == nil && len(one) > 0 {
				pl.ids, pl.texts = [][]int{one}, []string{""}
				return pl, nil
			}
		}
	}
	return pl, badRequest("prompt must be a string, a list of strings, a list of token ids or a list of token-id lists")
}

func (h *handler) checkModel(model string) *apiError {
	if model != "" && model != h.cfg.Model {
		return &apiError{Status: 404, Type: "NotFoundError", Msg: fmt.Sprintf("The model `%s` does not exist.", model)}
	}
	return nil
}

type completionRequest struct {
	Model                  string          `json:"model"`
	Prompt                 json.RawMessage `json:"prompt"`
	MaxTokens              *int            `json:"max_tokens"`
	N                      int             `json:"n"`
	Logprobs               *int            `json:"logprobs"`
	Echo                   bool            `json:"echo"`
	Stream                 bool            `json:"stream"`
	Seed                   *int64          `json:"seed"`
	Stop                   stopList        `json:"stop"`
	ReturnTokenIDs         *bool           `json:"return_token_ids"`
	ReturnTokensAsTokenIDs *bool           `json:"return_tokens_as_token_ids"`
	SkipSpecialTokens      *bool           `json:"skip_special_tokens"`
	AddSpecialTokens       *bool           `json:"add_special_tokens"`
	RequestID              string          `json:"request_id"`
	PromptLogprobs         *int            `json:"prompt_logprobs"`
	StreamOptions          *streamOptions  `json:"stream_options"`
}

// orderedLogprobs is a {token: logprob} object that keeps insertion order
// (sampled token first), which a Go map would lose.
type orderedLogprobs struct {
	keys []string
	vals []float64
}

func (o orderedLogprobs) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		b.Write(kb)
		b.WriteByte(':')
		b.WriteString(strconv.FormatFloat(o.vals[i], 'g', -1, 64))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func (h *handler) tokenLabel(id int, asIDs bool) string {
	if asIDs {
		return "token_id:" + strconv.Itoa(id)
	}
	return h.tok.TokenString(id)
}

// requestID derives a stable id from the request unless the client set one.
func requestID(r *http.Request, bodyID string, prefix string, seed uint64) string {
	if v := r.Header.Get("X-Request-Id"); v != "" {
		return prefix + v
	}
	if bodyID != "" {
		return prefix + bodyID
	}
	return prefix + randomHex(seed, 16)
}

func randomHex(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 0x1d))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return hex.EncodeToString(b)
}

func seedOf(p *int64, ids []int, base int64) uint64 {
	if p != nil {
		return uint64(*p)
	}
	return uint64(base) + hashIDs(ids)
}

// runGeneration is the shared path of the non-streaming generation routes:
// fault, sampling, latency. ok is false when the response has already been
// written or the client is gone.
func (h *handler) runGeneration(w http.ResponseWriter, r *http.Request, prompts [][]int, p genParams, defaultMax int) (choices [][]genChoice, f fault, ok bool) {
	f = h.drawFault()
	if h.preFault(w, r, f) {
		return nil, f, false
	}
	choices, ok = h.asyncGeneration(w, r, prompts, p, defaultMax)
	if !ok {
		return nil, f, false
	}
	for i, cs := range choices {
		h.countFinished(len(prompts[i]), cs)
	}
	return choices, f, true
}

// sleep waits out the modelled latency; when the server is stopping it
// answers 503, when the client left it writes nothing.
func (h *handler) sleep(w http.ResponseWriter, ctx context.Context, d time.Duration) bool {
	if h.wait(ctx, d) {
		return true
	}
	select {
	case <-h.stopping:
		writeError(w, &apiError{Status: 503, Type: "ServiceUnavailableError", Msg: "server shutting down"})
	default:
	}
	return false
}

func usage(prompt, completion int) map[string]any {
	return map[string]any{"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion, "prompt_tokens_details": nil}
}

func (h *handler) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if !h.readModelRequest(w, r, &req, &req.Model) {
		return
	}
	if req.StreamOptions != nil && !req.Stream {
		writeError(w, badRequest("Stream options can only be defined when `stream=True`."))
		return
	}
	if req.Echo {
		writeError(w, badRequest("echo=true is not implemented yet in the simulator"))
		return
	}
	if req.PromptLogprobs != nil {
		if k := *req.PromptLogprobs; k < 0 || k > MaxPromptLogprobs {
			writeError(w, badRequest("Requested prompt logprobs of %d, which is greater than max allowed: %d", k, MaxPromptLogprobs))
			return
		}
		if req.Stream {
			writeError(w, badRequest("prompt_logprobs is not supported with stream=true in the simulator"))
			return
		}
	}
	pl, e := h.decodePrompt(req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
	if e != nil {
		writeError(w, e)
		return
	}
	maxT := req.MaxTokens
	if maxT == nil {
		sixteen := 16 // vLLM's completions default
		maxT = &sixteen
	}
	if req.Logprobs != nil && (*req.Logprobs < 0 || *req.Logprobs > 20) {
		writeError(w, badRequest("logprobs must be between 0 and 20 (--max-logprobs), got %d", *req.Logprobs))
		return
	}
	p := genParams{MaxTokens: maxT, N: req.N, Seed: req.Seed, Stop: req.Stop}
	asIDs := req.ReturnTokensAsTokenIDs != nil && *req.ReturnTokensAsTokenIDs
	retIDs := req.ReturnTokenIDs != nil && *req.ReturnTokenIDs
	skip := req.SkipSpecialTokens == nil || *req.SkipSpecialTokens
	if req.Stream {
		h.completionsStream(w, r, &req, pl, p, asIDs, retIDs, skip)
		return
	}
	all, f, ok := h.runGeneration(w, r, pl.ids, p, 0)
	if !ok {
		return
	}
	var out []any
	promptTotal, genTotal := 0, 0
	for pi, cs := range all {
		promptTotal += len(pl.ids[pi])
		for ci, c := range cs {
			genTotal += len(c.IDs)
			text, _ := h.tok.Decode(c.IDs, skip)
			var lp any
			if req.Logprobs != nil {
				lp = h.completionLogprobs(c, *req.Logprobs, asIDs)
			}
			choice := map[string]any{
				"index": pi*len(cs) + ci, "text": text, "logprobs": lp, "finish_reason": c.Finish,
				"stop_reason": c.StopReason, "token_ids": nil, "prompt_logprobs": nil, "prompt_token_ids": nil, "routed_experts": nil,
			}
			if req.PromptLogprobs != nil {
				choice["prompt_logprobs"] = h.promptLogprobs(pl.ids[pi], *req.PromptLogprobs)
			}
			if retIDs {
				choice["token_ids"] = c.IDs
				choice["prompt_token_ids"] = pl.ids[pi]
			}
			out = append(out, choice)
		}
	}
	seed := seedOf(req.Seed, pl.ids[0], h.cfg.Seed)
	h.writeBody(w, f, map[string]any{
		"id": requestID(r, req.RequestID, "cmpl-", seed), "object": "text_completion", "created": h.cfg.Now().Unix(),
		"model": h.cfg.Model, "choices": out, "usage": usage(promptTotal, genTotal),
		"system_fingerprint": fingerprint, "service_tier": nil, "kv_transfer_params": nil,
	})
}

func (h *handler) completionLogprobs(c genChoice, k int, asIDs bool) map[string]any {
	tokens := make([]string, len(c.IDs))
	offsets := make([]int, len(c.IDs))
	tops := make([]orderedLogprobs, len(c.IDs))
	off := 0
	for j, id := range c.IDs {
		tokens[j] = h.tokenLabel(id, asIDs)
		offsets[j] = off
		off += len(tokens[j])
		var o orderedLogprobs
		for _, t := range h.topLogprobs(id, c.Logprobs[j], max(k, 1)) {
			o.keys = append(o.keys, h.tokenLabel(t.ID, asIDs))
			o.vals = append(o.vals, t.LP)
		}
		tops[j] = o
	}
	return map[string]any{"text_offset": offsets, "token_logprobs": c.Logprobs, "tokens": tokens, "top_logprobs": tops}
}

// completionsStream streams /v1/completions: one event per token position
// with the text delta, per-token logprobs, and with return_token_ids the
// delta ids (prompt_token_ids on each choice's first event).
func (h *handler) completionsStream(w http.ResponseWriter, r *http.Request, req *completionRequest, pl promptList, p genParams, asIDs, retIDs, skip bool) {
	seed := seedOf(req.Seed, pl.ids[0], h.cfg.Seed)
	id := requestID(r, req.RequestID, "cmpl-", seed)
	created := h.cfg.Now().Unix()
	n := max(req.N, 1)
	ts := tokenStream{prompts: pl.ids, params: p, seed: seed, skip: skip}
	ts.choice = func(pi, ci int, c genChoice, j int, delta string) map[string]any {
		var lp any
		if req.Logprobs != nil {
			one := c
			one.IDs, one.Logprobs = c.IDs[j:j+1], c.Logprobs[j:j+1]
			lp = h.completionLogprobs(one, *req.Logprobs, asIDs)
		}
		out := map[string]any{"index": pi*n + ci, "text": delta, "logprobs": lp, "finish_reason": nil, "stop_reason": nil}
		if j == len(c.IDs)-1 {
			out["finish_reason"], out["stop_reason"] = c.Finish, c.StopReason
		}
		if retIDs {
			out["token_ids"] = c.IDs[j : j+1]
			if j == 0 {
				out["prompt_token_ids"] = pl.ids[pi]
			}
		}
		return out
	}
	ts.wrap = func(choices []any) map[string]any {
		return map[string]any{"id": id, "object": "text_completion", "created": created, "model": h.cfg.Model, "choices": choices}
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		ts.usage = func(prompt, gen int) map[string]any {
			u := ts.wrap([]any{})
			u["usage"] = usage(prompt, gen)
			return u
		}
	}
	h.serveTokenStream(w, r, ts)
}
