package sim

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// prompt_logprobs has vLLM's shape: one entry per prompt position, null
// first, then {token id: {logprob, rank, decoded_token}} with the top k
// (ranks 1..k) and the prompt's own token (with its rank) when it is not
// among them. The same ids score the same twice.
func TestPromptLogprobs(t *testing.T) {
	srv := startSim(t, Config{Family: "hermes", Seed: 3})
	ids := make([]int, 64)
	for i := range ids {
		ids[i] = 'a' + i%26
	}
	body, _ := json.Marshal(map[string]any{"model": "rollout-sim", "prompt": ids, "max_tokens": 1, "prompt_logprobs": 5})
	code, raw := post(t, srv.URL+"/v1/completions", string(body))
	if code != 200 {
		t.Fatalf("%d %s", code, raw)
	}
	type entry struct {
		Logprob      *float64 `json:"logprob"`
		Rank         int      `json:"rank"`
		DecodedToken *string  `json:"decoded_token"`
	}
	var resp struct {
		Choices []struct {
			PromptLogprobs []map[string]entry `json:"prompt_logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		t.Fatal(err)
	}
	pl := resp.Choices[0].PromptLogprobs
	if len(pl) != len(ids) || pl[0] != nil || !strings.Contains(string(raw), `"prompt_logprobs":[null,{`) {
		t.Fatalf("%d positions, first %v", len(pl), pl[0])
	}
	disagree := 0
	for p := 1; p < len(ids); p++ {
		own, ok := pl[p][strconv.Itoa(ids[p])]
		if !ok {
			t.Fatalf("position %d lacks the prompt's token %d: %v", p, ids[p], pl[p])
		}
		ranks := map[int]bool{}
		for k, e := range pl[p] {
			if e.Logprob == nil || *e.Logprob > 0 || e.DecodedToken == nil || e.Rank < 1 {
				t.Fatalf("position %d token %s: %+v", p, k, e)
			}
			ranks[e.Rank] = true
		}
		for r := 1; r <= 5; r++ {
			if !ranks[r] {
				t.Fatalf("position %d: no rank %d: %v", p, r, pl[p])
			}
		}
		if n := len(pl[p]); n != 5 && !(n == 6 && own.Rank > 5) {
			t.Fatalf("position %d: %d entries", p, n)
		}
		if own.Rank > 1 {
			disagree++
		}
	}
	if disagree == 0 || disagree > len(ids)/2 {
		t.Fatalf("the teacher disagrees with the prompt at %d of %d positions", disagree, len(ids)-1)
	}
	_, again := post(t, srv.URL+"/v1/completions", string(body))
	var a2 struct {
		Choices []struct {
			PromptLogprobs json.RawMessage `json:"prompt_logprobs"`
		} `json:"choices"`
	}
	var a1 = a2
	_ = json.Unmarshal(raw, &a1)
	_ = json.Unmarshal(again, &a2)
	if string(a1.Choices[0].PromptLogprobs) != string(a2.Choices[0].PromptLogprobs) {
		t.Fatal("prompt_logprobs differ for the same ids")
	}
	for _, bad := range []string{`"prompt_logprobs": 21`, `"prompt_logprobs": -1`, `"prompt_logprobs": 2, "stream": true`} {
		code, raw := post(t, srv.URL+"/v1/completions", `{"model":"rollout-sim","prompt":[1,2,3],"max_tokens":1,`+bad+`}`)
		if code != 400 {
			t.Errorf("%s: %d %s", bad, code, raw)
		}
	}
}
