package render_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	openai "github.com/sashabaranov/go-openai"

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

// indentTemplate prints tools and tool-call arguments with
// tojson(indent=N), as Llama 3.x templates print tools.
const indentTemplate = `{{- bos_token }}
{%- if tools %}<|im_start|>system
Tools:
{% for t in tools %}{{ t | tojson(indent=4) }}{{ "\n" }}{% endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{%- if m.tool_calls %}{% for tc in m.tool_calls %}
{{ tc.function.name }} {{ tc.function.arguments | tojson(indent=2) }}{% endfor %}{% else %}
{{ m.content }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}`

// TestIndentMatchesLlamaServer renders a template that prints with
// tojson(indent=N) in-process and with llama-server started on that
// template, and wants the same bytes.
func TestIndentMatchesLlamaServer(t *testing.T) {
	e := llamacpptest.Start(t, llamacpptest.Options{})
	model := ""
	for i, a := range e.Args {
		if a == "-m" && i+1 < len(e.Args) {
			model = e.Args[i+1]
		}
	}
	if model == "" {
		t.Fatalf("no -m in llama-server's command line %v", e.Args)
	}
	path := filepath.Join(t.TempDir(), "indent.jinja")
	if err := os.WriteFile(path, []byte(indentTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := e.Serve(t, model, 8099, "--jinja", "--chat-template-file", e.CopyFileIn(t, path, "/tmp"))
	tm, err := render.NewTemplate(indentTemplate, tinyBOS, tinyEOS)
	if err != nil {
		t.Fatal(err)
	}
	tools := `[{"type":"function","function":{"name":"terminal","description":"Run a command <safely> & report: é","parameters":{"type":"object","properties":{"command":{"type":"string","description":"the command"},"timeout":{"type":"number","default":30.0,"minimum":0},"env":{"type":"object","properties":{}},"tags":{"type":"array","items":{"type":"string"},"enum":[["a"],[]]}},"required":["command"]}}},` +
		`{"type":"function","function":{"name":"noop","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}]`
	for _, c := range []struct{ name, messages string }{
		{"tools", `[{"role":"user","content":"list files"}]`},
		{"tool call", `[{"role":"user","content":"list files"},{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"terminal","arguments":"{\"command\":\"ls -la\",\"timeout\":2.5,\"env\":{\"Z\":\"1\",\"A\":[1,{\"b\":null}]},\"tags\":[]}"}}]},{"role":"tool","tool_call_id":"c1","content":"a.txt"}]`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var msgs []openai.ChatCompletionMessage
			if err := json.Unmarshal([]byte(c.messages), &msgs); err != nil {
				t.Fatal(err)
			}
			got, err := tm.Apply(msgs, json.RawMessage(tools), true, nil)
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			var out struct {
				Prompt string `json:"prompt"`
			}
			srv.MustCall(t, "/apply-template", map[string]any{"messages": json.RawMessage(c.messages), "tools": json.RawMessage(tools), "add_generation_prompt": true}, &out)
			if got != out.Prompt {
				t.Errorf("%s", diffReport("Apply", got, "llama-server", out.Prompt))
			}
		})
	}
}
