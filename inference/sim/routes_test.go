package sim

import (
	"strings"
	"testing"
)

// TestRouteShapes pins every route's response shape with fixed seeds.
func TestRouteShapes(t *testing.T) {
	srv := startSim(t, Config{Family: "hermes", Template: "qwen3", Seed: 7, Reasoning: true, MaxModelLen: 4096})
	userTools := `"messages":[{"role":"user","content":"list the files"}],"tools":[` + terminalTool + `]`
	cases := []struct {
		name   string
		method string
		path   string
		body   string
		status int
	}{
		{"health", "GET", "/health", "", 200},
		{"models", "GET", "/v1/models", "", 200},
		{"version", "GET", "/version", "", 200},
		{"load", "GET", "/load", "", 200},
		{"chat_prompt_text", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"return_prompt_text":true,"max_tokens":3,"seed":1}`, 200},
		{"tokenize_prompt", "POST", "/tokenize", `{"prompt":"hi <think>","return_token_strs":true}`, 200},
		{"tokenize_messages", "POST", "/tokenize", `{` + userTools + `,"add_generation_prompt":true}`, 200},
		{"tokenize_both", "POST", "/tokenize", `{"prompt":"x","messages":[{"role":"user","content":"x"}]}`, 400},
		{"tokenize_continue_and_gen", "POST", "/tokenize", `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}],"continue_final_message":true,"add_generation_prompt":true}`, 400},
		{"detokenize", "POST", "/detokenize", `{"tokens":[257,117,115,101,114,10]}`, 200},
		{"detokenize_oov", "POST", "/detokenize", `{"tokens":[99999]}`, 400},
		{"completions_ids", "POST", "/v1/completions", `{"prompt":[257,117,115,101,114,10,108,115,258,10,257,97,115,115,105,115,116,97,110,116,10],"max_tokens":8,"logprobs":2,"return_token_ids":true,"return_tokens_as_token_ids":true,"seed":3}`, 200},
		{"completions_text", "POST", "/v1/completions", `{"prompt":"Hello","max_tokens":4,"logprobs":0}`, 200},
		{"completions_bad_prompt", "POST", "/v1/completions", `{"prompt":{"x":1}}`, 400},
		{"completions_unknown_model", "POST", "/v1/completions", `{"model":"gpt-9","prompt":"x"}`, 404},
		{"completions_too_long", "POST", "/v1/completions", `{"prompt":"x","max_tokens":5000}`, 400},
		{"chat_tools", "POST", "/v1/chat/completions", `{` + userTools + `,"return_token_ids":true,"logprobs":true,"top_logprobs":1,"seed":5}`, 200},
		{"chat_plain", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"say hi"}],"seed":5}`, 200},
		{"chat_length", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"say hi"}],"max_tokens":5,"return_token_ids":true}`, 200},
		{"chat_empty_tools", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tools":[]}`, 400},
		{"chat_untrusted_template", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"chat_template":"{{x}}"}`, 400},
		{"chat_top_without_logprobs", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}`, 400},
		{"chat_stream_options_no_stream", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`, 400},
		{"chat_bad_role", "POST", "/v1/chat/completions", `{"messages":[{"role":"robot","content":"x"}]}`, 400},
		{"inference_generate", "POST", "/inference/v1/generate", `{"token_ids":[257,117,115,101,114,10,104,105,258,10,257,97,115,115,105,115,116,97,110,116,10],"sampling_params":{"max_tokens":6,"logprobs":0,"seed":1}}`, 200},
		{"inference_generate_empty", "POST", "/inference/v1/generate", `{"token_ids":[]}`, 400},
		{"sglang_generate", "POST", "/generate", `{"input_ids":[257,117,115,101,114,10,104,105,258,10,257,97,115,115,105,115,116,97,110,116,10],"sampling_params":{"max_new_tokens":5},"return_logprob":true,"top_logprobs_num":2}`, 200},
		{"sglang_generate_batch", "POST", "/generate", `{"text":["a","b"],"sampling_params":{"max_new_tokens":2}}`, 200},
		{"atropos_generate", "POST", "/generate", `{"prompt":{"prompt_token_ids":[257,117,115,101,114,10,104,105,258,10,257,97,115,115,105,115,116,97,110,116,10]},"n":2,"max_tokens":4,"logprobs":0,"temperature":1.0}`, 200},
		{"atropos_generate_text", "POST", "/generate", `{"prompt":"hello","max_tokens":3}`, 200},
		{"generate_neither", "POST", "/generate", `{"foo":1}`, 400},
		{"not_found", "GET", "/v1/nothing", "", 404},
		{"chat_render", "POST", "/v1/chat/completions/render", `{` + userTools + `,"max_tokens":64,"seed":2,"logprobs":true}`, 200},
		{"completions_render", "POST", "/v1/completions/render", `{"prompt":["a","b"],"max_tokens":4}`, 200},
		{"chat_prompt_logprobs", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"prompt_logprobs":1}`, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var status int
			var body []byte
			if tc.method == "GET" {
				status, body = get(t, srv.URL+tc.path)
			} else {
				status, body = post(t, srv.URL+tc.path, tc.body)
			}
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, truncate(body))
			}
			if len(body) == 0 {
				golden(t, "routes/"+tc.name+".json", []byte("(empty body)\n"))
				return
			}
			golden(t, "routes/"+tc.name+".json", compactJSON(t, body))
		})
	}
}

func TestWrongContentType(t *testing.T) {
	srv := startSim(t, Config{})
	resp, err := httpPost(srv.URL+"/v1/completions", "text/plain", `{"prompt":"x"}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp != 415 {
		t.Fatalf("status %d, want 415", resp)
	}
}

func TestMetrics(t *testing.T) {
	srv := startSim(t, Config{})
	post(t, srv.URL+"/v1/completions", `{"prompt":"hello","max_tokens":3}`)
	status, body := get(t, srv.URL+"/metrics")
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	for _, want := range []string{
		`vllm:num_requests_running{model_name="rollout-sim"}`,
		`vllm:prompt_tokens_total{model_name="rollout-sim"} 5`,
		`vllm:generation_tokens_total{model_name="rollout-sim"} 3`,
		`vllm:request_success_total{finished_reason="length",model_name="rollout-sim"} 1`,
		`vllm:kv_cache_usage_perc`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}
