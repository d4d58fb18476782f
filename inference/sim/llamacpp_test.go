package sim

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestLlamaCppIntrospection(t *testing.T) {
	srv := startSim(t, Config{Engine: EngineLlamaCpp, MaxModelLen: 1000, Slots: 4})
	code, b := get(t, srv.URL+"/v1/models")
	m := decode[struct {
		Data []map[string]any `json:"data"`
	}](t, b)
	if code != 200 || len(m.Data) != 1 {
		t.Fatalf("%d %s", code, b)
	}
	meta, _ := m.Data[0]["meta"].(map[string]any)
	if _, has := m.Data[0]["max_model_len"]; has || meta["n_ctx"] != 4000.0 || meta["n_ctx_train"] == nil {
		t.Fatalf("models: %s", b)
	}
	code, b = get(t, srv.URL+"/props")
	p := decode[struct {
		DGS        map[string]any `json:"default_generation_settings"`
		TotalSlots int            `json:"total_slots"`
	}](t, b)
	if code != 200 || p.DGS["n_ctx"] != 1000.0 || p.TotalSlots != 4 || p.DGS["top_k"] != 40.0 {
		t.Fatalf("props: %s", b)
	}
	if code, _ := post(t, srv.URL+"/inference/v1/generate", `{"token_ids":[1]}`); code != 404 {
		t.Fatalf("vLLM route served by the llama.cpp flavour: %d", code)
	}
	if _, err := NewHandler(Config{Engine: "tgi"}); err == nil {
		t.Fatal("unknown engine accepted")
	}
}

func TestLlamaCppTokenizeAndTemplate(t *testing.T) {
	srv := startSim(t, Config{Engine: EngineLlamaCpp, Family: "llama3_json"})
	bos := srv.h.tok.mustID(srv.h.tmpl.bos)
	_, b := post(t, srv.URL+"/tokenize", `{"content":"hi","add_special":true}`)
	tk := decode[struct{ Tokens []int }](t, b)
	if len(tk.Tokens) != 3 || tk.Tokens[0] != bos {
		t.Fatalf("add_special: %s", b)
	}
	_, b = post(t, srv.URL+"/tokenize", `{"content":"<|eot_id|>","parse_special":false}`)
	if tk := decode[struct{ Tokens []int }](t, b); len(tk.Tokens) != len("<|eot_id|>") {
		t.Fatalf("parse_special false: %s", b)
	}
	_, b = post(t, srv.URL+"/tokenize", `{"content":"a","with_pieces":true}`)
	if !strings.Contains(string(b), `"piece":"a"`) {
		t.Fatalf("with_pieces: %s", b)
	}
	_, b = post(t, srv.URL+"/detokenize", `{"tokens":[104,105]}`)
	if !strings.Contains(string(b), `"content":"hi"`) {
		t.Fatalf("detokenize: %s", b)
	}
	code, b := post(t, srv.URL+"/apply-template", `{"messages":[{"role":"user","content":"q"}]}`)
	tp := decode[struct{ Prompt string }](t, b)
	if code != 200 || strings.HasPrefix(tp.Prompt, srv.h.tmpl.bos) || !strings.Contains(tp.Prompt, "q") {
		t.Fatalf("apply-template (template BOS dropped, added back by add_special): %d %s", code, b)
	}
	code, b = post(t, srv.URL+"/apply-template", `{"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"t","arguments":"{\"a\": 1"}}]}]}`)
	if code != 500 || !strings.Contains(string(b), "Failed to parse tool call arguments as JSON") {
		t.Fatalf("bad arguments: %d %s", code, b)
	}
}

