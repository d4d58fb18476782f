package inference

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
)

// The token-in/token-out backends. Each turns a prompt of ids into the
// sampled ids, one logprob per id, and how the generation stopped; all
// shape checks happen here so the episode never sees a misaligned answer.

type stopKind int

const (
	stopNone    stopKind = iota // length, abort: no end-of-turn token sampled
	stopToken                   // stopped on EOS / a stop token id: last id is it
	stopString                  // stopped on a stop string: no end-of-turn token
	stopUnknown                 // "stop" without saying which; decided from the template
)

type genInput struct {
	model  string
	prompt []int32
	// promptJSON, when set, is prompt encoded as a JSON array (an
	// episode's promptEncoder); the vllm generator sends it as is.
	promptJSON []byte
	maxTokens  int
	s          Sampling
	opts       CallOptions
	// experts asks for the routed experts (Config.RoutedExperts); topk is
	// Config.RoutedExpertsTopK.
	experts bool
	topk    int
}

type sample struct {
	ids      []int32
	logprobs []float32
	finish   string
	stop     stopKind
	text     *string // server-decoded text (special tokens kept) when returned
	// pieces are the sampled ids' own texts as the generation response
	// spelled them (llama.cpp's completion_probabilities bytes), when it
	// spelled every id; nil otherwise.
	pieces   *tokenPieces
	endpoint string
	// unscored are positions of ids the server gave no logprob for
	// (llama.cpp, incomplete UTF-8): kept in the sequence, masked 0, with
	// the 1.0 placeholder.
	unscored []int
	// version is the engine-reported policy version (SGLang's
	// meta_info.weight_version) when versionOK.
	version   int64
	versionOK bool
	// spans are the engine's per-token version spans (SGLang), checked
	// to tile the ids and decoded once; nil when it reports none.
	spans []versionSpan
	// routing is the engine's routed experts for the request's prompt and
	// ids but the last (prompt + ids − 1 positions), when asked for.
	routing *Routing
}

// routingOf checks an engine's routing against the request: one row per
// position of the prompt and the ids but the last, top-k as configured.
func routingOf(ep, op, reqID string, in genInput, nids int, r *Routing, err error) (*Routing, error) {
	if err != nil {
		return nil, badAnswer(ep, op, reqID, "%v", err)
	}
	want := len(in.prompt) + nids - 1
	if r.Positions != want {
		return nil, badAnswer(ep, op, reqID, "routed_experts has %d positions, want %d (prompt %d + sampled %d − 1)", r.Positions, want, len(in.prompt), nids)
	}
	if in.topk > 0 && r.TopK != in.topk && r.Positions > 0 {
		return nil, badAnswer(ep, op, reqID, "routed_experts has top-k %d, routed_experts_topk is %d", r.TopK, in.topk)
	}
	return r, nil
}

type generator interface {
	generate(ctx context.Context, p *Pool, in genInput) (sample, error)
	name() string
}

var (
	fls       = false
	tru       = true
	zero      = 0
	falsePtr  = &fls
	truePtr   = &tru
	zeroIntPt = &zero
)

func badAnswer(ep, op, reqID, format string, args ...any) *Error {
	return &Error{Class: ErrInfra, Endpoint: ep, Op: op, RequestID: reqID, Status: 200, Msg: fmt.Sprintf(format, args...), Err: errMalformed, acknowledged: true}
}

func finishKind(finish string) stopKind {
	if finish == "stop" {
		return stopUnknown
	}
	return stopNone
}

// checkPrompt compares the server's echo of the prompt, if it sent one,
// with the prompt sent, and releases the echo.
func checkPrompt(ep, op, reqID string, sent []int32, echo *PromptEcho) error {
	defer echo.Release()
	if echo.Same() {
		return nil
	}
	if echoed := echo.IDs(); echoed != nil && !slices.Equal(sent, echoed) {
		return badAnswer(ep, op, reqID, "server echoed prompt_token_ids that differ from the prompt sent (%d vs %d ids)", len(echoed), len(sent))
	}
	return nil
}

// ---- vLLM /v1/completions ----

