package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
)

// chatLogprob is one entry of the chat-style logprobs.content list (also
// used by /inference/v1/generate).
type chatLogprob struct {
	Token       string        `json:"token"`
	Logprob     float64       `json:"logprob"`
	Bytes       []int         `json:"bytes"`
	TopLogprobs []chatLogprob `json:"top_logprobs,omitempty"`
	topSet      bool
}

// MarshalJSON keeps top_logprobs present (possibly []) on main entries and
// absent on the nested ones, as vLLM does. Written by hand: logprob lists
// are the bulk of every token-mode response.
func (c chatLogprob) MarshalJSON() ([]byte, error) {
	return c.appendJSON(make([]byte, 0, 64)), nil
}

func (c chatLogprob) appendJSON(b []byte) []byte {
	b = append(b, `{"token":`...)
	b = appendJSONString(b, c.Token)
	b = append(b, `,"logprob":`...)
	b = strconv.AppendFloat(b, c.Logprob, 'g', -1, 64)
	b = append(b, `,"bytes":`...)
	if c.Bytes == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, x := range c.Bytes {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(x), 10)
		}
		b = append(b, ']')
	}
	if c.topSet {
		b = append(b, `,"top_logprobs":[`...)
		for i, t := range c.TopLogprobs {
			if i > 0 {
				b = append(b, ',')
			}
			b = t.appendJSON(b)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// chatLogprobList encodes a whole logprobs.content list in one pass, so
// encoding/json validates one value instead of one per token.
type chatLogprobList []chatLogprob

func (l chatLogprobList) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 96*len(l)+2)
	b = append(b, '[')
	for i, e := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = e.appendJSON(b)
	}
	return append(b, ']'), nil
}

// appendJSONString quotes s as JSON without HTML escaping.
func appendJSONString(b []byte, s string) []byte {
	simple := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			simple = false
			break
		}
	}
	if simple {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	var sb strings.Builder
	writeJSONString(&sb, s)
	return append(b, sb.String()...)
}

func bytesOf(b []byte) []int {
	out := make([]int, len(b))
	for i, x := range b {
		out[i] = int(x)
	}
	return out
}

// chatLogprobs builds logprobs.content. withBytes is false on the generate
// route, whose entries carry "bytes": null.
func (h *handler) chatLogprobs(c genChoice, k int, asIDs, withBytes bool) chatLogprobList {
	out := make(chatLogprobList, len(c.IDs))
	for j, id := range c.IDs {
		label := h.tokenLabel(id, asIDs)
		e := chatLogprob{Token: label, Logprob: c.Logprobs[j], topSet: true}
		if withBytes {
			e.Bytes = bytesOf(h.tok.Bytes(id))
		}
		for _, t := range h.topLogprobs(id, c.Logprobs[j], k) {
			te := chatLogprob{Token: h.tokenLabel(t.ID, asIDs), Logprob: t.LP}
			if withBytes {
				te.Bytes = bytesOf([]byte(te.Token))
			}
			e.TopLogprobs = append(e.TopLogprobs, te)
		}
		out[j] = e
	}
	return out
}

