package inference

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

// The scoring pass's wire handling, against a server that answers as
// llama-server does (a list of results for a list of prompts, an object
// for one; n_probs capped at the vocabulary): the second, full pass asks
// again only for the ids the first did not list, results are matched by
// index, and an answer whose generated token is not the forced one is an
// error. The real server is the real-engine suite's
// (TestMultiByteEveryTokenScored).
func TestLlamaScoringPass(t *testing.T) {
	const forced, vocab = 10, 300
	var passes [][]int // n_probs and prompt count per request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/tokenize":
			_ = json.NewEncoder(w).Encode(map[string]any{"tokens": []int{forced}})
		case "/completion":
			var req struct {
				Prompt    [][]int32   `json:"prompt"`
				NProbs    int         `json:"n_probs"`
				LogitBias [][]float64 `json:"logit_bias"`
				Grammar   *string     `json:"grammar"`
			}
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			if req.Grammar != nil || len(req.LogitBias) != 1 || req.LogitBias[0][0] != forced {
				http.Error(w, "unexpected request", 400)
				return
			}
			passes = append(passes, []int{req.NProbs, len(req.Prompt)})
			var out []map[string]any
			for i, p := range req.Prompt {
				// The id after prompt p is p's length + 100; it ranks
				// below the first pass's candidates when odd.
				want := len(p) + 100
				top := []map[string]any{{"id": forced, "logprob": -0.1}}
				if want%2 == 0 || req.NProbs >= vocab {
					top = append(top, map[string]any{"id": want, "logprob": -float64(len(p))})
				}
				out = append(out, map[string]any{"index": i, "completion_probabilities": []any{map[string]any{"id": forced, "top_logprobs": top}}})
			}
			slices.Reverse(out)
			if len(out) == 1 {
				_ = json.NewEncoder(w).Encode(out[0])
				return
			}
			_ = json.NewEncoder(w).Encode(out)
		}
	}))
	defer srv.Close()
	p, err := NewPool(PoolConfig{Endpoints: []string{srv.URL}, Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	prompt := []int32{1, 2, 3}
	ids := make([]int32, 8)
	lps := make([]float32, len(ids))
	for k := range ids {
		ids[k] = int32(len(prompt) + k + 100)
		lps[k] = 1.0
	}
	left, err := llamaGen{}.scoreMissing(context.Background(), p, CallOptions{RequestID: "t"}, prompt, ids, lps, []int{1, 2, 5, 6})
	if err != nil || len(left) != 0 {
		t.Fatalf("left %v, err %v", left, err)
	}
	for _, k := range []int{1, 2, 5, 6} {
		if want := -float32(len(prompt) + k); lps[k] != want {
			t.Errorf("position %d: logprob %v, want %v", k, lps[k], want)
		}
	}
	if lps[0] != 1.0 || lps[3] != 1.0 {
		t.Errorf("positions not asked for changed: %v", lps)
	}
	// 4 prompts in the first pass; the 2 whose id is odd (positions 2
	// and 6) again in the full pass.
	if len(passes) != 2 || passes[0][0] != llamaScoreTop || passes[0][1] != 4 || passes[1][0] != llamaScoreAll || passes[1][1] != 2 {
		t.Errorf("requests (n_probs, prompts): %v", passes)
	}

	// A generated token other than the forced one is an error.
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			_ = json.NewEncoder(w).Encode(map[string]any{"tokens": []int{forced}})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"index": 0, "completion_probabilities": []any{map[string]any{"id": 7, "top_logprobs": []any{}}}})
	}))
	defer bad.Close()
	bp, err := NewPool(PoolConfig{Endpoints: []string{bad.URL}, Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer bp.Close()
	if _, err := (llamaGen{}).scoreMissing(context.Background(), bp, CallOptions{}, prompt, ids, lps, []int{3}); err == nil {
		t.Fatal("a scoring answer for another token was accepted")
	}
}