type completionsGen struct{}

func (completionsGen) name() string { return BackendVLLM }

// TokensCompletionRequest is the /v1/completions request a tokens-mode
// turn sends to vLLM: prompt ids in, sampled ids and their logprobs out
// (the logprob entries name their tokens "token_id:N"), special tokens
// kept. It does not ask for return_token_ids: that would also echo the
// whole prompt, every turn — for a long agent context hundreds of KB the
// engine serialises and the client reads only to compare with what it
// sent; usage.prompt_tokens is checked instead (a prompt the server cut
// or extended is refused). It is exported so that a bare HTTP exchange can
// send the very bytes the client sends (rollout bench inference).
func TokensCompletionRequest(model string, prompt []int32, maxTokens int, s Sampling) *CompletionRequest {
	return &CompletionRequest{
		Model:                  model,
		Prompt:                 prompt,
		samplingFields:         samplingOf(s, maxTokens),
		Logprobs:               zeroIntPt,
		ReturnTokensAsTokenIDs: true,
		SkipSpecialTokens:      falsePtr,
	}
}

// GenerateTokens is one tokens-mode generation through p on the vLLM path a
// turn takes (request encoding, endpoint choice, metrics, HTTP, decoding,
// the answer's shape checks) without rendering or an episode: the sampled
// ids and their logprobs.
func (p *Pool) GenerateTokens(ctx context.Context, model string, prompt []int32, maxTokens int, s Sampling) ([]int32, []float32, error) {
	smp, err := completionsGen{}.generate(ctx, p, genInput{model: model, prompt: prompt, maxTokens: maxTokens, s: s})
	return smp.ids, smp.logprobs, err
}

func (completionsGen) generate(ctx context.Context, p *Pool, in genInput) (sample, error) {
	const op = "POST /v1/completions"
	req := TokensCompletionRequest(in.model, in.prompt, in.maxTokens, in.s)
	req.promptJSON = in.promptJSON
	o := in.opts
	o.Extra = in.s.ExtraBody
	resp, ep, err := p.Completion(ctx, o, req)
	if err != nil {
		return sample{}, err
	}
	reqID := in.opts.RequestID
	if len(resp.Choices) != 1 {
		return sample{}, badAnswer(ep, op, reqID, "want 1 choice, got %d", len(resp.Choices))
	}
	ch := &resp.Choices[0]
	if err := checkPrompt(ep, op, reqID, in.prompt, &ch.PromptTokenIDs); err != nil {
		return sample{}, err
	}
	if u := resp.Usage; u != nil && u.PromptTokens > 0 && u.PromptTokens != len(in.prompt) {
		return sample{}, badAnswer(ep, op, reqID, "server counted %d prompt tokens, %d were sent", u.PromptTokens, len(in.prompt))
	}
	if ch.Logprobs == nil {
		return sample{}, badAnswer(ep, op, reqID, "logprobs missing")
	}
	ids := ch.TokenIDs
	if ids == nil {
		// Ids from the logprob entries, "token_id:N" (a server that
		// sends token_ids anyway is read above and cross-checked below).
		ids = make([]int32, len(ch.Logprobs.Tokens))
		for i, t := range ch.Logprobs.Tokens {
			id, ok := parseTokenID(t)
			if !ok {
				return sample{}, badAnswer(ep, op, reqID, "no token_ids and logprob token %d is %q, not token_id:N", i, t)
			}
			ids[i] = id
		}
	}
	if len(ch.Logprobs.TokenLogprobs) != len(ids) {
		return sample{}, badAnswer(ep, op, reqID, "%d logprobs for %d token ids", len(ch.Logprobs.TokenLogprobs), len(ids))
	}
	if len(ch.Logprobs.Tokens) != 0 && len(ch.Logprobs.Tokens) != len(ids) {
		return sample{}, badAnswer(ep, op, reqID, "%d logprob tokens for %d token ids", len(ch.Logprobs.Tokens), len(ids))
	}
	lps := make([]float32, len(ids))
	for i, v := range ch.Logprobs.TokenLogprobs {
		if v == nil || !validLogprob(*v) {
			return sample{}, badAnswer(ep, op, reqID, "logprob %d missing or invalid", i)
		}
		if i < len(ch.Logprobs.Tokens) {
			if id, ok := parseTokenID(ch.Logprobs.Tokens[i]); ok && id != ids[i] {
				return sample{}, badAnswer(ep, op, reqID, "logprob %d is for token %d but token_ids[%d] = %d", i, id, i, ids[i])
			}
		}
		lps[i] = float32(*v)
	}
	s := sample{ids: ids, logprobs: lps, finish: ch.FinishReason, stop: finishKind(ch.FinishReason), text: &ch.Text, endpoint: ep}
	if s.stop == stopUnknown {
		s.stop = stopFromReason(ch.StopReason)
	}
	return s, nil
}

