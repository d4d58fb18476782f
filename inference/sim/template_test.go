package sim

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// conversation is a multi-turn tool episode with reasoning, used by the
// template goldens.
const conversation = `[
 {"role":"system","content":"You are a careful engineer."},
 {"role":"user","content":"Find the bug in a.py"},
 {"role":"assistant","reasoning":"Start by listing files.","content":"Looking.","tool_calls":[{"id":"callid001","type":"function","function":{"name":"terminal","arguments":"{\"command\":\"ls\"}"}}]},
 {"role":"tool","tool_call_id":"callid001","content":"a.py"},
 {"role":"assistant","content":"<think>\nRead it.\n</think>\n\n","tool_calls":[{"id":"callid002","type":"function","function":{"name":"read_file","arguments":{"path":"a.py","limit":10}}},{"id":"callid003","type":"function","function":{"name":"terminal","arguments":"{\"command\":\"python a.py\"}"}}]},
 {"role":"tool","tool_call_id":"callid002","content":"print(1/0)"},
 {"role":"tool","tool_call_id":"callid003","content":"ZeroDivisionError"},
 {"role":"assistant","reasoning":"Division by zero.","content":"Line 1 divides by zero."},
 {"role":"user","content":"Thanks! Fix it."}
]`

const readFileTool = `{"type":"function","function":{"name":"read_file","description":"Read a file","parameters":{"type":"object","properties":{"path":{"type":"string"},"limit":{"type":"integer"}}}}}`

func renderFor(t *testing.T, family, tmpl string, msgs string, o renderOptions, withTools bool) string {
	t.Helper()
	h, err := newHandler(Config{Family: family, Template: tmpl})
	if err != nil {
		t.Fatal(err)
	}
	var m []Message
	if err := json.Unmarshal([]byte(msgs), &m); err != nil {
		t.Fatal(err)
	}
	var tools []Tool
	if withTools {
		if err := json.Unmarshal([]byte("["+terminalTool+","+readFileTool+"]"), &tools); err != nil {
			t.Fatal(err)
		}
	}
	rm, err := prepareMessages(m)
	if err != nil {
		t.Fatal(err)
	}
	out, err := h.tmpl.render(h.tmpl, family, rm, tools, o)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTemplateGoldens(t *testing.T) {
	cases := []struct{ template, family string }{
		{"hermes", "hermes"},
		{"chatml", "kimi_k2"},
		{"chatml", "glm45"},
		{"qwen2.5", "hermes"},
		{"qwen3", "hermes"},
		{"qwen3", "qwen3_coder"},
		{"llama3", "llama3_json"},
		{"deepseek_v3", "deepseek_v3"},
		{"mistral", "mistral"},
	}
	for _, tc := range cases {
		t.Run(tc.template+"_"+tc.family, func(t *testing.T) {
			got := renderFor(t, tc.family, tc.template, conversation, renderOptions{AddGenerationPrompt: true}, true)
			golden(t, fmt.Sprintf("templates/%s_%s.txt", tc.template, tc.family), []byte(got))
			// What the template renders is exactly what the tokenizer
			// round-trips.
			tok := NewTokenizer()
			back, _ := tok.Decode(tok.Encode(got), false)
			if back != got {
				t.Error("rendered prompt does not round-trip through the tokenizer")
			}
		})
	}
}

func TestQwen3ThinkStripping(t *testing.T) {
	const first = `[{"role":"user","content":"go"},{"role":"assistant","reasoning":"secret plan","content":"","tool_calls":[{"id":"callid00a","type":"function","function":{"name":"terminal","arguments":"{}"}}]},{"role":"tool","tool_call_id":"callid00a","content":"ok"}]`
	inLoop := renderFor(t, "hermes", "qwen3", first, renderOptions{AddGenerationPrompt: true}, false)
	if !strings.Contains(inLoop, "<think>\nsecret plan\n</think>\n\n") {
		t.Fatalf("reasoning of the current tool loop was dropped:\n%s", inLoop)
	}
	const later = `[{"role":"user","content":"go"},{"role":"assistant","reasoning":"secret plan","content":"","tool_calls":[{"id":"callid00a","type":"function","function":{"name":"terminal","arguments":"{}"}}]},{"role":"tool","tool_call_id":"callid00a","content":"ok"},{"role":"assistant","content":"done"},{"role":"user","content":"again"}]`
	after := renderFor(t, "hermes", "qwen3", later, renderOptions{AddGenerationPrompt: true}, false)
	if strings.Contains(after, "secret plan") {
		t.Fatalf("qwen3 kept reasoning of a turn before the last user message:\n%s", after)
	}
	// This is the drift a token-exact client must survive: the earlier
	// render is no longer a prefix of the later one.
	loopNoGen := renderFor(t, "hermes", "qwen3", first, renderOptions{}, false)
	if strings.HasPrefix(after, loopNoGen) {
		t.Fatal("expected the re-render to diverge from the earlier prefix")
	}
	// Other ChatML templates ignore reasoning entirely.
	if s := renderFor(t, "hermes", "hermes", first, renderOptions{}, false); strings.Contains(s, "secret plan") {
		t.Fatalf("hermes template rendered reasoning:\n%s", s)
	}
	off := renderFor(t, "hermes", "qwen3", `[{"role":"user","content":"go"}]`, renderOptions{AddGenerationPrompt: true, EnableThinkingSetFalse: true}, false)
	if !strings.HasSuffix(off, "<|im_start|>assistant\n<think>\n\n</think>\n\n") {
		t.Fatalf("enable_thinking=false generation prompt wrong:\n%q", off)
	}
}

func TestRenderErrors(t *testing.T) {
	h, err := newHandler(Config{})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]chatRender{
		"empty":        {},
		"bad role":     {Messages: []Message{{Role: "robot", Content: json.RawMessage(`"x"`)}}},
		"image part":   {Messages: []Message{{Role: "user", Content: json.RawMessage(`[{"type":"image_url","image_url":{}}]`)}}},
		"bad content":  {Messages: []Message{{Role: "user", Content: json.RawMessage(`42`)}}},
		"no call name": {Messages: []Message{{Role: "assistant", ToolCalls: []MessageToolCall{{}}}}},
		"continue on user": {Messages: []Message{{Role: "user", Content: json.RawMessage(`"x"`)}},
			ContinueFinalMessage: true},
	}
	for name, c := range cases {
		if _, _, e := h.render(c); e == nil || e.Status != 400 {
			t.Errorf("%s: got %v, want a 400", name, e)
		}
	}
}

