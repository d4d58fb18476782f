package inference

import (
	"context"
	"fmt"
	"net/http"

	openai "github.com/sashabaranov/go-openai"
)

// llama.cpp's llama-server through its native endpoints:
//
//   - prompt ids: POST /apply-template {messages, tools, add_generation_prompt,
//     chat_template_kwargs} → {prompt}, then POST /tokenize {content,
//     add_special: true, parse_special: true} → {tokens}; this is what the
//     server's own chat route does with a conversation, so the ids are the
//     ones a chat request would feed the model;
//   - generation: POST /completion with a token-id prompt, n_predict,
//     n_probs 1 with post_sampling_probs false (logprobs of the full
//     distribution, as vLLM's raw logprobs), return_tokens, cache_prompt and
//     the full sampler; the sampled ids and logprobs are kept verbatim;
//   - text: the ids' pieces in completion_probabilities (tokenPieces) when
//     the server wrote one entry per id, none of them a control token and
//     together valid UTF-8; otherwise POST /detokenize {tokens} → {content}
//     (special tokens kept);
//   - context: /v1/models meta.n_ctx and /props
//     default_generation_settings.n_ctx (one slot's share, the real limit).

// LlamaTemplateRequest is the /apply-template body.
type LlamaTemplateRequest struct {
	Messages []openai.ChatCompletionMessage `json:"messages"`
	Tools    []openai.Tool                  `json:"tools,omitempty"`
	// ToolsJSON, when set, is sent as "tools" instead of Tools.
	ToolsJSON           EncodedTools   `json:"-"`
	AddGenerationPrompt *bool          `json:"add_generation_prompt,omitempty"`
	ChatTemplateKwargs  map[string]any `json:"chat_template_kwargs,omitempty"`
}

func (r *LlamaTemplateRequest) encodedTools() (EncodedTools, bool) {
	return r.ToolsJSON, len(r.Tools) > 0
}

// LlamaTokenizeRequest is the /tokenize body of llama.cpp.
type LlamaTokenizeRequest struct {
	Content      string `json:"content"`
	AddSpecial   bool   `json:"add_special"`
	ParseSpecial bool   `json:"parse_special"`
}

// LlamaCompletionRequest is the /completion body with a token-id prompt.
// The sampler fields are all sent (see sampling.go).
type LlamaCompletionRequest struct {
	Prompt            TokenIDs `json:"prompt"`
	NPredict          int      `json:"n_predict"`
	NProbs            int      `json:"n_probs"`
	PostSamplingProbs bool     `json:"post_sampling_probs"`
	ReturnTokens      bool     `json:"return_tokens"`
	CachePrompt       bool     `json:"cache_prompt"`
	Stop              []string `json:"stop,omitempty"`
	Seed              *int64   `json:"seed,omitempty"`
	Temperature       float64  `json:"temperature"`
	TopK              int      `json:"top_k"`
	TopP              float64  `json:"top_p"`
	MinP              float64  `json:"min_p"`
	RepeatPenalty     float64  `json:"repeat_penalty"`
	PresencePenalty   float64  `json:"presence_penalty"`
	FrequencyPenalty  float64  `json:"frequency_penalty"`
	TypicalP          float64  `json:"typical_p"`
	TopNSigma         float64  `json:"top_n_sigma"`
	XTCProbability    float64  `json:"xtc_probability"`
	XTCThreshold      float64  `json:"xtc_threshold"`
	DryMultiplier     float64  `json:"dry_multiplier"`
	Mirostat          int      `json:"mirostat"`
	DynatempRange     float64  `json:"dynatemp_range"`
	DynatempExponent  float64  `json:"dynatemp_exponent"`
	RepeatLastN       int      `json:"repeat_last_n"`
	MinKeep           int      `json:"min_keep"`
}

