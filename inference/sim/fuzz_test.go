package sim

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzRoutes feeds arbitrary bodies to every POST route: the simulator must
// answer with a status, never panic.
func FuzzRoutes(f *testing.F) {
	seeds := []string{
		`{"prompt":[257,117],"max_tokens":3}`,
		`{"messages":[{"role":"user","content":"hi"}],"tools":[` + terminalTool + `]}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"t","arguments":"{\"a\":1}"}}]},{"role":"tool","content":"x"}]}`,
		`{"token_ids":[1,2,3],"sampling_params":{"max_tokens":2,"logprobs":3}}`,
		`{"input_ids":[[1],[2]],"return_logprob":true,"top_logprobs_num":2}`,
		`{"prompt":{"prompt_token_ids":[5]},"logprobs":1,"n":3}`,
		`{"tokens":[1,2,300]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"stream":true,"logprobs":true,"return_token_ids":true}`,
		`[1,2]`, `null`, `{"prompt":"x","n":-1}`, `{"prompt":"x","max_tokens":-5}`,
	}
	routes := []string{"/v1/completions", "/v1/chat/completions", "/inference/v1/generate", "/generate", "/tokenize", "/detokenize", "/v1/chat/completions/render", "/v1/completions/render"}
	for i, s := range seeds {
		f.Add(i%len(routes), s)
	}
	h, err := newHandler(Config{Reasoning: true, MaxModelLen: 2048, Scripts: []Script{fixScript}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, route int, body string) {
		if route < 0 {
			route = -route
		}
		path := routes[route%len(routes)]
		req := httptest.NewRequest("POST", path, bytes.NewBufferString(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusNotFound:
		default:
			t.Fatalf("%s %q: status %d: %s", path, body, rec.Code, rec.Body.String())
		}
	})
}

// FuzzLlamaRoutes does the same for the llama.cpp flavour; its only 500 is
// llama.cpp's own "Failed to parse tool call arguments as JSON".
func FuzzLlamaRoutes(f *testing.F) {
	seeds := []string{
		`{"prompt":[257,117],"n_predict":3,"n_probs":2,"return_tokens":true}`,
		`{"prompt":"hi","n_predict":-1,"post_sampling_probs":true,"stop":["o"]}`,
		`{"messages":[{"role":"user","content":"hi"}],"tools":[` + terminalTool + `],"logprobs":true,"top_logprobs":1}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"t","arguments":"{\"a\":"}}]},{"role":"tool","content":"x"}]}`,
		`{"content":"<|im_end|>x","add_special":true,"with_pieces":true}`,
		`{"tokens":[1,2,300]}`, `[1,2]`, `null`, `{"prompt":[]}`, `{"prompt":[-1]}`,
	}
	routes := []string{"/completion", "/v1/chat/completions", "/apply-template", "/tokenize", "/detokenize"}
	for i, s := range seeds {
		f.Add(i%len(routes), s)
	}
	h, err := newHandler(Config{Engine: EngineLlamaCpp, Reasoning: true, MaxModelLen: 2048, Scripts: []Script{fixScript}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, route int, body string) {
		if route < 0 {
			route = -route
		}
		path := routes[route%len(routes)]
		req := httptest.NewRequest("POST", path, bytes.NewBufferString(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch {
		case rec.Code == http.StatusOK, rec.Code == http.StatusBadRequest, rec.Code == http.StatusNotFound:
		case rec.Code == http.StatusInternalServerError && bytes.Contains(rec.Body.Bytes(), []byte("Failed to parse tool call arguments as JSON")):
		default:
			t.Fatalf("%s %q: status %d: %s", path, body, rec.Code, rec.Body.String())
		}
	})
}