// stopFromReason reads vLLM's stop_reason: null (EOS), an int (stop token
// id) or a string (stop string).
func stopFromReason(raw json.RawMessage) stopKind {
	if len(raw) == 0 || string(raw) == "null" {
		return stopToken
	}
	if raw[0] == '"' {
		return stopString
	}
	return stopToken
}

// ---- vLLM /inference/v1/generate ----

type vllmGenerateGen struct{}

func (vllmGenerateGen) name() string { return BackendVLLMGenerate }

func (vllmGenerateGen) generate(ctx context.Context, p *Pool, in genInput) (sample, error) {
	const op = "POST /inference/v1/generate"
	sp := GenerateParams{samplingFields: samplingOf(in.s, in.maxTokens), Logprobs: zeroIntPt, SkipSpecialTokens: falsePtr}
	// Stop strings need server-side detokenisation; otherwise ids only.
	sp.Detokenize = falsePtr
	if len(in.s.Stop) > 0 {
		sp.Detokenize = truePtr
	}
	raw, err := encodeBody(sp, in.s.ExtraBody, op, in.opts.RequestID)
	if err != nil {
		return sample{}, err
	}
	req := &GenerateRequest{RequestID: in.opts.RequestID, TokenIDs: in.prompt, SamplingParams: raw, Model: in.model}
	o := in.opts
	o.Extra = nil
	resp, ep, err := p.Generate(ctx, o, req)
	if err != nil {
		return sample{}, err
	}
	reqID := in.opts.RequestID
	if len(resp.Choices) != 1 {
		return sample{}, badAnswer(ep, op, reqID, "want 1 choice, got %d", len(resp.Choices))
	}
	ch := resp.Choices[0]
	ids, lps, err := chatStyleLogprobs(ep, op, reqID, ch.TokenIDs, ch.Logprobs, true)
	if err != nil {
		return sample{}, err
	}
	s := sample{ids: ids, logprobs: lps, finish: ch.FinishReason, stop: finishKind(ch.FinishReason), endpoint: ep}
	if s.stop == stopUnknown && len(in.s.Stop) == 0 {
		s.stop = stopToken
	}
	if in.experts {
		if ch.RoutedExperts == nil {
			return sample{}, badAnswer(ep, op, reqID, "routed_experts missing: start vLLM with --enable-return-routed-experts (inference.routed_experts is on)")
		}
		r, err := decodeNPYExperts(*ch.RoutedExperts)
		if s.routing, err = routingOf(ep, op, reqID, in, len(ids), r, err); err != nil {
			return sample{}, err
		}
	}
	return s, nil
}

