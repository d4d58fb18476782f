package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
)

// genParams are the sampling settings every route maps its request onto.
type genParams struct {
	MaxTokens *int // nil: route default
	N         int
	Seed      *int64
	Stop      []string
}

// genChoice is one sampled completion.
type genChoice struct {
	IDs        []int
	Logprobs   []float64
	Finish     string // "stop" or "length"
	StopReason any    // nil (EOS or length) or the matched stop string
	Plan       turnPlan
	// Versions is the policy version each id was drawn under.
	Versions []int64
}

// apiError is a request error with the HTTP status vLLM would use.
type apiError struct {
	Status int
	Type   string
	Msg    string
}

func (e *apiError) Error() string { return e.Msg }

func badRequest(format string, a ...any) *apiError {
	return &apiError{Status: 400, Type: "BadRequestError", Msg: fmt.Sprintf(format, a...)}
}

// generate samples p.N completions for prompt. defaultMax is the route's
// max_tokens default (0: the rest of the context window).
func (h *handler) generate(prompt []int, p genParams, defaultMax int) ([]genChoice, *apiError) {
	if len(prompt) == 0 {
		return nil, badRequest("prompt must contain at least one token")
	}
	for i, id := range prompt {
		if err := h.tok.check(id); err != nil {
			return nil, badRequest("prompt token %d: %v", i, err)
		}
	}
	maxTokens := defaultMax
	if p.MaxTokens != nil {
		maxTokens = *p.MaxTokens
		if maxTokens < 1 {
			return nil, badRequest("max_tokens must be at least 1, got %d", maxTokens)
		}
	}
	if maxTokens == 0 {
		maxTokens = h.cfg.MaxModelLen - len(prompt)
	}
	if len(prompt)+maxTokens > h.cfg.MaxModelLen || maxTokens < 1 {
		return nil, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			h.cfg.MaxModelLen, len(prompt)+maxTokens, len(prompt), maxTokens)
	}
	n := p.N
	if n == 0 {
		n = 1
	}
	if n < 1 || n > 64 {
		return nil, badRequest("n must be between 1 and 64, got %d", n)
	}
	text, _ := h.tok.Decode(prompt, false) // ids were checked above
	info := inspectPrompt(h.tmpl, h.cfg.Family, text)
	var seed uint64
	if p.Seed != nil {
		seed = uint64(*p.Seed)
	} else {
		seed = uint64(h.cfg.Seed) + hashIDs(prompt)
	}
	// The path (correct or wrong) of a scripted episode is drawn once, on
	// its first turn, and read back from the history on later turns. The
	// draw is keyed by the request seed, or — unseeded — by the server seed
	// and an ordinal of episodes with the same first user message, so a
	// GRPO group of identical prompts still spreads over both paths while
	// a run stays reproducible.
	firstUser := hashString(info.FirstUser)
	eot := h.tok.mustID(h.tmpl.eot)
	out := make([]genChoice, n)
	for i := range out {
		var ch genChoice
		var ids []int
		if h.cfg.ExactLength {
			ids = exactLengthIDs(maxTokens)
		} else {
			ch.Plan = h.cfg.chooseTurn(info, func(s Script) bool {
				if info.Turn > 0 {
					if wrong, ok := h.cfg.pathFromHistory(s, text, info); ok {
						return wrong
					}
				}
				var rng *rand.Rand
				if p.Seed != nil {
					rng = rand.New(rand.NewPCG(uint64(*p.Seed)^firstUser, uint64(i)))
				} else {
					rng = rand.New(rand.NewPCG(uint64(h.cfg.Seed)^firstUser, h.episodeOrdinal(firstUser, info.Turn)<<8|uint64(i)))
				}
				return rng.Float64() >= h.cfg.SuccessProb
			})
			body := h.cfg.renderTurn(ch.Plan, info)
			cut, reason := cutAtStop(body, p.Stop)
			ids = h.tok.Encode(cut)
			if reason != nil {
				ch.StopReason = *reason
			} else {
				ids = append(ids, eot)
			}
		}
		ch.Finish = "stop"
		if len(ids) > maxTokens {
			ids = ids[:maxTokens]
			ch.Finish, ch.StopReason = "length", nil
		}
		if h.cfg.ExactLength {
			ch.Finish = "length"
		}
		ch.IDs = ids
		lpRNG := rand.New(rand.NewPCG(seed, uint64(i)|1<<32))
		ch.Logprobs = make([]float64, len(ids))
		for j := range ids {
			ch.Logprobs[j] = sampleLogprob(lpRNG)
		}
		out[i] = ch
	}
	return out, nil
}

// sampleLogprob draws a plausible sampled-token logprob: mostly near 0,
// sometimes a few nats below. Rounded so goldens stay readable.
func sampleLogprob(r *rand.Rand) float64 {
	lp := -r.ExpFloat64() * 0.3
	lp = math.Round(lp*1e6) / 1e6
	if lp < -9999 {
		lp = -9999
	}
	if lp == 0 {
		lp = 0 // avoid -0 in JSON
	}
	return lp
}

// tokLP is one (token, logprob) entry of a top-k list.
type tokLP struct {
	ID int
	LP float64
}

// topLogprobs lists k entries for a sampled position: the sampled token
// first (as vLLM inserts it), then k-1 less likely alternatives. Derived
// from the position, not from randomness, so it adds no RNG draws.
func (h *handler) topLogprobs(id int, lp float64, k int) []tokLP {
	if k <= 0 {
		return nil
	}
	out := []tokLP{{id, lp}}
	for j := 1; len(out) < k; j++ {
		alt := (id + 7*j) % 256
		if alt == id {
			continue
		}
		out = append(out, tokLP{alt, math.Round((lp-0.75*float64(j)-0.5)*1e6) / 1e6})
	}
	return out
}

// cutAtStop truncates text before the earliest stop string.
func cutAtStop(text string, stop []string) (string, *string) {
	best := -1
	var which string
	for _, s := range stop {
		if s == "" {
			continue
		}
		if i := strings.Index(text, s); i >= 0 && (best < 0 || i < best) {
			best, which = i, s
		}
	}
	if best < 0 {
		return text, nil
	}
	return text[:best], &which
}

const filler = "The quick brown fox jumps over the lazy dog. "

func exactLengthIDs(n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = int(filler[i%len(filler)])
	}
	return ids
}

// episodeOrdinal numbers unseeded episodes per first user message: a
// first-turn request opens a new episode, a later turn whose path the
// history cannot tell reuses the latest one.
func (h *handler) episodeOrdinal(firstUser uint64, turn int) uint64 {
	h.episodeMu.Lock()
	defer h.episodeMu.Unlock()
	n := h.episodes[firstUser]
	if turn == 0 {
		h.episodes[firstUser] = n + 1
		return n
	}
	return max(n, 1) - 1
}
