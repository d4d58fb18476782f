package render_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/rollout-rl/rollout/inference/render"
	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
)

// The tiny model's tokens (sandbox/image/tinyqwen3/tiny-qwen3.json).
const (
	tinyBOS = "<|endoftext|>"
	tinyEOS = "<|im_end|>"
)

func tinyQwen3Template(t testing.TB) *render.Template {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "..", "sandbox", "image", "tinyqwen3", "chat_template.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tm, err := render.NewTemplate(string(src), tinyBOS, tinyEOS)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// TestApplyMatchesLlamaServer renders every case in-process and with
// llama-server's /apply-template and wants the same bytes.
func TestApplyMatchesLlamaServer(t *testing.T) {
	tm := tinyQwen3Template(t)
	e := llamacpptest.Start(t, llamacpptest.Options{})
	for _, c := range chatCases() {
		t.Run(c.name, func(t *testing.T) {
			msgs, tools, kw := c.decode(t)
			got, err := tm.Apply(msgs, tools, c.genPrompt, kw)
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			body := map[string]any{"messages": json.RawMessage(c.messages), "add_generation_prompt": c.genPrompt}
			if c.tools != "" {
				body["tools"] = json.RawMessage(c.tools)
			}
			if c.kwargs != "" {
				body["chat_template_kwargs"] = json.RawMessage(c.kwargs)
			}
			var out struct {
				Prompt string `json:"prompt"`
			}
			e.MustCall(t, "/apply-template", body, &out)
			if out.Prompt == "" {
				t.Fatalf("llama-server rendered nothing")
			}
			if got != out.Prompt {
				t.Errorf("%s", diffReport("Apply", got, "llama-server", out.Prompt))
			}
		})
	}
}

// diffReport shows both texts quoted and where they first differ.
func diffReport(an, a, bn, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo := max(0, i-40)
	return "first difference at byte " + strconv.Itoa(i) +
		"\n" + an + " near: " + strconv.Quote(a[lo:min(len(a), i+40)]) +
		"\n" + bn + " near: " + strconv.Quote(b[lo:min(len(b), i+40)]) +
		"\n" + an + ": " + strconv.Quote(a) +
		"\n" + bn + ": " + strconv.Quote(b)
}