// LlamaProb is one completion_probabilities entry (post_sampling_probs
// false: logprobs).
type LlamaProb struct {
	ID      *int32   `json:"id"`
	Token   string   `json:"token"`
	Logprob *float64 `json:"logprob"`
	// Bytes is the text the entry stands for: its own token's bytes plus
	// those of the ids before it that got no entry (an unfinished UTF-8
	// character). Its length bounds how many ids the entry covers.
	Bytes []int `json:"bytes"`
}

// LlamaCompletionResponse is the non-streaming /completion answer.
type LlamaCompletionResponse struct {
	Content            string         `json:"content"`
	Tokens             TokenIDs       `json:"tokens"`
	StopType           string         `json:"stop_type"`
	StoppingWord       string         `json:"stopping_word"`
	Truncated          bool           `json:"truncated"`
	TokensPredicted    int            `json:"tokens_predicted"`
	TokensEvaluated    int            `json:"tokens_evaluated"`
	Probs              []LlamaProb    `json:"completion_probabilities"`
	GenerationSettings map[string]any `json:"generation_settings"`
}

// LlamaProps is the part of GET /props the client reads.
type LlamaProps struct {
	DefaultGenerationSettings struct {
		NCtx int `json:"n_ctx"`
	} `json:"default_generation_settings"`
	TotalSlots int `json:"total_slots"`
}

// LlamaApplyTemplate posts /apply-template and returns the rendered prompt.
func (p *Pool) LlamaApplyTemplate(ctx context.Context, o CallOptions, req *LlamaTemplateRequest) (string, error) {
	var out struct {
		Prompt *string `json:"prompt"`
	}
	ep, err := p.post(ctx, o, "/apply-template", req, &out)
	if err != nil {
		return "", err
	}
	if out.Prompt == nil {
		return "", &Error{Class: ErrInfra, Endpoint: ep, Op: "POST /apply-template", RequestID: o.RequestID, Status: 200, Msg: "response has no prompt"}
	}
	return *out.Prompt, nil
}

// LlamaTokenize posts llama.cpp's /tokenize.
func (p *Pool) LlamaTokenize(ctx context.Context, o CallOptions, req *LlamaTokenizeRequest) ([]int32, error) {
	var out TokenizeResponse // llama.cpp's has only "tokens"
	ep, err := p.post(ctx, o, "/tokenize", req, &out)
	if err != nil {
		return nil, err
	}
	if out.Tokens == nil {
		return nil, &Error{Class: ErrInfra, Endpoint: ep, Op: "POST /tokenize", RequestID: o.RequestID, Status: 200, Msg: "response has no tokens (is this llama.cpp's /tokenize?)"}
	}
	return out.Tokens, nil
}

// LlamaCompletion posts /completion.
func (p *Pool) LlamaCompletion(ctx context.Context, o CallOptions, req *LlamaCompletionRequest) (*LlamaCompletionResponse, string, error) {
	var out LlamaCompletionResponse
	ep, err := p.post(ctx, o, "/completion", req, &out)
	if err != nil {
		return nil, "", err
	}
	return &out, ep, nil
}