func uuidFrom(seed uint64) string {
	rng := rand.New(rand.NewPCG(seed, 0xc0ffee))
	var b [16]byte
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

type vllmGenerateRequest struct {
	RequestID      string         `json:"request_id"`
	TokenIDs       []int          `json:"token_ids"`
	Model          string         `json:"model"`
	Stream         bool           `json:"stream"`
	StreamOptions  *streamOptions `json:"stream_options"`
	SamplingParams struct {
		N          int      `json:"n"`
		MaxTokens  *int     `json:"max_tokens"`
		Seed       *int64   `json:"seed"`
		Logprobs   *int     `json:"logprobs"`
		Stop       stopList `json:"stop"`
		Detokenize *bool    `json:"detokenize"`
		// PromptLogprobs is rejected: the simulator has no prompt logprobs.
		PromptLogprobs *int `json:"prompt_logprobs"`
	} `json:"sampling_params"`
}

// vllmGenerate serves POST /inference/v1/generate: token ids in, token ids
// and logprobs out.
func (h *handler) vllmGenerate(w http.ResponseWriter, r *http.Request) {
	var req vllmGenerateRequest
	if !h.readModelRequest(w, r, &req, &req.Model) {
		return
	}
	sp := req.SamplingParams
	switch {
	case len(req.TokenIDs) == 0:
		writeError(w, badRequest("token_ids must contain at least 1 item"))
		return
	case req.StreamOptions != nil && !req.Stream:
		writeError(w, badRequest("Stream options can only be defined when `stream=True`."))
		return
	case len(sp.Stop) > 0 && sp.Detokenize != nil && !*sp.Detokenize:
		writeError(w, badRequest("stop strings are only supported when detokenize is enabled"))
		return
	case sp.PromptLogprobs != nil:
		writeError(w, badRequest("prompt_logprobs is not implemented yet in the simulator"))
		return
	case sp.Logprobs != nil && (*sp.Logprobs < 0 || *sp.Logprobs > 20):
		writeError(w, badRequest("logprobs must be between 0 and 20 (--max-logprobs), got %d", *sp.Logprobs))
		return
	}
	for i, id := range req.TokenIDs {
		if id < 0 {
			writeError(w, badRequest("token_ids[%d] must be non-negative, got %d", i, id))
			return
		}
	}
	p := genParams{MaxTokens: sp.MaxTokens, N: sp.N, Seed: sp.Seed, Stop: sp.Stop}
	if req.Stream {
		h.vllmGenerateStream(w, r, &req, p)
		return
	}
	all, f, ok := h.runGeneration(w, r, [][]int{req.TokenIDs}, p, 0)
	if !ok {
		return
	}
	var choices []any
	for i, c := range all[0] {
		var lp any
		if sp.Logprobs != nil {
			lp = map[string]any{"content": h.chatLogprobs(c, max(*sp.Logprobs, 1), true, false)}
		}
		var experts any
		if x := h.cfg.Experts; x != nil {
			experts = x.vllmExperts(append(append([]int(nil), req.TokenIDs...), c.IDs...))
		}
		choices = append(choices, map[string]any{"index": i, "logprobs": lp, "finish_reason": c.Finish, "token_ids": c.IDs, "routed_experts": experts})
	}
	// vLLM drops the caller's request id from the non-streaming response and
	// reports a fresh uuid (see the reference); the simulator does too.
	seed := seedOf(sp.Seed, req.TokenIDs, h.cfg.Seed)
	h.writeBody(w, f, map[string]any{"request_id": uuidFrom(seed), "choices": choices, "prompt_logprobs": nil, "kv_transfer_params": nil})
}

// generateDispatch serves POST /generate, which SGLang and the Atropos
// custom vLLM server both define: SGLang bodies carry input_ids, text or
// sampling_params, Atropos bodies carry prompt.
func (h *handler) generateDispatch(w http.ResponseWriter, r *http.Request) {
	var probe map[string]json.RawMessage
	body, e := readJSONBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	if err := json.Unmarshal(body, &probe); err != nil {
		writeError(w, badRequest("invalid JSON body: %v", err))
		return
	}
	_, hasPrompt := probe["prompt"]
	_, hasIDs := probe["input_ids"]
	_, hasText := probe["text"]
	switch {
	case hasPrompt && !hasIDs && !hasText:
		h.atroposGenerate(w, r, body)
	case hasIDs || hasText:
		h.sglangGenerate(w, r, body)
	default:
		writeError(w, badRequest("/generate needs input_ids or text (SGLang) or prompt (Atropos vLLM server)"))
	}
}

func readJSONBody(r *http.Request) ([]byte, *apiError) {
	var raw json.RawMessage
	if e := decodeRequest(r, &raw); e != nil {
		return nil, e
	}
	return raw, nil
}

type sglangRequest struct {
	Text           json.RawMessage `json:"text"`
	InputIDs       json.RawMessage `json:"input_ids"`
	Rid            string          `json:"rid"`
	Stream         bool            `json:"stream"`
	ReturnLogprob  bool            `json:"return_logprob"`
	TopLogprobsNum int             `json:"top_logprobs_num"`
	ReturnText     bool            `json:"return_text_in_logprobs"`
	// ReturnRoutedExperts asks for meta_info.routed_experts (answered only
	// when the server returns experts: Config.Experts).
	ReturnRoutedExperts bool `json:"return_routed_experts"`
	SamplingParams      struct {
		MaxNewTokens      *int     `json:"max_new_tokens"`
		N                 int      `json:"n"`
		Stop              stopList `json:"stop"`
		SamplingSeed      *int64   `json:"sampling_seed"`
		SkipSpecialTokens *bool    `json:"skip_special_tokens"`
	} `json:"sampling_params"`
}

func (h *handler) sglangGenerate(w http.ResponseWriter, r *http.Request, body []byte) {
	var req sglangRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, badRequest("invalid SGLang generate request: %v", err))
		return
	}
	if req.Stream {
		writeError(w, badRequest("stream=true on SGLang /generate is not implemented yet in the simulator"))
		return
	}
	if len(bytes.TrimSpace(req.Text)) > 0 && len(bytes.TrimSpace(req.InputIDs)) > 0 {
		writeError(w, badRequest("Either text or input_ids should be provided, not both"))
		return
	}
	raw := req.InputIDs
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = req.Text
	}
	// SGLang tokenises text with special tokens (BOS) added.
	pl, e := h.decodePrompt(raw, true)
	if e != nil {
		writeError(w, e)
		return
	}
	_, batch := isBatch(raw)
	sp := req.SamplingParams
	maxNew := sp.MaxNewTokens
	if maxNew == nil {
		d := 128 // SGLang's default max_new_tokens
		maxNew = &d
	}
	p := genParams{MaxTokens: maxNew, N: sp.N, Seed: sp.SamplingSeed, Stop: sp.Stop}
	start := h.cfg.Now()
	all, f, ok := h.runGeneration(w, r, pl.ids, p, 0)
	if !ok {
		return
	}
	skip := sp.SkipSpecialTokens == nil || *sp.SkipSpecialTokens
	eot := h.tok.mustID(h.tmpl.eot)
	var outs []any
	for pi, cs := range all {
		for ci, c := range cs {
			text, _ := h.tok.Decode(c.IDs, skip)
			var finish map[string]any
			switch {
			case c.Finish == "abort":
				finish = map[string]any{"type": "abort", "message": "Abort in running batch (pause_generation)."}
			case c.Finish == "length":
				finish = map[string]any{"type": "length", "length": len(c.IDs)}
			case c.StopReason != nil:
				finish = map[string]any{"type": "stop", "matched": c.StopReason}
			default:
				finish = map[string]any{"type": "stop", "matched": eot}
			}
			id := req.Rid
			if id == "" {
				id = randomHex(seedOf(sp.SamplingSeed, pl.ids[pi], h.cfg.Seed), 16)
			}
			if len(pl.ids) > 1 || len(cs) > 1 {
				id += "_" + strconv.Itoa(pi*len(cs)+ci)
			}
			spans := h.versionSpans(c.Versions)
			meta := map[string]any{
				"id": id, "finish_reason": finish, "prompt_tokens": len(pl.ids[pi]), "completion_tokens": len(c.IDs),
				"cached_tokens": 0, "weight_version": spans[len(spans)-1]["version"], "weight_versions": spans,
				"num_retractions": 0, "e2e_latency": h.cfg.Now().Sub(start).Seconds(),
			}
			if x := h.cfg.Experts; x != nil && req.ReturnRoutedExperts {
				meta["routed_experts"] = x.sglangExperts(append(append([]int(nil), pl.ids[pi]...), c.IDs...))
			}
			if req.ReturnLogprob {
				lps := make([][3]any, len(c.IDs))
				var tops [][][3]any
				for j, tid := range c.IDs {
					lps[j] = [3]any{c.Logprobs[j], tid, h.sglangText(tid, req.ReturnText)}
					if req.TopLogprobsNum > 0 {
						var row [][3]any
						for _, t := range h.topLogprobs(tid, c.Logprobs[j], req.TopLogprobsNum) {
							row = append(row, [3]any{t.LP, t.ID, h.sglangText(t.ID, req.ReturnText)})
						}
						tops = append(tops, row)
					}
				}
				meta["input_token_logprobs"] = [][3]any{}
				meta["output_token_logprobs"] = lps
				if req.TopLogprobsNum > 0 {
					meta["input_top_logprobs"] = [][][3]any{}
					meta["output_top_logprobs"] = tops
				}
			}
			outs = append(outs, map[string]any{"text": text, "output_ids": c.IDs, "meta_info": meta})
		}
	}
	if len(outs) == 1 && !batch {
		h.writeBody(w, f, outs[0])
		return
	}
	h.writeBody(w, f, outs)
}

