package render_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/inference/render"
	"github.com/rollout-rl/rollout/inference/sim"
)

// simTemplate loads the simulator's model directory the way a real one is
// loaded: tokenizer_config.json's chat_template and special tokens.
func simTemplate(t *testing.T, family string) *render.Template {
	t.Helper()
	dir := t.TempDir()
	if err := sim.WriteHFModel(dir, family); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ChatTemplate string  `json:"chat_template"`
		BOS          *string `json:"bos_token"`
		EOS          string  `json:"eos_token"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	bos := ""
	if cfg.BOS != nil {
		bos = *cfg.BOS
	}
	tm, err := render.NewTemplate(cfg.ChatTemplate, bos, cfg.EOS)
	if err != nil {
		t.Fatalf("compile the simulator's %s template: %v", family, err)
	}
	return tm
}

// simCases are chatCases with their numbers respelled as Python writes
// them: the simulator prints a JSON number as the request spelled it (1e5
// stays 1e5) where engines print Python's repr (100000.0). Left out: U+2028
// (the simulator escapes it in JSON, Python does not) and array arguments
// (the simulator echoes their text).
func simCases() []chatCase {
	skip := map[string]bool{"args numbers": true, "tool schema numbers": true, "unicode and escapes": true, "args array": true}
	respell := strings.NewReplacer("1e5", "100000.0", "1.5e-7", "1.5e-07")
	var out []chatCase
	for _, c := range chatCases() {
		if !skip[c.name] {
			c.messages, c.tools = respell.Replace(c.messages), respell.Replace(c.tools)
			out = append(out, c)
		}
	}
	return append(out,
		chatCase{name: "canonical numbers", genPrompt: true,
			messages: `[{"role":"user","content":"n"},{"role":"assistant","content":"","tool_calls":[` +
				callJSON("x", "calc", `{"b":1.5,"a":2,"c":-0.25,"d":12345678901234,"e":1e+16,"f":1.5e-07,"g":0.1}`) + `]}]`},
		chatCase{name: "developer role", genPrompt: true,
			messages: `[{"role":"developer","content":"Dev rules."},{"role":"user","content":"hi"}]`},
		chatCase{name: "think prefix in content",
			messages: `[{"role":"user","content":"q"},{"role":"assistant","content":"<think>\nhidden\n</think>\n\nvisible"}]`},
		chatCase{name: "empty arguments", genPrompt: true,
			messages: `[{"role":"user","content":"q"},{"role":"assistant","content":"","tool_calls":[` + callJSON("e", "noop", ``) + `]}]`},
		chatCase{name: "case-sensitive key order", genPrompt: true,
			messages: `[{"role":"user","content":"q"},{"role":"assistant","content":"","tool_calls":[` + callJSON("k", "f", `{"b":1,"B":2,"a":{"Z":1,"y":2}}`) + `]}]`},
	)
}

// TestSimHFTemplateMatchesSimulator renders each case with the Jinja
// template WriteHFModel writes and with the simulator's own renderer (its
// /tokenize route with messages), and wants the same token ids.
func TestSimHFTemplateMatchesSimulator(t *testing.T) {
	tm := simTemplate(t, "hermes")
	h, err := sim.NewHandler(sim.Config{Family: "hermes"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	tok := sim.NewTokenizer()
	for _, c := range simCases() {
		t.Run(c.name, func(t *testing.T) {
			msgs, tools, kw := c.decode(t)
			got, err := tm.Apply(msgs, tools, c.genPrompt, kw)
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			want := simTokenize(t, srv.URL, c)
			if ids := tok.Encode(got); !slices.Equal(ids, want) {
				wantText, err := tok.Decode(want, false)
				if err != nil {
					t.Fatal(err)
				}
				t.Errorf("%s", diffReport("Jinja", got, "simulator", wantText))
			}
		})
	}
}

func simTokenize(t *testing.T, base string, c chatCase) []int {
	t.Helper()
	body := map[string]any{"messages": json.RawMessage(c.messages), "add_generation_prompt": c.genPrompt, "add_special_tokens": false}
	if c.tools != "" {
		body["tools"] = json.RawMessage(c.tools)
	}
	if c.kwargs != "" {
		body["chat_template_kwargs"] = json.RawMessage(c.kwargs)
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(base+"/tokenize", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("simulator /tokenize: HTTP %d: %s", resp.StatusCode, raw)
	}
	var out struct {
		Tokens []int `json:"tokens"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out.Tokens
}