// LlamaProps gets /props from the first endpoint that answers.
func (p *Pool) LlamaProps(ctx context.Context) (*LlamaProps, error) {
	var out LlamaProps
	if _, err := p.call(ctx, nil, http.MethodGet, "/props", "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// llamaRender renders msgs with the server's template and tokenises the
// result as the server's chat route does (BOS per the model, special
// tokens parsed).
func llamaRender(ctx context.Context, p *Pool, o CallOptions, msgs []openai.ChatCompletionMessage, tools EncodedTools, genPrompt bool, kwargs map[string]any) ([]int32, error) {
	req := &LlamaTemplateRequest{Messages: msgs, ToolsJSON: tools, AddGenerationPrompt: &genPrompt, ChatTemplateKwargs: kwargs}
	text, err := p.LlamaApplyTemplate(ctx, o, req)
	if err != nil {
		return nil, err
	}
	return p.LlamaTokenize(ctx, o, &LlamaTokenizeRequest{Content: text, AddSpecial: true, ParseSpecial: true})
}

// llamaContext returns one slot's context from /props (the limit a request
// really has), 0 when the server does not say.
func (c *Client) llamaContext(ctx context.Context) int {
	props, err := c.pool.LlamaProps(ctx)
	if err != nil {
		c.log.Warn("inference: llama.cpp /props failed; context-length guard uses /v1/models meta.n_ctx", "err", err)
		return 0
	}
	return props.DefaultGenerationSettings.NCtx
}

// ---- llama.cpp /completion ----

type llamaGen struct{ c *Client }

func (llamaGen) name() string { return BackendLlamaCpp }

func llamaRequest(in genInput) *LlamaCompletionRequest {
	s := withNeutral(in.s, topKOffLlamaCpp)
	return &LlamaCompletionRequest{
		Prompt: in.prompt, NPredict: in.maxTokens, NProbs: 1, PostSamplingProbs: false, ReturnTokens: true, CachePrompt: true,
		Stop: in.s.Stop, Seed: in.s.Seed,
		Temperature: *s.Temperature, TopK: *s.TopK, TopP: *s.TopP, MinP: *s.MinP,
		RepeatPenalty: *s.RepetitionPenalty, PresencePenalty: *s.PresencePenalty, FrequencyPenalty: *s.FrequencyPenalty,
		TypicalP: 1, TopNSigma: -1, XTCProbability: 0, XTCThreshold: 0.1, DryMultiplier: 0, Mirostat: 0,
		DynatempRange: 0, DynatempExponent: 1, RepeatLastN: 64, MinKeep: 0,
	}
}

func (g llamaGen) generate(ctx context.Context, p *Pool, in genInput) (sample, error) {
	const op = "POST /completion"
	req := llamaRequest(in)
	o := in.opts
	o.Extra = in.s.ExtraBody
	resp, ep, err := p.LlamaCompletion(ctx, o, req)
	if err != nil {
		return sample{}, err
	}
	reqID := in.opts.RequestID
	if g.c != nil && resp.GenerationSettings != nil {
		sent := samplerFields(BackendLlamaCpp, withNeutral(in.s, topKOffLlamaCpp), true)
		delete(sent, "post_sampling_probs")
		for k, v := range in.s.ExtraBody {
			sent[k] = v
		}
		g.c.recordServerSampler(sent, echoedSampler(resp.GenerationSettings, sent))
	}
	ids := resp.Tokens
	if ids == nil && resp.TokensPredicted > 0 {
		e := badAnswer(ep, op, reqID, "%d tokens predicted but no tokens returned (does this llama-server build support return_tokens?)", resp.TokensPredicted)
		e.Err = ErrNoTokenIDs
		return sample{}, e
	}
	if resp.StopType == "word" && len(ids) > 0 {
		// llama.cpp keeps the stop word's tokens in "tokens" but cuts as
		// many entries as the word tokenises to from the probabilities
		// (and the word from content). They were sampled but are not the
		// model's answer, as with vLLM's stop strings: drop the same
		// number of trailing ids from the turn.
		k, err := g.stopWordTokens(ctx, p, o, resp.StoppingWord)
		if err != nil {
			return sample{}, err
		}
		if k > len(ids) {
			return sample{}, badAnswer(ep, op, reqID, "stopping word %q is %d tokens, more than the %d generated", resp.StoppingWord, k, len(ids))
		}
		ids = ids[:len(ids)-k]
	}
	lps, missing, err := alignProbs(ids, resp.Probs)
	if err != nil {
		return sample{}, badAnswer(ep, op, reqID, "%v", err)
	}
	if missing, err = g.scoreMissing(ctx, p, in.opts, in.prompt, ids, lps, missing); err != nil {
		return sample{}, err
	}
	s := sample{ids: ids, logprobs: lps, unscored: missing, endpoint: ep, pieces: llamaPieces(ids, resp.Probs)}
	switch resp.StopType {
	case "eos":
		s.finish, s.stop = "stop", stopToken
	case "word":
		s.finish, s.stop = "stop", stopString
	case "limit":
		s.finish, s.stop = "length", stopNone
	default:
		return sample{}, badAnswer(ep, op, reqID, "stop_type %q: want eos, word or limit", resp.StopType)
	}
	if resp.Truncated {
		// The slot's context filled up during generation.
		s.finish, s.stop = "length", stopNone
	}
	return s, nil
}

// stopWordTokens is how many entries llama.cpp cut from the
// probabilities for a stop word: the word tokenised without special-token
// parsing, as the server does.
func (g llamaGen) stopWordTokens(ctx context.Context, p *Pool, o CallOptions, word string) (int, error) {
	if word == "" {
		return 0, nil
	}
	o.Extra = nil
	o.RequestID += "-stopword"
	ids, err := p.LlamaTokenize(ctx, o, &LlamaTokenizeRequest{Content: word})
	if err != nil {
		return 0, err
	}
	return len(ids), nil
}

// alignProbs matches completion_probabilities to the sampled ids.
// llama.cpp records a token's probability only when the text generated so
// far ends in a complete UTF-8 character: the ids of a character split
// over several tokens get no entry except the last one, and a generation
// cut inside a character leaves its last ids without one. Entries carry
// the id of their own token, so they are an ordered subsequence of the
// ids; but when ids repeat, more than one placement fits (the real engine
// showed it: a by-id guess put logprobs on the wrong tokens, |Δ| up to 1.45
// nats against the trainer's recomputation). So every placement consistent
// with the ids and with each entry's byte count is considered, and an
// entry is used only where its place is the same in all of them. Ids without a certain
// entry are returned in missing (their logprob is the 1.0 placeholder and
// they are not trained). An entry that matches no id is an error.
func alignProbs(ids []int32, probs []LlamaProb) ([]float32, []int, error) {
	if len(probs) == len(ids) {
		return positionalProbs(ids, probs)
	}
	for j, pr := range probs {
		if pr.ID == nil {
			return nil, nil, fmt.Errorf("%d completion_probabilities for %d tokens and entry %d has no id", len(probs), len(ids), j)
		}
		if pr.Logprob == nil || !validLogprob(*pr.Logprob) {
			return nil, nil, fmt.Errorf("logprob %d missing or invalid (post_sampling_probs must be false)", j)
		}
	}
	n := len(ids)
	fwd, bwd := placements(ids, probs)
	lps := make([]float32, n)
	for k := range lps {
		lps[k] = 1.0
	}
	certain := make([]bool, n)
	for j, pr := range probs {
		at, count := -1, 0
		for k := range n {
			if fwd[j][k] && bwd[j][k] {
				at, count = k, count+1
			}
		}
		if count == 0 {
			return nil, nil, fmt.Errorf("%d completion_probabilities for %d tokens: entry %d (token %v) matches no sampled id in order (is n_probs supported by this server?)", len(probs), len(ids), j, idOf(pr))
		}
		if count == 1 {
			lps[at], certain[at] = float32(*pr.Logprob), true
		}
	}
	var missing []int
	for k, ok := range certain {
		if !ok {
			missing = append(missing, k)
		}
	}
	return lps, missing, nil
}

// positionalProbs is alignProbs where the server wrote one entry per id.
func positionalProbs(ids []int32, probs []LlamaProb) ([]float32, []int, error) {
	// One entry per id: positional, as the server wrote them.
	lps := make([]float32, len(ids))
	for i, pr := range probs {
		if pr.ID != nil && *pr.ID != ids[i] {
			return nil, nil, fmt.Errorf("completion_probabilities entry %d is for token %d but tokens[%d] = %d", i, *pr.ID, i, ids[i])
		}
		if pr.Logprob == nil || !validLogprob(*pr.Logprob) {
			return nil, nil, fmt.Errorf("logprob %d missing or invalid (post_sampling_probs must be false)", i)
		}
		lps[i] = float32(*pr.Logprob)
	}
	return lps, nil, nil
}

// placements says where each entry of probs may sit in ids.
func placements(ids []int32, probs []LlamaProb) (fwd, bwd [][]bool) {
	// Entry j sits at a position k with ids[k] == its id; the ids between
	// the previous entry and k are the ones it covers, at most len(Bytes)
	// of them (every token has at least one byte). fwd[j][k]: entries 0..j
	// can be placed with j at k; bwd likewise for entries j..m-1. An entry
	// is certain where exactly one position is possible both ways.
	n, m := len(ids), len(probs)
	span := func(j int) int {
		if len(probs[j].Bytes) == 0 {
			return n
		}
		return len(probs[j].Bytes)
	}
	fwd = make([][]bool, m)
	for j := range m {
		fwd[j] = make([]bool, n)
		// prefix count of fwd[j-1] for the window test
		var pre []int
		if j > 0 {
			pre = make([]int, n+1)
			for k := range n {
				pre[k+1] = pre[k]
				if fwd[j-1][k] {
					pre[k+1]++
				}
			}
		}
		for k := range n {
			if ids[k] != *probs[j].ID {
				continue
			}
			if j == 0 {
				fwd[j][k] = k+1 <= span(0)
				continue
			}
			lo := max(k-span(j), 0)
			fwd[j][k] = pre[k]-pre[lo] > 0
		}
	}
	bwd = make([][]bool, m)
	for j := m - 1; j >= 0; j-- {
		bwd[j] = make([]bool, n)
		for k := range n {
			if ids[k] != *probs[j].ID {
				continue
			}
			if j == m-1 {
				bwd[j][k] = true // ids after the last entry: a generation cut inside a character
				continue
			}
			for k2 := k + 1; k2 <= min(k+span(j+1), n-1); k2++ {
				if bwd[j+1][k2] {
					bwd[j][k] = true
					break
				}
			}
		}
	}
	return fwd, bwd
}

func idOf(p LlamaProb) any {
	if p.ID == nil {
		return "?"
	}
	return *p.ID
}

// echoedSampler keeps the generation_settings keys that name sampler
// fields sent (plus the sampler order), so the manifest stays small.
func echoedSampler(gs map[string]any, sent map[string]any) map[string]any {
	out := map[string]any{}
	for k := range sent {
		if v, ok := gs[k]; ok {
			out[k] = v
		}
	}
	for _, k := range []string{"samplers", "n_probs", "post_sampling_probs", "n_ctx"} {
		if v, ok := gs[k]; ok {
			out[k] = v
		}
	}
	return out
}

// ---- chat mode: ids from another source ----

// promptIDsFallback renders the chat request's messages on the server when
// the chat answer carries no prompt ids (llama.cpp): the same template and
// tokenisation the chat route applied.
func (c *Client) promptIDsFallback(ctx context.Context, o CallOptions, msgs []openai.ChatCompletionMessage, tools EncodedTools, kwargs map[string]any) ([]int32, error) {
	c.mu.Lock()
	llama := c.llama
	c.mu.Unlock()
	if llama {
		return llamaRender(ctx, c.pool, o, msgs, tools, true, kwargs)
	}
	gp := true
	resp, err := c.pool.Tokenize(ctx, o, &TokenizeRequest{Messages: msgs, ToolsJSON: tools, AddGenerationPrompt: &gp, ChatTemplateKwargs: kwargs})
	if err != nil {
		return nil, err
	}
	return resp.Tokens, nil
}

// noIDsError is the error of a turn whose ids were requested and that no
// source returned.
func noIDsError(ep, op, reqID, what string, cause error) error {
	e := &Error{Class: ErrInfra, Endpoint: ep, Op: op, RequestID: reqID, Status: 200, acknowledged: true,
		Msg: fmt.Sprintf("chat_token_ids is set but %s; the server must return token ids (vLLM ≥ 0.10.2 return_token_ids, llama.cpp logprobs with ids) or chat_token_ids must be off", what),
		Err: ErrNoTokenIDs}
	if cause != nil {
		e.Msg += fmt.Sprintf(" (fallback render failed: %v)", cause)
	}
	return e
}