func TestLlamaCppCompletion(t *testing.T) {
	srv := startSim(t, Config{Engine: EngineLlamaCpp, Family: "hermes", MaxModelLen: 200, Seed: 1, RecordSamplers: true})
	type prob struct {
		ID          *int             `json:"id"`
		Logprob     *float64         `json:"logprob"`
		Prob        *float64         `json:"prob"`
		TopLogprobs []map[string]any `json:"top_logprobs"`
	}
	type resp struct {
		Tokens   []int          `json:"tokens"`
		StopType string         `json:"stop_type"`
		Trunc    bool           `json:"truncated"`
		GS       map[string]any `json:"generation_settings"`
		Probs    []prob         `json:"completion_probabilities"`
	}
	// Fields left out take llama.cpp's defaults.
	code, b := post(t, srv.URL+"/completion", `{"prompt":[104,105],"n_predict":5}`)
	r := decode[resp](t, b)
	if code != 200 || r.GS["top_k"] != 40.0 || r.GS["top_p"] != 0.95 || r.GS["min_p"] != 0.05 || r.GS["temperature"] != 0.8 || len(r.Tokens) != 0 || r.Probs != nil {
		t.Fatalf("defaults: %s", b)
	}
	if r.StopType != "limit" || r.Trunc {
		t.Fatalf("n_predict cut: %s", b)
	}
	code, b = post(t, srv.URL+"/completion", `{"prompt":[104,105],"n_predict":5,"n_probs":2,"return_tokens":true,"top_k":0,"top_p":1,"min_p":0,"temperature":1}`)
	r = decode[resp](t, b)
	if code != 200 || r.GS["top_k"] != 0.0 || r.GS["top_p"] != 1.0 || len(r.Tokens) != 5 || len(r.Probs) != 5 {
		t.Fatalf("explicit sampler: %s", b)
	}
	for i, p := range r.Probs {
		if p.ID == nil || *p.ID != r.Tokens[i] || p.Logprob == nil || len(p.TopLogprobs) != 2 {
			t.Fatalf("prob %d: %s", i, b)
		}
	}
	_, b = post(t, srv.URL+"/completion", `{"prompt":[104,105],"n_predict":5,"n_probs":1,"post_sampling_probs":true}`)
	if r := decode[resp](t, b); r.Probs[0].Prob == nil || r.Probs[0].Logprob != nil {
		t.Fatalf("post_sampling_probs: %s", b)
	}
	// n_predict -1 runs until the slot's context is full (ExactLength:
	// the simulated model never samples EOS).
	long := startSim(t, Config{Engine: EngineLlamaCpp, Family: "hermes", MaxModelLen: 200, ExactLength: true})
	_, b = post(t, long.URL+"/completion", `{"prompt":[104,105],"return_tokens":true}`)
	if r := decode[resp](t, b); !r.Trunc || r.StopType != "limit" || len(r.Tokens) != 198 {
		t.Fatalf("unbounded: %s", b)
	}
	code, b = post(t, srv.URL+"/completion", `{"prompt":"`+strings.Repeat("x", 300)+`"}`)
	if code != 400 || !strings.Contains(string(b), `"type":"exceed_context_size_error"`) || !strings.Contains(string(b), "exceeds the available context size") {
		t.Fatalf("overflow: %d %s", code, b)
	}
	if recs := srv.Samplers(); len(recs) != 4 || recs[1].Fields["top_k"] != 0.0 || recs[0].Route != "POST /completion" {
		t.Fatalf("recorded samplers: %+v", recs)
	}
}

func TestLlamaCppChatQuirks(t *testing.T) {
	srv := startSim(t, Config{Engine: EngineLlamaCpp, Family: "hermes", Seed: 1})
	const tools = `"tools":[{"type":"function","function":{"name":"terminal","parameters":{"type":"object"}}}]`
	code, b := post(t, srv.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"list files"}],`+tools+`,"logprobs":true,"top_logprobs":0,"return_token_ids":true}`)
	if code != 200 || strings.Contains(string(b), `"logprobs":{`) || strings.Contains(string(b), "token_ids") {
		t.Fatalf("top_logprobs 0 must give no logprobs and no ids: %s", b)
	}
	_, b = post(t, srv.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"list files"}],`+tools+`,"logprobs":true,"top_logprobs":1}`)
	out := decode[struct {
		Choices []struct {
			Logprobs struct {
				Content []struct {
					ID    *int   `json:"id"`
					Token string `json:"token"`
				} `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}](t, b)
	if len(out.Choices) != 1 || len(out.Choices[0].Logprobs.Content) == 0 || out.Choices[0].Logprobs.Content[0].ID == nil || strings.HasPrefix(out.Choices[0].Logprobs.Content[0].Token, "token_id:") {
		t.Fatalf("logprob entries with ids: %s", b)
	}
	badHistory := `{"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"terminal","arguments":"{\"command\": \"ls"}}]},{"role":"tool","tool_call_id":"c","content":"x"}],` + tools + `}`
	code, b = post(t, srv.URL+"/v1/chat/completions", badHistory)
	if code != 500 || !strings.Contains(string(b), "Failed to parse tool call arguments as JSON") {
		t.Fatalf("llama.cpp bad history: %d %s", code, b)
	}
	code, b = post(t, srv.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"`+strings.Repeat("z", 40000)+`"}]}`)
	if code != 400 || !strings.Contains(string(b), "exceed_context_size_error") {
		t.Fatalf("chat overflow: %d %s", code, b)
	}
	vllm := startSim(t, Config{Family: "hermes", Seed: 1})
	code, b = post(t, vllm.URL+"/v1/chat/completions", badHistory)
	if code != 400 || !strings.Contains(string(b), "JSONDecodeError") {
		t.Fatalf("vLLM bad history: %d %s", code, b)
	}
}

