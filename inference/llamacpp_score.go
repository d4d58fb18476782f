package inference

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
)

// The llama.cpp scoring pass: a logprob for every sampled id.
//
// llama-server drops the probability entry of a token whose text leaves
// the generated text inside a UTF-8 character (process_token adds the
// token's probabilities only when validate_utf8 finds the text complete;
// streamed or not, /completion or chat). The id itself is kept in
// "tokens". Its logprob is recovered with a second /completion whose
// prompt is the turn's prompt plus the ids sampled before it, one
// generated token forced by logit_bias to a token that is complete UTF-8
// on its own (so its entry is not withheld), and n_probs large enough
// that the entry's top_logprobs lists the id. With post_sampling_probs
// false both the generation's entries and top_logprobs are the
// log-softmax of the model's raw logits at temperature 1 (the server's
// get_token_probabilities reads llama_get_logits_ith; logit_bias,
// grammar, temperature and truncation are samplers and do not touch it),
// so the recovered logprob is of the same distribution as every other
// sampled id's: recomputed, not replayed, so it agrees to llama.cpp's
// batch-dependent rounding (measured up to ~0.08 nats on tiny-qwen3).
//
// All prompts of one turn go in one request (/completion takes a list of
// token-id prompts and answers a list, an object for a list of one).
// The first pass lists llamaScoreTop candidates; ids not among them are
// asked again with n_probs larger than any vocabulary (the server caps it
// at the vocabulary size). A server that refuses the request (HTTP 4xx:
// no multi-prompt support) leaves the ids unscored and counted, never a
// failed turn; any other failure fails the turn as a generation would.

const (
	// llamaScoreTop candidates cover a sampled id almost always at the
	// neutral sampler; the rest take the full-vocabulary pass.
	llamaScoreTop = 64
	// llamaScoreAll is more than any vocabulary: llama-server lists
	// min(n_probs, n_vocab) candidates.
	llamaScoreAll = 1 << 24
	// llamaScoreBatch prompts at most per scoring request.
	llamaScoreBatch = 32
)

// LlamaScoreRequest is the /completion body of the scoring pass: one
// forced token after each prompt, with the full distribution's top
// candidates.
type LlamaScoreRequest struct {
	Prompts           []TokenIDs  `json:"prompt"`
	NPredict          int         `json:"n_predict"`
	NProbs            int         `json:"n_probs"`
	PostSamplingProbs bool        `json:"post_sampling_probs"`
	CachePrompt       bool        `json:"cache_prompt"`
	LogitBias         [][]float64 `json:"logit_bias"`
	Temperature       float64     `json:"temperature"`
	TopK              int         `json:"top_k"`
	TopP              float64     `json:"top_p"`
	MinP              float64     `json:"min_p"`
}

// LlamaScoreCandidate is one top_logprobs entry.
type LlamaScoreCandidate struct {
	ID      int32    `json:"id"`
	Logprob *float64 `json:"logprob"`
}

// LlamaScoreResult is one prompt's answer of the scoring pass.
type LlamaScoreResult struct {
	Index int `json:"index"`
	Probs []struct {
		ID  *int32                `json:"id"`
		Top []LlamaScoreCandidate `json:"top_logprobs"`
	} `json:"completion_probabilities"`
}

// LlamaScore posts a scoring /completion and returns one result per
// prompt, in prompt order.
func (p *Pool) LlamaScore(ctx context.Context, o CallOptions, req *LlamaScoreRequest) ([]LlamaScoreResult, string, error) {
	const op = "POST /completion"
	var raw json.RawMessage
	ep, err := p.post(ctx, o, "/completion", req, &raw)
	if err != nil {
		return nil, ep, err
	}
	var out []LlamaScoreResult
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		var one LlamaScoreResult
		if err := json.Unmarshal(t, &one); err != nil {
			return nil, ep, badAnswer(ep, op, o.RequestID, "scoring answer: %v", err)
		}
		out = []LlamaScoreResult{one}
	} else if err := json.Unmarshal(raw, &out); err != nil {
		return nil, ep, badAnswer(ep, op, o.RequestID, "scoring answer: %v", err)
	}
	if len(out) != len(req.Prompts) {
		return nil, ep, badAnswer(ep, op, o.RequestID, "scoring answer has %d results for %d prompts", len(out), len(req.Prompts))
	}
	byIndex := make([]LlamaScoreResult, len(out))
	seen := make([]bool, len(out))
	for _, r := range out {
		if r.Index < 0 || r.Index >= len(out) || seen[r.Index] {
			return nil, ep, badAnswer(ep, op, o.RequestID, "scoring answer: result index %d out of range or repeated", r.Index)
		}
		byIndex[r.Index], seen[r.Index] = r, true
	}
	return byIndex, ep, nil
}