// chatStyleLogprobs aligns a logprobs.content list with token ids (chat and
// /inference/v1/generate). With ids nil they are recovered from
// "token_id:N" tokens. required=false lets chat mode go without logprobs.
func chatStyleLogprobs(ep, op, reqID string, ids []int32, lp *ChatLogprobs, required bool) ([]int32, []float32, error) {
	if lp == nil {
		if required {
			return nil, nil, badAnswer(ep, op, reqID, "logprobs missing")
		}
		return ids, nil, nil
	}
	if ids == nil {
		// No token_ids: llama.cpp gives each entry's id in "id"; vLLM
		// without return_token_ids names tokens "token_id:N".
		ids = make([]int32, len(lp.Content))
		for i, e := range lp.Content {
			if e.ID != nil {
				ids[i] = *e.ID
				continue
			}
			id, ok := parseTokenID(e.Token)
			if !ok {
				return nil, nil, badAnswer(ep, op, reqID, "no token_ids and logprob token %d is %q, not token_id:N, and has no id", i, e.Token)
			}
			ids[i] = id
		}
	}
	if len(lp.Content) != len(ids) {
		return nil, nil, badAnswer(ep, op, reqID, "%d logprobs for %d token ids", len(lp.Content), len(ids))
	}
	lps := make([]float32, len(ids))
	for i, e := range lp.Content {
		if e.Logprob == nil || !validLogprob(*e.Logprob) {
			return nil, nil, badAnswer(ep, op, reqID, "logprob %d missing or invalid", i)
		}
		if id, ok := parseTokenID(e.Token); ok && id != ids[i] {
			return nil, nil, badAnswer(ep, op, reqID, "logprob %d is for token %d but token_ids[%d] = %d", i, id, i, ids[i])
		}
		if e.ID != nil && *e.ID != ids[i] {
			return nil, nil, badAnswer(ep, op, reqID, "logprob %d is for token %d but token_ids[%d] = %d", i, *e.ID, i, ids[i])
		}
		lps[i] = float32(*e.Logprob)
	}
	return ids, lps, nil
}

// ---- SGLang /generate ----

type sglangGen struct{}

func (sglangGen) name() string { return BackendSGLang }

func (sglangGen) generate(ctx context.Context, p *Pool, in genInput) (sample, error) {
	const op = "POST /generate"
	sp := SGLangParams{
		MaxNewTokens:      in.maxTokens,
		Temperature:       in.s.Temperature,
		TopP:              in.s.TopP,
		TopK:              in.s.TopK,
		MinP:              in.s.MinP,
		Stop:              in.s.Stop,
		RepetitionPenalty: in.s.RepetitionPenalty,
		PresencePenalty:   in.s.PresencePenalty,
		FrequencyPenalty:  in.s.FrequencyPenalty,
		SkipSpecialTokens: falsePtr,
	}
	extra := in.s.ExtraBody
	if in.s.Seed != nil {
		extra = withKey(extra, "sampling_seed", *in.s.Seed)
	}
	raw, err := encodeBody(sp, extra, op, in.opts.RequestID)
	if err != nil {
		return sample{}, err
	}
	req := &SGLangRequest{InputIDs: in.prompt, SamplingParams: raw, ReturnLogprob: true, RID: in.opts.RequestID, ReturnRoutedExperts: in.experts}
	o := in.opts
	o.Extra = nil
	resp, ep, err := p.SGLangGenerate(ctx, o, req)
	if err != nil {
		return sample{}, err
	}
	reqID := in.opts.RequestID
	m := resp.MetaInfo
	if m.FinishReason == nil {
		return sample{}, badAnswer(ep, op, reqID, "meta_info.finish_reason missing")
	}
	ids := resp.OutputIDs
	if len(m.OutputTokenLogprobs) != len(ids) {
		return sample{}, badAnswer(ep, op, reqID, "%d output_token_logprobs for %d output_ids", len(m.OutputTokenLogprobs), len(ids))
	}
	lps := make([]float32, len(ids))
	for i, tr := range m.OutputTokenLogprobs {
		if len(tr) < 2 {
			return sample{}, badAnswer(ep, op, reqID, "output_token_logprobs[%d] is not a [logprob, id, text] triple", i)
		}
		var lp float64
		var id int32
		if json.Unmarshal(tr[0], &lp) != nil || !validLogprob(lp) {
			return sample{}, badAnswer(ep, op, reqID, "logprob %d missing or invalid", i)
		}
		if json.Unmarshal(tr[1], &id) != nil || id != ids[i] {
			return sample{}, badAnswer(ep, op, reqID, "logprob %d is for token %s but output_ids[%d] = %d", i, tr[1], i, ids[i])
		}
		lps[i] = float32(lp)
	}
	finish := m.FinishReason.Type
	s := sample{ids: ids, logprobs: lps, finish: finish, stop: finishKind(finish), text: &resp.Text, endpoint: ep}
	if s.stop == stopUnknown {
		s.stop = stopFromReason(m.FinishReason.Matched)
	}
	if len(m.WeightVersion) > 0 {
		var wv any
		if json.Unmarshal(m.WeightVersion, &wv) == nil {
			s.version, s.versionOK = parseVersion(wv)
		}
	}
	spans, err := parseVersionSpans(m.WeightVersions, len(ids))
	if err != nil {
		return sample{}, badAnswer(ep, op, reqID, "meta_info.%v", err)
	}
	s.spans = spans
	if in.experts {
		if m.RoutedExperts == nil {
			return sample{}, badAnswer(ep, op, reqID, "meta_info.routed_experts missing: start SGLang with --enable-return-routed-experts (inference.routed_experts is on)")
		}
		r, err := decodeSGLangExperts(*m.RoutedExperts, len(in.prompt)+len(ids)-1, in.topk)
		if s.routing, err = routingOf(ep, op, reqID, in, len(ids), r, err); err != nil {
			return sample{}, err
		}
	}
	return s, nil
}

