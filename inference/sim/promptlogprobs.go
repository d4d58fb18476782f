package sim

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
)

// MaxPromptLogprobs is the largest prompt_logprobs the simulator accepts,
// vLLM's default --max-logprobs.
const MaxPromptLogprobs = 20

// promptLogprob is one entry of a prompt position's dict, vLLM's shape.
type promptLogprob struct {
	Logprob      float64 `json:"logprob"`
	Rank         int     `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

// positionLogprobs is one prompt position's {token id: entry} object,
// written in rank order (the prompt's own token first when vLLM would).
type positionLogprobs struct {
	ids     []int
	entries []promptLogprob
}

func (p positionLogprobs) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, id := range p.ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(strconv.Itoa(id)))
		b.WriteByte(':')
		e, err := json.Marshal(p.entries[i])
		if err != nil {
			return nil, err
		}
		b.Write(e)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// promptLogprobs is the simulated teacher: for each position i > 0 of
// prompt, a distribution over the next token given prompt[:i], as vLLM
// returns it for prompt_logprobs=k: null for the first position, then a
// dict of the k most likely tokens (ranks 1..k) plus the prompt's own token
// with its rank when it is not among them. The distribution is a
// deterministic function of the prefix (a rolling hash), so scoring the
// same ids twice gives the same answer; in about a quarter of positions
// the teacher prefers another token (the prompt's token then has rank 2),
// so distillation targets differ from the sampled tokens.
func (h *handler) promptLogprobs(prompt []int, k int) []any {
	out := make([]any, len(prompt))
	out[0] = nil
	var hash uint64 = 1469598103934665603
	for i, id := range prompt {
		if i > 0 {
			out[i] = h.positionLogprobs(hash, id, k)
		}
		hash = (hash ^ uint64(id)) * 1099511628211
	}
	return out
}

func (h *handler) positionLogprobs(prefix uint64, actual, k int) positionLogprobs {
	rng := rand.New(rand.NewPCG(prefix, uint64(h.cfg.Seed)))
	disagree := rng.Float64() < 0.25
	type cand struct {
		id int
		lp float64
	}
	var cands []cand
	lpActual := sampleLogprob(rng)
	if disagree {
		top := (actual + 13) % 256
		if top == actual {
			top = (actual + 1) % 256
		}
		cands = append(cands, cand{top, round6(-0.2 - 0.1*rng.Float64())})
		lpActual = round6(-0.9 - 0.3*rng.ExpFloat64())
	}
	cands = append(cands, cand{actual, lpActual})
	for j := 1; len(cands) < max(k, 1)+1; j++ {
		alt := (actual + 7*j) % 256
		if alt == actual || (disagree && alt == cands[0].id) {
			continue
		}
		cands = append(cands, cand{alt, round6(lpActual - 0.75*float64(j) - 0.5)})
	}
	sort.SliceStable(cands, func(a, b int) bool { return cands[a].lp > cands[b].lp })
	var p positionLogprobs
	for r, c := range cands {
		if r < k || c.id == actual {
			p.ids = append(p.ids, c.id)
			p.entries = append(p.entries, promptLogprob{Logprob: c.lp, Rank: r + 1, DecodedToken: h.tok.TokenString(c.id)})
		}
	}
	// vLLM lists the prompt's own token first, then the top k.
	for i, id := range p.ids {
		if id == actual && i > 0 {
			p.ids = append([]int{id}, append(p.ids[:i:i], p.ids[i+1:]...)...)
			e := p.entries[i]
			p.entries = append([]promptLogprob{e}, append(p.entries[:i:i], p.entries[i+1:]...)...)
			break
		}
	}
	return p
}

func round6(v float64) float64 {
	v = math.Round(v*1e6) / 1e6
	if v == 0 {
		return 0
	}
	return v
}