func (h *handler) sglangText(id int, want bool) any {
	if !want {
		return nil
	}
	return h.tok.TokenString(id)
}

// isBatch reports whether a prompt is a list of prompts.
func isBatch(raw json.RawMessage) (int, bool) {
	var many []json.RawMessage
	if json.Unmarshal(raw, &many) != nil || len(many) == 0 {
		return 1, false
	}
	t := bytes.TrimSpace(many[0])
	return len(many), len(t) > 0 && (t[0] == '"' || t[0] == '[')
}

// atroposGenerate serves the Atropos example trainer's custom /generate:
// prompt is a string or {"prompt_token_ids": [...]}, every other key is a
// SamplingParams argument.
func (h *handler) atroposGenerate(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		Prompt            json.RawMessage `json:"prompt"`
		Stream            bool            `json:"stream"`
		N                 int             `json:"n"`
		MaxTokens         *int            `json:"max_tokens"`
		Logprobs          *int            `json:"logprobs"`
		Seed              *int64          `json:"seed"`
		Stop              stopList        `json:"stop"`
		SkipSpecialTokens *bool           `json:"skip_special_tokens"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, badRequest("invalid generate request: %v", err))
		return
	}
	if req.Stream {
		writeError(w, badRequest("stream=true on the Atropos /generate is not implemented yet in the simulator"))
		return
	}
	var ids []int
	var promptText string
	var tp struct {
		PromptTokenIDs []int `json:"prompt_token_ids"`
	}
	var s string
	switch {
	case json.Unmarshal(req.Prompt, &s) == nil:
		promptText = s
		ids = h.encodeText(s, true)
	case json.Unmarshal(req.Prompt, &tp) == nil && len(tp.PromptTokenIDs) > 0:
		ids = tp.PromptTokenIDs
		for i, id := range ids {
			if err := h.tok.check(id); err != nil {
				writeError(w, badRequest("prompt.prompt_token_ids[%d]: %v", i, err))
				return
			}
		}
		promptText, _ = h.tok.Decode(ids, false)
	default:
		writeError(w, badRequest(`prompt must be a string or {"prompt_token_ids": [...]}`))
		return
	}
	maxT := req.MaxTokens
	if maxT == nil {
		d := 16 // SamplingParams default
		maxT = &d
	}
	p := genParams{MaxTokens: maxT, N: req.N, Seed: req.Seed, Stop: req.Stop}
	all, f, ok := h.runGeneration(w, r, [][]int{ids}, p, 0)
	if !ok {
		return
	}
	skip := req.SkipSpecialTokens == nil || *req.SkipSpecialTokens
	texts := []string{}
	finishes := []string{}
	var lps []any
	var tokIDs [][]int
	for _, c := range all[0] {
		t, _ := h.tok.Decode(c.IDs, skip)
		texts = append(texts, t)
		finishes = append(finishes, c.Finish)
		tokIDs = append(tokIDs, c.IDs)
		if req.Logprobs != nil {
			per := make([]any, len(c.IDs))
			for j, id := range c.IDs {
				var o orderedLogprobs
				for _, t := range h.topLogprobs(id, c.Logprobs[j], max(*req.Logprobs, 1)) {
					o.keys = append(o.keys, strconv.Itoa(t.ID))
					o.vals = append(o.vals, t.LP)
				}
				per[j] = []orderedLogprobs{o}
			}
			lps = append(lps, per)
		}
	}
	resp := map[string]any{"text": texts, "prompt": promptText, "finish_reasons": finishes}
	if req.Logprobs != nil {
		resp["logprobs"] = lps
		resp["prompt_token_ids"] = ids
		resp["token_ids"] = tokIDs
	}
	h.writeBody(w, f, resp)
}

// vllmGenerateStream streams /inference/v1/generate. Unlike the
// non-streaming response, events carry the caller's request id.
func (h *handler) vllmGenerateStream(w http.ResponseWriter, r *http.Request, req *vllmGenerateRequest, p genParams) {
	seed := seedOf(p.Seed, req.TokenIDs, h.cfg.Seed)
	rid := req.RequestID
	if v := r.Header.Get("X-Request-Id"); v != "" {
		rid = v
	}
	if rid == "" {
		rid = uuidFrom(seed)
	}
	rid = "generate-tokens-" + rid
	sp := req.SamplingParams
	ts := tokenStream{prompts: [][]int{req.TokenIDs}, params: p, seed: seed, skip: true}
	ts.choice = func(_, ci int, c genChoice, j int, _ string) map[string]any {
		var lp any
		if sp.Logprobs != nil {
			one := c
			one.IDs, one.Logprobs = c.IDs[j:j+1], c.Logprobs[j:j+1]
			lp = map[string]any{"content": h.chatLogprobs(one, max(*sp.Logprobs, 1), true, false)}
		}
		var finish any
		if j == len(c.IDs)-1 {
			finish = c.Finish
		}
		return map[string]any{"index": ci, "logprobs": lp, "finish_reason": finish, "token_ids": c.IDs[j : j+1]}
	}
	ts.wrap = func(choices []any) map[string]any {
		return map[string]any{"request_id": rid, "choices": choices, "usage": nil}
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		ts.usage = func(prompt, gen int) map[string]any {
			return map[string]any{"request_id": rid, "choices": []any{}, "usage": usage(prompt, gen)}
		}
	}
	h.serveTokenStream(w, r, ts)
}
