package parsers

import (
	"reflect"
	"strings"
	"testing"
)

// Each call's parse outcome, in output order: ok as written, repaired
// (what the parser fixed), malformed (the CallError's reason).
func TestStatusesHermes(t *testing.T) {
	p, err := Get("hermes")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, text string
		want       []CallStatus
	}{
		{"none", "just an answer", nil},
		{"ok", `<tool_call>{"name": "ls", "arguments": {"path": "/"}}</tool_call>`,
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusOK}}},
		{"string arguments", `<tool_call>{"name": "ls", "arguments": "{\"path\": \"/\"}"}</tool_call>`,
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusRepaired, Reason: RepairArgsString}}},
		{"close missing at the end", `<tool_call>{"name": "ls", "arguments": {}}`,
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusRepaired, Reason: RepairCloseMissing}}},
		{"both repairs", `<tool_call>{"name": "ls", "arguments": "{}"}`,
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusRepaired, Reason: RepairArgsString + "; " + RepairCloseMissing}}},
		{"malformed between ok ones",
			`<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": [1]}</tool_call><tool_call>{"name": "c", "arguments": {}}</tool_call>`,
			[]CallStatus{{Index: 0, Name: "a", Status: StatusOK}, {Index: 1, Name: "b", Status: StatusMalformed, Reason: "arguments: arguments are a JSON array, not an object"}, {Index: 2, Name: "c", Status: StatusOK}}},
		{"truncated", `<tool_call>{"name": "ls", "argu`,
			[]CallStatus{{Index: 0, Status: StatusMalformed, Reason: "call is truncated"}}},
	} {
		got := Statuses(p.Parse(tc.text, nil))
		if tc.name == "truncated" {
			// The reason's wording is the family's; only its kind is fixed.
			if len(got) != 1 || got[0].Status != StatusMalformed || got[0].Reason == "" {
				t.Errorf("%s: %+v", tc.name, got)
			}
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

// The JSON-call families (vLLM's JSON readers) report their repairs too:
// arguments given as a JSON string, and raw control characters in strings
// where the family reads them leniently (Python's strict=False).
func TestStatusesJSONFamilies(t *testing.T) {
	for _, tc := range []struct {
		parser, text string
		want         []CallStatus
	}{
		{"granite4", `<tool_call>{"name": "ls", "arguments": {"path": "/"}}</tool_call>`,
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusOK}}},
		{"granite4", `<tool_call>{"name": "ls", "arguments": "{\"path\": \"/\"}"}</tool_call>`,
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusRepaired, Reason: RepairArgsString}}},
		{"internlm", "<|action_start|><|plugin|>{\"name\": \"ls\", \"parameters\": \"{}\"}<|action_end|>",
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusRepaired, Reason: RepairArgsString}}},
		{"gigachat3", "<|function_call|>{\"name\": \"ls\", \"arguments\": {\"path\": \"a\tb\"}}",
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusRepaired, Reason: RepairControlChars}}},
		{"gigachat3", "<|function_call|>{\"name\": \"ls\", \"arguments\": {\"path\": \"a b\"}}",
			[]CallStatus{{Index: 0, Name: "ls", Status: StatusOK}}},
	} {
		p, err := Get(tc.parser)
		if err != nil {
			t.Fatal(err)
		}
		res := p.Parse(tc.text, nil)
		got := Statuses(res)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s %q:\n got %+v\nwant %+v", tc.parser, tc.text, got, tc.want)
		}
		// Raw is the call's exact text (token spans are found by it).
		for _, c := range res.ToolCalls {
			if c.Raw == "" || !strings.Contains(tc.text, c.Raw) {
				t.Errorf("%s: Raw %q is not a substring of the output", tc.parser, c.Raw)
			}
		}
	}
}

// A malformed call keeps its exact text in CallError.Raw even when the
// Snippet is shortened.
func TestCallErrorRaw(t *testing.T) {
	p, err := Get("hermes")
	if err != nil {
		t.Fatal(err)
	}
	long := `<tool_call>{"name": "ls", "arguments": [` + strings.Repeat("1, ", 200) + `1]}</tool_call>`
	res := p.Parse("x "+long, nil)
	if len(res.Errors) != 1 || !strings.Contains(long, res.Errors[0].Raw) || len(res.Errors[0].Raw) <= len(res.Errors[0].Snippet) {
		t.Fatalf("errors %+v", res.Errors)
	}
}

// The Qwen3-Coder XML family reports what it tolerates: a function closed
// by the wrapper, a parameter ended by the next tag, a Python literal.
func TestStatusesQwen3XML(t *testing.T) {
	p, err := Get("qwen3_xml")
	if err != nil {
		t.Fatal(err)
	}
	tools := []ToolSchema{{Name: "f", Parameters: []byte(`{"type":"object","properties":{"o":{"type":"object"},"s":{"type":"string"}}}`)}}
	for _, tc := range []struct {
		name, text string
		want       []CallStatus
	}{
		{"ok", "<tool_call>\n<function=f>\n<parameter=s>\nx\n</parameter>\n<parameter=o>\n{\"a\": 1}\n</parameter>\n</function>\n</tool_call>",
			[]CallStatus{{Index: 0, Name: "f", Status: StatusOK}}},
		{"function closed by the wrapper", "<tool_call>\n<function=f>\n<parameter=s>\nx\n</parameter>\n</tool_call>",
			[]CallStatus{{Index: 0, Name: "f", Status: StatusRepaired, Reason: RepairCloseMissing}}},
		{"parameter ended by the next", "<tool_call>\n<function=f>\n<parameter=s>\nx\n<parameter=o>\n{}\n</parameter>\n</function>\n</tool_call>",
			[]CallStatus{{Index: 0, Name: "f", Status: StatusRepaired, Reason: RepairParamCloseMissing}}},
		{"python literal", "<tool_call>\n<function=f>\n<parameter=o>\n{'a': True}\n</parameter>\n</function>\n</tool_call>",
			[]CallStatus{{Index: 0, Name: "f", Status: StatusRepaired, Reason: RepairPyLiteral}}},
	} {
		res := p.Parse(tc.text, tools)
		if got := Statuses(res); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
		for _, c := range res.ToolCalls {
			if c.Raw == "" || !strings.Contains(tc.text, c.Raw) {
				t.Errorf("%s: Raw %q is not a substring of the output", tc.name, c.Raw)
			}
		}
	}
}
