package inference

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Honest sampling. Servers fill every sampling field a request leaves out
// with their own defaults: llama.cpp with top_k 40, top_p 0.95, min_p 0.05;
// vLLM (--generation-config auto) and SGLang with the model's
// generation_config.json (Qwen3: temperature 0.6, top_p 0.95, top_k 20).
// A trainer that computes importance ratios against the policy at
// temperature T would then learn from a truncated distribution. So every
// request states the full sampler, in the backend's own field names, and
// the unset fields are neutral: temperature 1 (or the configured one),
// top_p 1, top_k off, min_p 0, no repetition/presence/frequency penalty,
// and for llama.cpp also typical_p 1, top_n_sigma -1, XTC, DRY, mirostat and
// dynamic temperature off.

// Neutral values of the shared fields.
const (
	NeutralTemperature = 1.0
	NeutralTopP        = 1.0
	NeutralMinP        = 0.0
	NeutralRepetition  = 1.0
	NeutralPenalty     = 0.0 // presence and frequency
	// TopKOff disables top-k for vLLM and SGLang (and llama.cpp, which
	// treats any k ≤ 0 as off). The llamacpp backend sends 0, the value
	// llama.cpp documents for "off".
	TopKOff         = -1
	topKOffLlamaCpp = 0
)

// llamaNeutral are the llama.cpp-only sampler fields and their neutral
// values; the llamacpp backend sends all of them (and the chat backend when
// the server is llama.cpp).
var llamaNeutral = []struct {
	key string
	val any
}{
	{"typical_p", 1.0},
	{"top_n_sigma", -1.0},
	{"xtc_probability", 0.0},
	{"xtc_threshold", 0.1},
	{"dry_multiplier", 0.0},
	{"mirostat", 0},
	{"dynatemp_range", 0.0},
	{"dynatemp_exponent", 1.0},
	{"repeat_last_n", 64},
	{"min_keep", 0},
}

// withNeutral fills every unset sampler field with its neutral value. topKOff
// is the backend's spelling of "top-k off".
func withNeutral(s Sampling, topKOff int) Sampling {
	f := func(p *float64, v float64) *float64 {
		if p != nil {
			return p
		}
		return &v
	}
	s.Temperature = f(s.Temperature, NeutralTemperature)
	s.TopP = f(s.TopP, NeutralTopP)
	s.MinP = f(s.MinP, NeutralMinP)
	s.RepetitionPenalty = f(s.RepetitionPenalty, NeutralRepetition)
	s.PresencePenalty = f(s.PresencePenalty, NeutralPenalty)
	s.FrequencyPenalty = f(s.FrequencyPenalty, NeutralPenalty)
	if s.TopK == nil {
		k := topKOff
		s.TopK = &k
	}
	return s
}

// topKOffFor is the backend's "top-k off" value.
func topKOffFor(backend string) int {
	if backend == BackendLlamaCpp {
		return topKOffLlamaCpp
	}
	return TopKOff
}

// SamplerReport is the effective sampler of a run: the values every
// generation request sends, in the backend's own field names. It goes into
// the run manifest (run.json "sampler").
type SamplerReport struct {
	Backend string `json:"backend"`
	// Fields are the sampler fields each request sends (max_tokens, stop
	// and seed excluded), in the backend's field names.
	Fields map[string]any `json:"fields"`
	// Neutral is true when every field samples from the policy's full
	// distribution at the configured temperature.
	Neutral bool `json:"neutral"`
	// NonNeutral names the fields that truncate or reshape the
	// distribution (sorted).
	NonNeutral []string `json:"non_neutral,omitempty"`
	// ExtraBody keys can override any field; they are listed so a reader of
	// the manifest knows the fields may not be the whole story.
	ExtraBodyKeys []string `json:"extra_body_keys,omitempty"`
	// Server is the sampler as the server reported it (llama.cpp's
	// generation_settings of the first /completion response), when it
	// does; Mismatch lists the fields where it differs from Fields.
	Server   map[string]any `json:"server,omitempty"`
	Mismatch []string       `json:"mismatch,omitempty"`
}

// EffectiveSampling is the sampler a run sends: the inference config's
// sampling, overlaid by the run's (runner config) sampling, with every unset
// field made neutral.
//
// For the chat backend the llama.cpp-only fields are included once the
// client has seen that the server is llama.cpp (Client.SamplerReport);
// with sampler_fields "openai" only the fields sent are listed.
func EffectiveSampling(cfg Config, run Sampling) SamplerReport {
	return effectiveSampling(cfg, run, cfg.Backend == BackendLlamaCpp)
}

func effectiveSampling(cfg Config, run Sampling, llama bool) SamplerReport {
	s := withNeutral(mergeSampling(cfg.Sampling, run), topKOffFor(cfg.Backend))
	r := samplerReport(cfg.Backend, s, llama)
	if cfg.Backend == BackendChat && cfg.SamplerFields == SamplerFieldsOpenAI {
		for k := range r.Fields {
			switch k {
			case "temperature", "top_p", "presence_penalty", "frequency_penalty":
			default:
				delete(r.Fields, k)
			}
		}
	}
	return r
}

