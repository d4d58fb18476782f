package parsers

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// fuzzTools is the schema every fuzz run parses with, so that schema-typed
// coercion paths are exercised too.
var fuzzTools = []ToolSchema{
	{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},"ratio":{"type":["number","null"]},"opts":{"type":"object"},"tags":{"type":"array"}}}`)},
}

// fuzzFamily runs the shared properties for one family: no panic, every
// returned call has JSON-object arguments, and the content, parsed again,
// holds no complete call (a call is never silently left in the text).
func fuzzFamily(f *testing.F, name string) {
	p, err := Get(name)
	if err != nil {
		f.Fatal(err)
	}
	var cases []goldenCase
	loadGolden(f, "golden", name, 0, &cases)
	for _, c := range cases {
		f.Add(c.Input)
	}
	f.Fuzz(func(t *testing.T, text string) {
		r := p.Parse(text, fuzzTools)
		for i, c := range r.ToolCalls {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal([]byte(c.Arguments), &obj); err != nil || obj == nil {
				t.Fatalf("call %d (%s): arguments %q are not a JSON object", i, c.Name, c.Arguments)
			}
			if c.ID == "" {
				t.Fatalf("call %d: empty id", i)
			}
			// Raw is the call's exact text (token spans are found by it),
			// unless the family cleaned the text first (minicpm5).
			if !slices.Contains(c.Repairs, RepairArtefacts) && (c.Raw == "" || !strings.Contains(text, c.Raw)) {
				t.Fatalf("call %d: Raw %q is not a substring of the output", i, c.Raw)
			}
		}
		for _, e := range r.Errors {
			if e.Raw != "" && !strings.Contains(text, e.Raw) && !(name == "minicpm5" && strings.ContainsAny(text, "ĠĊ")) {
				t.Fatalf("error %d: Raw %q is not a substring of the output", e.Index, e.Raw)
			}
		}
		if r.Content != nil {
			again := p.Parse(*r.Content, fuzzTools)
			if len(again.ToolCalls) > 0 {
				t.Fatalf("content %q still holds a call: %+v", *r.Content, again.ToolCalls)
			}
		}
	})
}