// errScoreUnsupported marks a server that refused the scoring request.
var errScoreUnsupported = errors.New("llama.cpp scoring pass not supported by this server")

// llamaForced caches the forced token id per client (-1: not learned).
type llamaForced struct{ id atomic.Int64 }

// forcedToken is an id whose text is one ASCII newline: complete UTF-8
// on its own, so its probability entry is never withheld.
func (g llamaGen) forcedToken(ctx context.Context, p *Pool, o CallOptions) (int32, error) {
	if g.c != nil {
		if v := g.c.llamaForced.id.Load(); v > 0 {
			return int32(v - 1), nil
		}
	}
	o.Extra = nil
	o.RequestID += "-forced"
	ids, err := p.LlamaTokenize(ctx, o, &LlamaTokenizeRequest{Content: "\n"})
	if err != nil {
		return 0, err
	}
	if len(ids) != 1 {
		return 0, fmt.Errorf("%w: a newline tokenises to %d ids, want 1", errScoreUnsupported, len(ids))
	}
	if g.c != nil {
		g.c.llamaForced.id.Store(int64(ids[0]) + 1)
	}
	return ids[0], nil
}

// scoreMissing fills lps at the positions missing (of ids, sampled after
// prompt) with the logprob the server computes for each id after its
// prefix, and returns the positions still without one. The caller's
// slices are updated in place.
func (g llamaGen) scoreMissing(ctx context.Context, p *Pool, o CallOptions, prompt, ids []int32, lps []float32, missing []int) ([]int, error) {
	if len(missing) == 0 || (g.c != nil && g.c.llamaScoreRefused.Load()) {
		return missing, nil
	}
	forced, err := g.forcedToken(ctx, p, o)
	if err != nil {
		if errors.Is(err, errScoreUnsupported) || errors.Is(err, ErrRequest) {
			return missing, g.unsupported(err)
		}
		return nil, err
	}
	o.Extra = nil // the run's extra body (grammar, logit_bias) must not constrain the forced token
	left := missing
	for pass, top := range []int{llamaScoreTop, llamaScoreAll} {
		var still []int
		for start := 0; start < len(left); start += llamaScoreBatch {
			chunk := left[start:min(start+llamaScoreBatch, len(left))]
			req := &LlamaScoreRequest{NPredict: 1, NProbs: top, CachePrompt: true,
				LogitBias: [][]float64{{float64(forced), 100}}, Temperature: 1, TopK: 0, TopP: 1, MinP: 0}
			for _, k := range chunk {
				pr := make(TokenIDs, 0, len(prompt)+k)
				req.Prompts = append(req.Prompts, append(append(pr, prompt...), ids[:k]...))
			}
			co := o
			co.RequestID = fmt.Sprintf("%s-score%d.%d", o.RequestID, pass, start/llamaScoreBatch)
			res, ep, err := p.LlamaScore(ctx, co, req)
			if err != nil {
				if errors.Is(err, ErrRequest) {
					return left, g.unsupported(err)
				}
				return nil, err
			}
			for i, k := range chunk {
				lp, ok, err := scoredLogprob(res[i], forced, ids[k])
				if err != nil {
					return nil, badAnswer(ep, "POST /completion", co.RequestID, "scoring prompt %d: %v", i, err)
				}
				if !ok {
					still = append(still, k)
					continue
				}
				lps[k] = lp
			}
		}
		left = still
		if len(left) == 0 {
			return nil, nil
		}
	}
	return left, nil
}

// scoredLogprob finds id's logprob in one scoring result.
func scoredLogprob(r LlamaScoreResult, forced, id int32) (float32, bool, error) {
	if len(r.Probs) != 1 {
		return 0, false, fmt.Errorf("%d probability entries for one forced token, want 1", len(r.Probs))
	}
	if e := r.Probs[0]; e.ID == nil || *e.ID != forced {
		return 0, false, fmt.Errorf("forced token %d was not the one generated (entry %v)", forced, idOfPtr(e.ID))
	}
	for _, c := range r.Probs[0].Top {
		if c.ID == id {
			if c.Logprob == nil || !validLogprob(*c.Logprob) {
				return 0, false, fmt.Errorf("candidate %d has no valid logprob", id)
			}
			return float32(*c.Logprob), true, nil
		}
	}
	return 0, false, nil
}

func idOfPtr(p *int32) any {
	if p == nil {
		return "none"
	}
	return *p
}

// unsupported records (and logs once per client) that the server cannot
// score: the ids stay unscored (counted in Sequence.Unscored) and the
// client does not ask again.
func (g llamaGen) unsupported(err error) error {
	if g.c != nil && g.c.llamaScoreRefused.CompareAndSwap(false, true) {
		g.c.log.Warn("inference: llama.cpp scoring pass refused; ids inside UTF-8 characters stay unscored (untrained, counted)", "err", err)
	}
	return nil
}
