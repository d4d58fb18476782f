package llamacpptest

import (
	"math"
	"strconv"
	"testing"
)

// CallTemplate is a well-formed Hermes/Qwen3 tool call. Its tokens
// (through the server's own /tokenize) are what ToolCallBias pushes the
// tiny random model towards, except the argument value, so that calls are
// frequent, often cut at max_tokens or mangled, and sometimes well-formed.
const CallTemplate = "<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>"

// ToolCallBias returns a logit_bias (llama.cpp's object form, {"<id>":
// bias}) favouring the tokens of CallTemplate: `<tool_call>` and
// `</tool_call>` by callBias, the JSON skeleton by jsonBias, and
// `<|im_end|>` by endBias (it ends a turn: negative makes turns run to
// max_tokens).
func ToolCallBias(t testing.TB, e *Engine, callBias, jsonBias, endBias float64) map[string]float64 {
	t.Helper()
	var r struct {
		Tokens []struct {
			ID    int    `json:"id"`
			Piece string `json:"piece"`
		} `json:"tokens"`
	}
	e.MustCall(t, "/tokenize", map[string]any{"content": CallTemplate + "<|im_end|>", "parse_special": true, "with_pieces": true}, &r)
	bias := map[string]float64{}
	for _, tok := range r.Tokens {
		switch tok.Piece {
		case "<tool_call>", "</tool_call>":
			bias[strconv.Itoa(tok.ID)] = callBias
		case "<|im_end|>":
			bias[strconv.Itoa(tok.ID)] = endBias
		case "l", "s": // the argument value
		default:
			bias[strconv.Itoa(tok.ID)] = jsonBias
		}
	}
	if len(bias) < 8 {
		t.Fatalf("tool-call template tokenised as %+v: too few distinct tokens", r.Tokens)
	}
	return bias
}

// Rescore asks the server for the log-probability of token want after the
// ids prefix: one /completion of one token over the whole vocabulary
// (nVocab, NVocab). The sampled token is forced (logit bias +100 on a
// newline) so that its entry is never withheld by the server's UTF-8
// hold-back; llama.cpp's logprobs are the raw model's (before logit bias
// and sampler), so the forced sample does not change them.
func Rescore(t testing.TB, e *Engine, nVocab int, prefix []int32, want int32) float64 {
	t.Helper()
	req := map[string]any{
		"prompt": prefix, "n_predict": 1, "n_probs": nVocab, "cache_prompt": true,
		"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "logit_bias": [][]float64{{10, 100}},
	}
	var resp struct {
		Probs []struct {
			Top []struct {
				ID      int32   `json:"id"`
				Logprob float64 `json:"logprob"`
			} `json:"top_logprobs"`
		} `json:"completion_probabilities"`
	}
	e.MustCall(t, "/completion", req, &resp)
	if len(resp.Probs) != 1 {
		t.Fatalf("rescore: %d probability entries, want 1", len(resp.Probs))
	}
	for _, c := range resp.Probs[0].Top {
		if c.ID == want {
			return c.Logprob
		}
	}
	t.Fatalf("rescore: token %d not among the %d candidates", want, len(resp.Probs[0].Top))
	return math.NaN()
}

// NVocab reads the vocabulary size from /v1/models (meta.n_vocab).
func NVocab(t testing.TB, e *Engine) int {
	t.Helper()
	var m struct {
		Data []struct {
			Meta struct {
				NVocab int `json:"n_vocab"`
			} `json:"meta"`
		} `json:"data"`
	}
	e.MustCall(t, "/v1/models", nil, &m)
	if len(m.Data) == 0 || m.Data[0].Meta.NVocab <= 0 {
		t.Fatalf("/v1/models: no meta.n_vocab")
	}
	return m.Data[0].Meta.NVocab
}