// TestSampledTurnSplices runs one real turn through the server and checks
// the property the token-exact client relies on: the prompt ids plus the
// sampled ids are a prefix of the re-rendered conversation, up to the
// template's known drift (the "\n" after <|im_end|>; reasoning dropped by
// templates that strip it).
func TestSampledTurnSplices(t *testing.T) {
	cases := []struct {
		family, template string
		reasoning        bool
		drift            bool // the re-render is expected to differ
	}{
		{"hermes", "hermes", false, false},
		{"hermes", "qwen3", true, false},
		{"qwen3_coder", "qwen3", true, false},
		{"glm45", "chatml", false, false},
		{"kimi_k2", "chatml", false, false},
		{"llama3_json", "llama3", false, false},
		{"llama3_json", "llama3", true, true},
		{"deepseek_v3", "deepseek_v3", false, false},
		{"deepseek_v3", "deepseek_v3", true, true},
		{"mistral", "mistral", false, false},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s_%s_reasoning=%v", tc.family, tc.template, tc.reasoning), func(t *testing.T) {
			srv := startSim(t, Config{Family: tc.family, Template: tc.template, Reasoning: tc.reasoning, Seed: 11})
			msgs := `[{"role":"user","content":"list the files"}]`
			tools := `[` + terminalTool + `]`
			_, b := post(t, srv.URL+"/tokenize", `{"messages":`+msgs+`,"tools":`+tools+`}`)
			p0 := decode[struct{ Tokens []int }](t, b).Tokens
			_, b = post(t, srv.URL+"/inference/v1/generate", mustJSON(t, map[string]any{"token_ids": p0, "sampling_params": map[string]any{"logprobs": 0, "seed": 3}}))
			gen := decode[struct {
				Choices []struct {
					TokenIDs     []int  `json:"token_ids"`
					FinishReason string `json:"finish_reason"`
				}
			}](t, b)
			sampled := gen.Choices[0].TokenIDs
			// The chat route with the same seed samples the same ids and
			// parses them.
			_, b = post(t, srv.URL+"/v1/chat/completions", `{"messages":`+msgs+`,"tools":`+tools+`,"seed":3,"return_token_ids":true}`)
			chat := decode[struct {
				PromptTokenIDs []int `json:"prompt_token_ids"`
				Choices        []struct {
					Message  json.RawMessage `json:"message"`
					TokenIDs []int           `json:"token_ids"`
				}
			}](t, b)
			if !slices.Equal(chat.PromptTokenIDs, p0) {
				t.Fatalf("chat prompt ids differ from /tokenize")
			}
			if !slices.Equal(chat.Choices[0].TokenIDs, sampled) {
				t.Fatalf("chat and generate sampled different ids")
			}
			var asst map[string]any
			if err := json.Unmarshal(chat.Choices[0].Message, &asst); err != nil {
				t.Fatal(err)
			}
			next := `[{"role":"user","content":"list the files"},` + mustJSON(t, asst) + `,{"role":"tool","tool_call_id":"callid00x","content":"a.py"}]`
			_, b = post(t, srv.URL+"/tokenize", `{"messages":`+next+`,"tools":`+tools+`}`)
			p1 := decode[struct{ Tokens []int }](t, b).Tokens
			spliced := append(slices.Clone(p0), sampled...)
			prefix := len(p1) >= len(spliced) && slices.Equal(p1[:len(spliced)], spliced)
			if prefix == tc.drift {
				tok := NewTokenizer()
				a, _ := tok.Decode(spliced, false)
				c, _ := tok.Decode(p1, false)
				t.Fatalf("prefix=%v, want %v\nspliced:  %q\nrerender: %q", prefix, !tc.drift, a, c)
			}
			chatml := strings.HasPrefix(tc.template, "qwen") || tc.template == "hermes" || tc.template == "chatml"
			if prefix && chatml {
				if p1[len(spliced)] != '\n' {
					t.Errorf("ChatML re-render should continue with the newline after <|im_end|>, got id %d", p1[len(spliced)])
				}
			}
		})
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
