package llamacpptest

import (
	"bytes"
	"encoding/json"
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
// ids prefix (RescoreMany of one position).
func Rescore(t testing.TB, e *Engine, nVocab int, prefix []int32, want int32) float64 {
	t.Helper()
	seq := append(append(make([]int32, 0, len(prefix)+1), prefix...), want)
	return RescoreMany(t, e, nVocab, seq, []int{len(prefix)})[0]
}

// rescoreBatch is how many prompts one /completion of RescoreMany carries.
const rescoreBatch = 32

// RescoreMany asks the server for the log-probability of tokens[j] after
// tokens[:j] for each j in positions, in requests of rescoreBatch prompts
// (/completion takes a list of token-id prompts and answers a list whose
// entries carry their index): per prompt one generated token over the
// whole vocabulary (nVocab, NVocab; 665 for tiny-qwen3). A first pass over
// the top 32 candidates, the whole vocabulary only for the ids not among
// them, was slower in the harness proof (2 min 5 s against 62 s for ~2,770
// ids, one run each on the loaded 2-core machine): the suite's biased and
// grammar-forced samples are often improbable under the raw model. The
// sampled token is forced (logit bias +100 on a newline) so that its entry
// is never withheld by the server's UTF-8 hold-back; llama.cpp's logprobs
// are the raw model's (before logit bias and sampler), so the forced
// sample does not change them.
func RescoreMany(t testing.TB, e *Engine, nVocab int, tokens []int32, positions []int) []float64 {
	t.Helper()
	out := make([]float64, len(positions))
	for _, j := range positions {
		if j < 1 || j >= len(tokens) {
			t.Fatalf("rescore: position %d outside [1, %d)", j, len(tokens))
		}
	}
	for start := 0; start < len(positions); start += rescoreBatch {
		chunk := positions[start:min(start+rescoreBatch, len(positions))]
		prompts := make([][]int32, len(chunk))
		for k, j := range chunk {
			prompts[k] = tokens[:j]
		}
		for k, cands := range rescoreCandidates(t, e, prompts, nVocab) {
			lp, ok := cands[tokens[chunk[k]]]
			if !ok {
				t.Fatalf("rescore: token %d not among the %d candidates at position %d", tokens[chunk[k]], len(cands), chunk[k])
			}
			out[start+k] = lp
		}
	}
	return out
}

// rescoreCandidates posts one scoring /completion of prompts and returns,
// per prompt in order, its generated position's top candidates (id →
// logprob).
func rescoreCandidates(t testing.TB, e *Engine, prompts [][]int32, top int) []map[int32]float64 {
	t.Helper()
	type result struct {
		Index int `json:"index"`
		Probs []struct {
			Top []struct {
				ID      int32   `json:"id"`
				Logprob float64 `json:"logprob"`
			} `json:"top_logprobs"`
		} `json:"completion_probabilities"`
	}
	req := map[string]any{
		"prompt": prompts, "n_predict": 1, "n_probs": top, "cache_prompt": true,
		"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "logit_bias": [][]float64{{10, 100}},
	}
	var raw json.RawMessage
	e.MustCall(t, "/completion", req, &raw)
	var res []result
	if b := bytes.TrimLeft(raw, " \t\r\n"); len(b) > 0 && b[0] == '{' {
		var one result
		if err := json.Unmarshal(b, &one); err != nil {
			t.Fatalf("rescore: %v", err)
		}
		res = []result{one}
	} else if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatalf("rescore: %v", err)
	}
	if len(res) != len(prompts) {
		t.Fatalf("rescore: %d results for %d prompts", len(res), len(prompts))
	}
	out := make([]map[int32]float64, len(prompts))
	for _, r := range res {
		if r.Index < 0 || r.Index >= len(prompts) || out[r.Index] != nil {
			t.Fatalf("rescore: result index %d out of range or repeated", r.Index)
		}
		if len(r.Probs) != 1 {
			t.Fatalf("rescore: %d probability entries, want 1", len(r.Probs))
		}
		m := make(map[int32]float64, len(r.Probs[0].Top))
		for _, c := range r.Probs[0].Top {
			m[c.ID] = c.Logprob
		}
		out[r.Index] = m
	}
	return out
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