func TestRecordSamplersVLLMGenerate(t *testing.T) {
	srv := startSim(t, Config{Family: "hermes", RecordSamplers: true})
	code, b := post(t, srv.URL+"/inference/v1/generate", `{"token_ids":[104,105],"sampling_params":{"max_tokens":3,"temperature":1,"top_k":-1}}`)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	recs := srv.Samplers()
	if len(recs) != 1 || recs[0].Fields["top_k"] != -1.0 || recs[0].Fields["temperature"] != 1.0 {
		t.Fatalf("%+v", recs)
	}
}

// The llama.cpp flavour answers a chat whose tool-call text does not parse
// (here: cut at max_tokens inside the call) as llama.cpp does — HTTP 500
// "… does not match the expected peg-native format", no text — and the
// same seed on /completion samples the text it refused.
func TestLlamaCppChatServerParseFailure(t *testing.T) {
	script := Script{Match: "cut", Steps: []Step{{ToolCalls: []Call{{Name: "terminal", Arguments: map[string]any{"command": "ls -la /tmp && echo a long command line"}}}}}}
	srv := startSim(t, Config{Engine: EngineLlamaCpp, Family: "hermes", Seed: 3, Scripts: []Script{script}})
	const tools = `[{"type":"function","function":{"name":"terminal","parameters":{"type":"object","properties":{"command":{"type":"string"}}}}}]`
	msgs := `[{"role":"user","content":"cut this call"}]`
	code, b := post(t, srv.URL+"/v1/chat/completions", `{"messages":`+msgs+`,"tools":`+tools+`,"max_tokens":30,"seed":11}`)
	if code != 500 || !strings.Contains(string(b), "does not match the expected peg-native format") || !strings.Contains(string(b), `"type":"server_error"`) {
		t.Fatalf("mangled call: %d %s", code, b)
	}
	// Without the cut the same call parses.
	if code, b := post(t, srv.URL+"/v1/chat/completions", `{"messages":`+msgs+`,"tools":`+tools+`,"max_tokens":200,"seed":11}`); code != 200 || !strings.Contains(string(b), `"tool_calls"`) {
		t.Fatalf("whole call: %d %s", code, b)
	}
	_, b = post(t, srv.URL+"/apply-template", `{"messages":`+msgs+`,"tools":`+tools+`}`)
	tp := decode[struct{ Prompt string }](t, b)
	pb, _ := json.Marshal(map[string]any{"content": tp.Prompt, "add_special": true})
	_, b = post(t, srv.URL+"/tokenize", string(pb))
	tk := decode[struct{ Tokens []int }](t, b)
	cb, _ := json.Marshal(map[string]any{"prompt": tk.Tokens, "n_predict": 30, "seed": 11, "return_tokens": true})
	code, b = post(t, srv.URL+"/completion", string(cb))
	c := decode[struct {
		Content string
		Tokens  []int
	}](t, b)
	if code != 200 || len(c.Tokens) != 30 || !strings.Contains(c.Content, "<tool_call>") {
		t.Fatalf("replay on /completion: %d %s", code, b)
	}
}
