package llamacpptest

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func api(t *testing.T, e *Engine, route string, body any, out any) {
	t.Helper()
	e.MustCall(t, route, body, out)
}

func call(t *testing.T, e *Engine, route string, body any, out any) (int, string) {
	t.Helper()
	code, raw := e.Call(t, route, body, out)
	return code, string(raw)
}

var tools = []map[string]any{{
	"type": "function",
	"function": map[string]any{
		"name":        "terminal",
		"description": "Run a shell command",
		"parameters": map[string]any{
			"type":       "object",
			"properties": map[string]any{"command": map[string]any{"type": "string"}},
			"required":   []string{"command"},
		},
	},
}}

// neutral is the full sampler at temperature 1 with every truncation off.
var neutral = map[string]any{"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
	"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}

func with(m map[string]any, kv ...any) map[string]any {
	out := map[string]any{}
	for k, v := range neutral {
		out[k] = v
	}
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

type piece struct {
	ID    int    `json:"id"`
	Piece string `json:"piece"`
}

func tokenize(t *testing.T, e *Engine, text string) []int { t.Helper(); return e.Tokenize(t, text) }

// TestEngine runs the checks the other suites rely on against one server.
func TestEngine(t *testing.T) {
	e := Start(t, Options{})
	if !strings.HasPrefix(e.URL, "http://127.0.0.1:") {
		t.Errorf("URL %q: want the port published on 127.0.0.1", e.URL)
	}

	t.Run("health", func(t *testing.T) {
		var h struct{ Status string }
		api(t, e, "/health", nil, &h)
		if h.Status != "ok" {
			t.Fatalf("/health status %q", h.Status)
		}
	})

	t.Run("props", func(t *testing.T) {
		var p struct {
			DefaultGenerationSettings struct {
				NCtx int `json:"n_ctx"`
			} `json:"default_generation_settings"`
			TotalSlots   int    `json:"total_slots"`
			ChatTemplate string `json:"chat_template"`
			EOSToken     string `json:"eos_token"`
			BuildInfo    string `json:"build_info"`
			Caps         struct {
				SupportsTools     bool `json:"supports_tools"`
				SupportsToolCalls bool `json:"supports_tool_calls"`
			} `json:"chat_template_caps"`
		}
		api(t, e, "/props", nil, &p)
		// -c 32768 over -np 4: /props reports the per-slot context.
		if p.DefaultGenerationSettings.NCtx != 8192 || p.TotalSlots != 4 {
			t.Errorf("n_ctx %d, total_slots %d: want 8192 per slot, 4 slots", p.DefaultGenerationSettings.NCtx, p.TotalSlots)
		}
		for _, want := range []string{"<|im_start|>", "<tool_call>", "<tool_response>", "add_generation_prompt"} {
			if !strings.Contains(p.ChatTemplate, want) {
				t.Errorf("chat template lacks %q", want)
			}
		}
		if p.EOSToken != "<|im_end|>" {
			t.Errorf("eos_token %q, want <|im_end|>", p.EOSToken)
		}
		if !p.Caps.SupportsTools || !p.Caps.SupportsToolCalls {
			t.Errorf("chat_template_caps %+v: the template should support tools and tool calls", p.Caps)
		}
		t.Logf("llama-server %s", p.BuildInfo)
	})

	t.Run("tokenize special tokens", func(t *testing.T) {
		for _, special := range []string{"<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>", "<think>"} {
			var r struct {
				Tokens []piece `json:"tokens"`
			}
			api(t, e, "/tokenize", map[string]any{"content": "a" + special + "b", "parse_special": true, "with_pieces": true}, &r)
			if len(r.Tokens) != 3 || r.Tokens[1].Piece != special {
				t.Fatalf("%q tokenised as %+v: want a, one token for %s, b", "a"+special+"b", r.Tokens, special)
			}
			var d struct {
				Content string `json:"content"`
			}
			api(t, e, "/detokenize", map[string]any{"tokens": []int{r.Tokens[1].ID}}, &d)
			if d.Content != special {
				t.Errorf("detokenize(%d) = %q, want %q", r.Tokens[1].ID, d.Content, special)
			}
		}
		// The learned merges make tool-call JSON compact: far fewer tokens
		// than bytes.
		text := `{"name": "terminal", "arguments": {"command": "ls"}}`
		if n := len(tokenize(t, e, text)); n*2 > len(text) {
			t.Errorf("%q: %d tokens for %d bytes; the merges should at least halve it", text, n, len(text))
		}
	})

	messages := []map[string]any{
		{"role": "system", "content": "You are a helpful assistant."},
		{"role": "user", "content": "List the files."},
		{"role": "assistant", "content": "", "tool_calls": []map[string]any{{"id": "c1", "type": "function",
			"function": map[string]any{"name": "terminal", "arguments": `{"command": "ls"}`}}}},
		{"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
	}

	t.Run("apply-template", func(t *testing.T) {
		var r struct {
			Prompt string `json:"prompt"`
		}
		api(t, e, "/apply-template", map[string]any{"messages": messages, "tools": tools}, &r)
		for _, want := range []string{
			"<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n",
			`"name": "terminal"`,
			"<|im_start|>assistant\n<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call><|im_end|>\n",
			"<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n",
		} {
			if !strings.Contains(r.Prompt, want) {
				t.Errorf("rendered prompt lacks %q:\n%s", want, r.Prompt)
			}
		}
		if !strings.HasSuffix(r.Prompt, "<|im_start|>assistant\n") {
			t.Errorf("rendered prompt does not end with the generation prompt:\n%s", r.Prompt)
		}
	})

	t.Run("apply-template parallel calls, reasoning, tool turns", func(t *testing.T) {
		var r struct {
			Prompt string `json:"prompt"`
		}
		api(t, e, "/apply-template", map[string]any{"tools": tools, "messages": []map[string]any{
			{"role": "user", "content": []map[string]any{{"type": "text", "text": "Do it."}}},
			{"role": "assistant", "content": "Let me check.", "reasoning_content": "thinking", "tool_calls": []map[string]any{
				{"id": "a", "type": "function", "function": map[string]any{"name": "terminal", "arguments": `{"command": "ls"}`}},
				{"id": "b", "type": "function", "function": map[string]any{"name": "read_file", "arguments": `{"path": "a.txt"}`}},
			}},
			{"role": "tool", "tool_call_id": "a", "content": "a.txt"},
			{"role": "tool", "tool_call_id": "b", "content": "hello"},
			{"role": "user", "content": "ok"},
		}}, &r)
		want := "<|im_start|>user\nDo it.<|im_end|>\n" +
			"<|im_start|>assistant\n<think>\nthinking\n</think>\n\nLet me check.\n" +
			"<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n" +
			"<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call><|im_end|>\n" +
			"<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n<tool_response>\nhello\n</tool_response><|im_end|>\n" +
			"<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n"
		if !strings.HasSuffix(r.Prompt, want) {
			t.Errorf("rendered prompt:\n%s\nwant it to end with:\n%s", r.Prompt, want)
		}
	})

	t.Run("chat completion with tools", func(t *testing.T) {
		var r struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
				Logprobs     struct {
					Content []struct {
						ID      *int    `json:"id"`
						Token   string  `json:"token"`
						Logprob float64 `json:"logprob"`
					} `json:"content"`
				} `json:"logprobs"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		// The seed is fixed: a random model's free text can fail the
		// server's tool-call parser (HTTP 500), which this test is not
		// about.
		api(t, e, "/v1/chat/completions", with(map[string]any{"messages": messages, "tools": tools, "max_tokens": 6,
			"logprobs": true, "top_logprobs": 1, "seed": 1}), &r)
		if len(r.Choices) != 1 || r.Usage.CompletionTokens == 0 {
			t.Fatalf("want one choice with tokens, got %+v", r)
		}
		lp := r.Choices[0].Logprobs.Content
		if len(lp) == 0 || len(lp) > r.Usage.CompletionTokens {
			t.Fatalf("%d logprob entries for %d completion tokens", len(lp), r.Usage.CompletionTokens)
		}
		for i, c := range lp {
			if c.ID == nil || c.Logprob > 0 {
				t.Errorf("entry %d: %+v: want an id and a logprob <= 0", i, c)
			}
		}
	})

	t.Run("completion from token ids", func(t *testing.T) {
		var tmpl struct {
			Prompt string `json:"prompt"`
		}
		api(t, e, "/apply-template", map[string]any{"messages": messages, "tools": tools}, &tmpl)
		prompt := tokenize(t, e, tmpl.Prompt)
		type prob struct {
			ID          int     `json:"id"`
			Token       string  `json:"token"`
			Logprob     float64 `json:"logprob"`
			TopLogprobs []struct {
				ID      int     `json:"id"`
				Logprob float64 `json:"logprob"`
			} `json:"top_logprobs"`
		}
		var r struct {
			Tokens                  []int  `json:"tokens"`
			TokensEvaluated         int    `json:"tokens_evaluated"`
			StopType                string `json:"stop_type"`
			CompletionProbabilities []prob `json:"completion_probabilities"`
			GenerationSettings      struct {
				TopK  int     `json:"top_k"`
				TopP  float64 `json:"top_p"`
				MinP  float64 `json:"min_p"`
				Temp  float64 `json:"temperature"`
				NProb int     `json:"n_probs"`
			} `json:"generation_settings"`
		}
		req := with(map[string]any{"prompt": prompt, "n_predict": 16, "n_probs": 2, "return_tokens": true,
			"cache_prompt": false, "seed": 7})
		api(t, e, "/completion", req, &r)
		if r.TokensEvaluated != len(prompt) {
			t.Errorf("tokens_evaluated %d, want the %d prompt ids", r.TokensEvaluated, len(prompt))
		}
		if len(r.Tokens) == 0 || len(r.Tokens) > 16 {
			t.Fatalf("%d tokens for n_predict 16", len(r.Tokens))
		}
		if gs := r.GenerationSettings; gs.TopK != 0 || gs.TopP != 1 || gs.MinP != 0 || gs.Temp != 1 || gs.NProb != 2 {
			t.Errorf("generation_settings %+v: the server did not use the sampler sent", gs)
		}
		// completion_probabilities is in token order but may skip tokens
		// that end inside a UTF-8 sequence (docs/real-engines.md): it
		// must be a subsequence of tokens.
		j := 0
		for _, p := range r.CompletionProbabilities {
			for j < len(r.Tokens) && r.Tokens[j] != p.ID {
				j++
			}
			if j == len(r.Tokens) {
				t.Fatalf("probability entry for id %d is not in order in tokens %v", p.ID, r.Tokens)
			}
			j++
			if p.Logprob > 0 || math.IsNaN(p.Logprob) || len(p.TopLogprobs) != 2 || p.TopLogprobs[0].Logprob < p.Logprob {
				t.Errorf("entry %+v: want logprob <= 0 and 2 alternatives, the first at least as likely", p)
			}
		}
		if len(r.CompletionProbabilities) == 0 {
			t.Fatalf("no completion_probabilities for tokens %v", r.Tokens)
		}
		// The same request with the same seed samples the same ids.
		var again struct {
			Tokens []int `json:"tokens"`
		}
		api(t, e, "/completion", req, &again)
		if fmt.Sprint(again.Tokens) != fmt.Sprint(r.Tokens) {
			t.Errorf("same seed, different tokens: %v then %v", r.Tokens, again.Tokens)
		}
	})

	t.Run("context overflow", func(t *testing.T) {
		long := strings.Repeat("x ", 9000) // > 8192 tokens per slot
		code, raw := call(t, e, "/v1/chat/completions", map[string]any{
			"messages": []map[string]any{{"role": "user", "content": long}}, "max_tokens": 1}, nil)
		if code != http.StatusBadRequest || !strings.Contains(raw, "exceed_context_size_error") {
			t.Fatalf("over-long prompt: HTTP %d %s: want 400 exceed_context_size_error", code, raw)
		}
	})
}

// TestCopyFile copies the model's description out of the container.
func TestCopyFile(t *testing.T) {
	e := Start(t, Options{})
	dir := t.TempDir()
	p := e.CopyFile(t, "/models/tiny-qwen3.json", dir)
	if p != filepath.Join(dir, "tiny-qwen3.json") {
		t.Errorf("CopyFile returned %q", p)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var desc struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(b, &desc); err != nil || desc.Name != "tiny-qwen3" {
		t.Errorf("copied file: name %q, %v: %.200s", desc.Name, err, b)
	}
}
