package parsers

import (
	"strings"
	"testing"
)

// FuzzReasoning checks every reasoning parser on arbitrary text: no panic,
// no reasoning means the content is the text unchanged, and reasoning and
// content never hold more than the text did (markers are removed, nothing
// is invented or duplicated).
func FuzzReasoning(f *testing.F) {
	for _, name := range ReasoningNames() {
		var cases []reasoningCase
		loadGolden(f, "golden_reasoning", name, 0, &cases)
		for _, c := range cases {
			f.Add(c.Input, c.ThinkingDisabled)
		}
	}
	f.Fuzz(func(t *testing.T, text string, disabled bool) {
		for _, name := range ReasoningNames() {
			p, _ := GetReasoning(name)
			r, content := p.Extract(text, ReasoningOptions{ThinkingDisabled: disabled})
			if r == nil {
				if content != text {
					t.Fatalf("%s: no reasoning but content %q != text %q", name, content, text)
				}
				continue
			}
			if len(*r)+len(content) > len(text) {
				t.Fatalf("%s: reasoning %q + content %q longer than text %q", name, *r, content, text)
			}
		}
	})
}

func TestSplitRunsReasoningFirst(t *testing.T) {
	tp, _ := Get("hermes")
	rp, _ := GetReasoning("qwen3")
	text := "<think>Maybe <tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>? No.</think>Reading.\n" +
		"<tool_call>{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}</tool_call>"
	out := Split(text, tp, rp, nil, ReasoningOptions{})
	if out.Reasoning == nil || !strings.Contains(*out.Reasoning, `"rm"`) {
		t.Errorf("reasoning = %v, want the considered call", out.Reasoning)
	}
	if len(out.ToolCalls) != 1 || out.ToolCalls[0].Name != "read_file" {
		t.Errorf("calls = %+v, want only read_file", out.ToolCalls)
	}
	if out.Content == nil || *out.Content != "Reading." {
		t.Errorf("content = %v", out.Content)
	}
	js, err := out.MarshalJSON()
	if err != nil || !strings.Contains(string(js), `"type":"function"`) || !strings.Contains(string(js), `"errors":[]`) {
		t.Errorf("MarshalJSON = %s, %v", js, err)
	}
	// Without a reasoning parser the whole text goes to the tool parser.
	if out := Split("<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>", tp, nil, nil, ReasoningOptions{}); len(out.ToolCalls) != 1 || out.Reasoning != nil {
		t.Errorf("no reasoning parser: %+v", out)
	}
}

func TestNewThinkParserCustomTags(t *testing.T) {
	p := NewThinkParser("<reasoning>", "</reasoning>")
	r, c := p.Extract("pre<reasoning>why</reasoning>post", ReasoningOptions{})
	if r == nil || *r != "why" || c != "prepost" {
		t.Errorf("got %v %q", r, c)
	}
	if r, c := p.Extract("<think>x</think>y", ReasoningOptions{}); r != nil || c != "<think>x</think>y" {
		t.Errorf("other tags must be text: %v %q", r, c)
	}
}