func withKey(m map[string]any, k string, v any) map[string]any {
	out := make(map[string]any, len(m)+1)
	out[k] = v
	for kk, vv := range m { // caller's extra_body wins
		out[kk] = vv
	}
	return out
}

// ---- Atropos custom vLLM /generate ----

type atroposGen struct{}

func (atroposGen) name() string { return BackendAtropos }

func (atroposGen) generate(ctx context.Context, p *Pool, in genInput) (sample, error) {
	const op = "POST /generate"
	req := &AtroposRequest{
		Prompt:            atroposPrompt{PromptTokenIDs: in.prompt},
		samplingFields:    samplingOf(in.s, in.maxTokens),
		N:                 1,
		Logprobs:          0,
		SkipSpecialTokens: falsePtr,
	}
	o := in.opts
	o.Extra = in.s.ExtraBody
	resp, ep, err := p.AtroposGenerate(ctx, o, req)
	if err != nil {
		return sample{}, err
	}
	reqID := in.opts.RequestID
	if len(resp.TokenIDs) != 1 || len(resp.Logprobs) != 1 || len(resp.FinishReasons) != 1 {
		return sample{}, badAnswer(ep, op, reqID, "want token_ids, logprobs and finish_reasons for 1 choice, got %d/%d/%d (is logprobs supported by this server?)", len(resp.TokenIDs), len(resp.Logprobs), len(resp.FinishReasons))
	}
	if err := checkPrompt(ep, op, reqID, in.prompt, &resp.PromptTokenIDs); err != nil {
		return sample{}, err
	}
	ids := resp.TokenIDs[0]
	pos := resp.Logprobs[0]
	if len(pos) != len(ids) {
		return sample{}, badAnswer(ep, op, reqID, "%d logprob positions for %d token ids", len(pos), len(ids))
	}
	lps := make([]float32, len(ids))
	for i, lst := range pos {
		if len(lst) == 0 {
			return sample{}, badAnswer(ep, op, reqID, "logprob position %d is empty", i)
		}
		// The sampled token's entry; with logprobs=0 it is the only one.
		raw, ok := lst[0][strconv.Itoa(int(ids[i]))]
		if !ok {
			return sample{}, badAnswer(ep, op, reqID, "logprob position %d has no entry for sampled token %d", i, ids[i])
		}
		var lp float64
		if json.Unmarshal(raw, &lp) != nil || !validLogprob(lp) {
			return sample{}, badAnswer(ep, op, reqID, "logprob %d invalid: %s", i, raw)
		}
		lps[i] = float32(lp)
	}
	s := sample{ids: ids, logprobs: lps, finish: resp.FinishReasons[0], stop: finishKind(resp.FinishReasons[0]), endpoint: ep}
	if len(resp.Text) == 1 {
		s.text = &resp.Text[0]
	}
	if s.stop == stopUnknown && len(in.s.Stop) == 0 {
		s.stop = stopToken
	}
	return s, nil
}
