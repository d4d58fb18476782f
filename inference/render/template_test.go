package render_test

import (
	"encoding/json"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference/render"
)

func mustTemplate(t testing.TB, src string) *render.Template {
	t.Helper()
	tm, err := render.NewTemplate(src, "<s>", "</s>")
	if err != nil {
		t.Fatalf("NewTemplate: %v", err)
	}
	return tm
}

func user(s string) []openai.ChatCompletionMessage {
	return []openai.ChatCompletionMessage{{Role: "user", Content: s}}
}

func TestApplyVariables(t *testing.T) {
	tm := mustTemplate(t, `{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools is defined }}|{{ flag }}|{{ messages[0].content }}`)
	got, err := tm.Apply(user("hi"), nil, true, map[string]any{"flag": false})
	if err != nil {
		t.Fatal(err)
	}
	if want := "<s>|</s>|True|False|False|hi"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestToJSONMatchesPython(t *testing.T) {
	tm := mustTemplate(t, `{{ messages[0].tool_calls[0].function.arguments | tojson }}`)
	// What Python's json.dumps(json.loads(args), ensure_ascii=False) prints.
	cases := map[string]string{
		`{"b":1.0,"a":1e5}`:                  `{"b": 1.0, "a": 100000.0}`,
		`{"x":1e16,"y":1.5e-7,"z":0.0001}`:   `{"x": 1e+16, "y": 1.5e-07, "z": 0.0001}`,
		`{"n":-0.0,"m":123456.789,"k":1e15}`: `{"n": -0.0, "m": 123456.789, "k": 1000000000000000.0}`,
		`{"big":123456789012345678901234}`:   `{"big": 123456789012345678901234}`,
		`{"s":"é\u2028<&>\"\\\n"}`:           "{\"s\": \"é\u2028<&>\\\"\\\\\\n\"}",
		`[1, {"z": null, "a": [true]}]`:      `[1, {"z": null, "a": [true]}]`,
	}
	for args, want := range cases {
		msgs := []openai.ChatCompletionMessage{{Role: "assistant", ToolCalls: []openai.ToolCall{{
			Type: "function", Function: openai.FunctionCall{Name: "f", Arguments: args}}}}}
		got, err := tm.Apply(msgs, nil, false, nil)
		if err != nil {
			t.Fatalf("%s: %v", args, err)
		}
		if got != want {
			t.Errorf("%s: got %q, want %q", args, got, want)
		}
	}
}

func TestArgumentsNotJSONStayString(t *testing.T) {
	tm := mustTemplate(t, `{% set a = messages[0].tool_calls[0].function.arguments %}{{ a is string }}:{{ a }}`)
	msgs := []openai.ChatCompletionMessage{{Role: "assistant", ToolCalls: []openai.ToolCall{{
		Type: "function", Function: openai.FunctionCall{Name: "f", Arguments: `{"broken":`}}}}}
	got, err := tm.Apply(msgs, nil, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := `True:{"broken":`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestToolsKeepKeyOrder(t *testing.T) {
	tm := mustTemplate(t, `{% for t in tools %}{{ t | tojson }}{% endfor %}`)
	tools := json.RawMessage(`[{"type":"function","function":{"parameters":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}},"name":"f","strict":true}}]`)
	got, err := tm.Apply(user("x"), tools, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"type": "function", "function": {"name": "f", "description": "", "parameters": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}}}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestMultiPartContent(t *testing.T) {
	parts := []openai.ChatMessagePart{{Type: "text", Text: "a"}, {Type: "text", Text: "b"}}
	msgs := []openai.ChatCompletionMessage{{Role: "user", MultiContent: parts}}
	// A template that reads parts gets the parts.
	typed := mustTemplate(t, `{% for p in messages[0].content %}[{{ p.text }}]{% endfor %}`)
	if got, err := typed.Apply(msgs, nil, false, nil); err != nil || got != "[a][b]" {
		t.Errorf("typed: got %q, %v", got, err)
	}
	// One that prints content as a string gets the texts joined by "\n".
	plain := mustTemplate(t, `{{ messages[0].content }}`)
	if got, err := plain.Apply(msgs, nil, false, nil); err != nil || got != "a\nb" {
		t.Errorf("plain: got %q, %v", got, err)
	}
	img := []openai.ChatCompletionMessage{{Role: "user", MultiContent: []openai.ChatMessagePart{{Type: "image_url"}}}}
	if _, err := plain.Apply(img, nil, false, nil); err == nil {
		t.Error("image part: want an error")
	}
}

func TestRaiseException(t *testing.T) {
	tm := mustTemplate(t, `{% if messages[0].role != 'system' %}{{ raise_exception('System message first!') }}{% endif %}ok`)
	_, err := tm.Apply(user("x"), nil, false, nil)
	if err == nil || !strings.Contains(err.Error(), "System message first!") {
		t.Fatalf("got %v, want the template's message", err)
	}
}

func TestBadInput(t *testing.T) {
	if _, err := render.NewTemplate(`{% for x in %}`, "", ""); err == nil {
		t.Error("bad template: want an error")
	}
	tm := mustTemplate(t, `{{ messages | length }}`)
	bad := []struct {
		name  string
		msgs  []openai.ChatCompletionMessage
		tools string
		kw    map[string]any
	}{
		{"tools not JSON", user("x"), `[{`, nil},
		{"tools not array", user("x"), `{"type":"function"}`, nil},
		{"tool without function", user("x"), `[{"type":"function"}]`, nil},
		{"no role", []openai.ChatCompletionMessage{{Content: "x"}}, "", nil},
		{"reserved character", user("a\uFDD0b"), "", nil},
		{"unsupported kwarg", user("x"), "", map[string]any{"k": struct{}{}}},
		{"empty call name", []openai.ChatCompletionMessage{{Role: "assistant", ToolCalls: []openai.ToolCall{{Type: "function"}}}}, "", nil},
	}
	for _, c := range bad {
		var tools json.RawMessage
		if c.tools != "" {
			tools = json.RawMessage(c.tools)
		}
		if _, err := tm.Apply(c.msgs, tools, false, c.kw); err == nil {
			t.Errorf("%s: want an error", c.name)
		}
	}
	if got, err := tm.Apply(user("x"), json.RawMessage(`[]`), false, nil); err != nil || got != "1" {
		t.Errorf("empty tools: got %q, %v", got, err)
	}
}

// BenchmarkApply renders a 10-message agent conversation with three tools
// through the tiny Qwen3 template.
func BenchmarkApply(b *testing.B) {
	tm := tinyQwen3Template(b)
	var c chatCase
	for _, x := range chatCases() {
		if x.name == "full agent loop" {
			c = x
		}
	}
	msgs, tools, kw := c.decode(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tm.Apply(msgs, tools, true, kw); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyChat renders ten plain chat messages, no tools.
func BenchmarkApplyChat(b *testing.B) {
	tm := tinyQwen3Template(b)
	msgs := []openai.ChatCompletionMessage{{Role: "system", Content: "You are a careful assistant."}}
	for i := range 9 {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, openai.ChatCompletionMessage{Role: role, Content: strings.Repeat("Some words of the conversation. ", 8)})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tm.Apply(msgs, nil, true, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// tojson(indent=N) prints as Python's json.dumps(x, ensure_ascii=False,
// indent=N): keys in their order, "," and ": ", a line per member (the
// expected texts are Python 3's).
func TestToJSONIndentMatchesPython(t *testing.T) {
	cases := []struct {
		args string
		want [3]string // indent 4, 0, 2
	}{
		{`{"b":1.0,"a":1e5}`, [3]string{"{\n    \"b\": 1.0,\n    \"a\": 100000.0\n}", "{\n\"b\": 1.0,\n\"a\": 100000.0\n}", "{\n  \"b\": 1.0,\n  \"a\": 100000.0\n}"}},
		{`{"s":"é\u2028<&>\"\\\n}{][","z":{},"e":[],"one":["path"]}`, [3]string{
			"{\n    \"s\": \"\u00e9\u2028<&>\\\"\\\\\\n}{][\",\n    \"z\": {},\n    \"e\": [],\n    \"one\": [\n        \"path\"\n    ]\n}",
			"{\n\"s\": \"\u00e9\u2028<&>\\\"\\\\\\n}{][\",\n\"z\": {},\n\"e\": [],\n\"one\": [\n\"path\"\n]\n}",
			"{\n  \"s\": \"\u00e9\u2028<&>\\\"\\\\\\n}{][\",\n  \"z\": {},\n  \"e\": [],\n  \"one\": [\n    \"path\"\n  ]\n}"}},
		{`[1, {"z": null, "a": [true, {"q": [[]]}]}]`, [3]string{
			"[\n    1,\n    {\n        \"z\": null,\n        \"a\": [\n            true,\n            {\n                \"q\": [\n                    []\n                ]\n            }\n        ]\n    }\n]",
			"[\n1,\n{\n\"z\": null,\n\"a\": [\ntrue,\n{\n\"q\": [\n[]\n]\n}\n]\n}\n]",
			"[\n  1,\n  {\n    \"z\": null,\n    \"a\": [\n      true,\n      {\n        \"q\": [\n          []\n        ]\n      }\n    ]\n  }\n]"}},
		{`"just a string"`, [3]string{`"just a string"`, `"just a string"`, `"just a string"`}},
		{`42`, [3]string{"42", "42", "42"}},
	}
	for i, width := range []string{"4", "0", "2"} {
		// Text around the call, a call inside an expression, and the same
		// value printed twice: each JSON text is found and rewritten.
		tm := mustTemplate(t, `A{{ messages[0].tool_calls[0].function.arguments | tojson(indent=`+width+`) }}B{{ "[" + messages[0].tool_calls[0].function.arguments | tojson( indent = `+width+` ) + "]" }}`)
		for _, c := range cases {
			msgs := []openai.ChatCompletionMessage{{Role: "assistant", ToolCalls: []openai.ToolCall{{
				Type: "function", Function: openai.FunctionCall{Name: "f", Arguments: c.args}}}}}
			got, err := tm.Apply(msgs, nil, false, nil)
			if err != nil {
				t.Fatalf("indent %s, %s: %v", width, c.args, err)
			}
			if want := "A" + c.want[i] + "B[" + c.want[i] + "]"; got != want {
				t.Errorf("indent %s, %s:\ngot  %q\nwant %q", width, c.args, got, want)
			}
		}
	}
}

// Llama 3.1's template prints every tool with tojson(indent=4): the tool
// as the server rebuilds it, keys in that order.
func TestToolsIndented(t *testing.T) {
	tm := mustTemplate(t, `{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\n\n" }}{%- endfor %}`)
	tools := json.RawMessage(`[{"type":"function","function":{"name":"noop","description":"Do nothing","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}]`)
	got, err := tm.Apply(user("hi"), tools, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"noop\",\n        \"description\": \"Do nothing\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n                \"path\": {\n                    \"type\": \"string\"\n                }\n            },\n            \"required\": [\n                \"path\"\n            ]\n        }\n    }\n}\n\n"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}