func samplerReport(backend string, s Sampling, llama bool) SamplerReport {
	r := SamplerReport{Backend: backend, Fields: samplerFields(backend, s, llama)}
	r.NonNeutral = nonNeutral(s)
	r.Neutral = len(r.NonNeutral) == 0
	for k := range s.ExtraBody {
		r.ExtraBodyKeys = append(r.ExtraBodyKeys, k)
	}
	sort.Strings(r.ExtraBodyKeys)
	return r
}

// samplerFields maps s (neutral-filled) onto the backend's field names.
func samplerFields(backend string, s Sampling, llama bool) map[string]any {
	m := map[string]any{
		"temperature":       *s.Temperature,
		"top_p":             *s.TopP,
		"top_k":             *s.TopK,
		"min_p":             *s.MinP,
		"presence_penalty":  *s.PresencePenalty,
		"frequency_penalty": *s.FrequencyPenalty,
	}
	if llama {
		m["repeat_penalty"] = *s.RepetitionPenalty
		if backend == BackendChat {
			m["repetition_penalty"] = *s.RepetitionPenalty // the OpenAI-style field is sent too
		}
		for _, f := range llamaNeutral {
			m[f.key] = f.val
		}
		if backend == BackendLlamaCpp {
			m["post_sampling_probs"] = false
		}
	} else {
		m["repetition_penalty"] = *s.RepetitionPenalty
	}
	return m
}

// nonNeutral lists the fields of a neutral-filled s that change the
// distribution. Temperature is the policy's own and never listed.
func nonNeutral(s Sampling) []string {
	var out []string
	if *s.TopP < 1 {
		out = append(out, "top_p")
	}
	if *s.TopK > 0 {
		out = append(out, "top_k")
	}
	if *s.MinP > 0 {
		out = append(out, "min_p")
	}
	if *s.RepetitionPenalty != 1 {
		out = append(out, "repetition_penalty")
	}
	if *s.PresencePenalty != 0 {
		out = append(out, "presence_penalty")
	}
	if *s.FrequencyPenalty != 0 {
		out = append(out, "frequency_penalty")
	}
	for _, k := range []string{"logit_bias", "typical_p", "top_n_sigma", "xtc_probability", "dry_multiplier", "mirostat", "dynatemp_range",
		"top_k", "top_p", "min_p", "repetition_penalty", "repeat_penalty", "presence_penalty", "frequency_penalty", "temperature"} {
		if _, ok := s.ExtraBody[k]; ok && !slices.Contains(out, "extra_body."+k) {
			out = append(out, "extra_body."+k)
		}
	}
	sort.Strings(out)
	return out
}

// samplerState keeps the once-per-run warnings and the server's view.
type samplerState struct {
	warnOnce sync.Once
	mu       sync.Mutex
	server   map[string]any
	mismatch []string
}

func (c *Client) warnSampler(s Sampling) {
	c.sampler.warnOnce.Do(func() {
		nn := nonNeutral(s)
		if len(nn) > 0 {
			c.log.Warn("inference: the sampler is not neutral; samples and logprobs come from a reshaped distribution, not the policy at its temperature",
				"backend", c.cfg.Backend, "fields", strings.Join(nn, ","))
		}
	})
}

// ServerSampler returns the sampler the server reported (llama.cpp's
// generation_settings of the first /completion) and the fields where it
// differs from what was sent; nil when the server said nothing.
func (c *Client) ServerSampler() (server map[string]any, mismatch []string) {
	c.sampler.mu.Lock()
	defer c.sampler.mu.Unlock()
	return c.sampler.server, slices.Clone(c.sampler.mismatch)
}

// SamplerReport is EffectiveSampling for this client plus the server's view
// when one was recorded.
func (c *Client) SamplerReport(run Sampling) SamplerReport {
	c.mu.Lock()
	llama := c.llama
	c.mu.Unlock()
	r := effectiveSampling(c.cfg, run, llama)
	r.Server, r.Mismatch = c.ServerSampler()
	return r
}

// recordServerSampler stores the server's echo of its settings once and
// warns (once) about every field that differs from what was sent.
func (c *Client) recordServerSampler(sent map[string]any, echoed map[string]any) {
	if len(echoed) == 0 {
		return
	}
	c.sampler.mu.Lock()
	if c.sampler.server != nil {
		c.sampler.mu.Unlock()
		return
	}
	c.sampler.server = echoed
	var mism []string
	for k, v := range sent {
		ev, ok := echoed[k]
		if !ok {
			continue // the server does not echo every field
		}
		switch v.(type) {
		case map[string]any, []any:
			continue // extra_body structures (logit_bias) echo in another shape
		}
		if !sameValue(v, ev) {
			mism = append(mism, fmt.Sprintf("%s: sent %v, server uses %v", k, v, ev))
		}
	}
	sort.Strings(mism)
	c.sampler.mismatch = mism
	c.sampler.mu.Unlock()
	if len(mism) > 0 {
		c.log.Warn("inference: the server reports a sampler that differs from the one sent", "backend", c.cfg.Backend, "differences", strings.Join(mism, "; "))
	} else {
		c.log.Debug("inference: server sampler matches", "backend", c.cfg.Backend)
	}
}

// sameValue compares a sent value with a JSON-decoded echo (float32
// round-off of llama.cpp's floats tolerated).
func sameValue(sent, echoed any) bool {
	a, okA := toFloat(sent)
	b, okB := toFloat(echoed)
	if okA && okB {
		return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(a))
	}
	return fmt.Sprint(sent) == fmt.Sprint(echoed)
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}
