package parsers

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// minGoldenCases is the floor: single, multiple, content around,
// unicode, escapes, nesting, schema types, truncation, malformed sibling,
// no call — at least eight per family.
const minGoldenCases = 8

// minReasoningCases is the floor for reasoning parser tables.
const minReasoningCases = 5

// goldenCase is one entry of testdata/golden/<family>.json.
type goldenCase struct {
	Name  string          `json:"name"`
	Input string          `json:"input"`
	Tools json.RawMessage `json:"tools,omitempty"` // OpenAI tools array
	Want  struct {
		Content   *string `json:"content"`
		ToolCalls []struct {
			ID        string          `json:"id,omitempty"`
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
			// Repairs, when present, are the call's ToolCall.Repairs
			// exactly ([] for none).
			Repairs *[]string `json:"repairs,omitempty"`
		} `json:"tool_calls"`
		Errors []struct {
			Index          int    `json:"index"`
			ReasonContains string `json:"reason_contains"`
		} `json:"errors"`
	} `json:"want"`
}

// loadGolden reads the golden table of one family; a missing or short table
// is a test failure, so a new family cannot be registered without one.
func loadGolden(tb testing.TB, dir, name string, min int, v any) {
	tb.Helper()
	path := filepath.Join("testdata", dir, name+".json")
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("family %s has no golden table: %v", name, err)
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(data, &entries); err != nil {
		tb.Fatalf("%s: want a JSON array of cases: %v", path, err)
	}
	if len(entries) < min {
		tb.Fatalf("%s has %d cases, want at least %d", path, len(entries), min)
	}
	if err := json.Unmarshal(data, v); err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
}

func goldenCases(tb testing.TB, name string) []goldenCase {
	tb.Helper()
	var cases []goldenCase
	loadGolden(tb, "golden", name, minGoldenCases, &cases)
	return cases
}

func TestGolden(t *testing.T) {
	names := Names()
	if len(names) == 0 {
		t.Fatal("no tool parsers registered")
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			p, err := Get(name)
			if err != nil {
				t.Fatal(err)
			}
			cases := goldenCases(t, name)
			if len(cases) < minGoldenCases {
				t.Fatalf("family %s has %d golden cases, want at least %d", name, len(cases), minGoldenCases)
			}
			for _, c := range cases {
				t.Run(c.Name, func(t *testing.T) {
					var tools []ToolSchema
					if len(c.Tools) > 0 {
						tools, err = ToolsFromOpenAI(c.Tools)
						if err != nil {
							t.Fatalf("tools: %v", err)
						}
					}
					got := p.Parse(c.Input, tools)
					checkGolden(t, name, c, got)
				})
			}
		})
	}
}

func checkGolden(t *testing.T, family string, c goldenCase, got Result) {
	t.Helper()
	switch {
	case c.Want.Content == nil && got.Content != nil:
		t.Errorf("content = %q, want null", *got.Content)
	case c.Want.Content != nil && got.Content == nil:
		t.Errorf("content = null, want %q", *c.Want.Content)
	case c.Want.Content != nil && *c.Want.Content != *got.Content:
		t.Errorf("content = %q, want %q", *got.Content, *c.Want.Content)
	}
	checkCallsWellFormed(t, got)
	// Every call's and error's Raw is its exact text in the output (the
	// agent loop finds token spans by it).
	for i, tc := range got.ToolCalls {
		if slices.Contains(tc.Repairs, RepairArtefacts) {
			continue // read from the cleaned text (minicpm5)
		}
		if tc.Raw == "" || !strings.Contains(c.Input, tc.Raw) {
			t.Errorf("call %d: Raw %q is not a substring of the input", i, tc.Raw)
		}
	}
	for _, e := range got.Errors {
		if family == "minicpm5" && strings.ContainsAny(c.Input, "ĠĊ") {
			continue
		}
		if e.Raw != "" && !strings.Contains(c.Input, e.Raw) {
			t.Errorf("error %d: Raw %q is not a substring of the input", e.Index, e.Raw)
		}
	}
	if len(got.ToolCalls) != len(c.Want.ToolCalls) {
		t.Errorf("got %d tool calls, want %d: %+v (errors %+v)", len(got.ToolCalls), len(c.Want.ToolCalls), got.ToolCalls, got.Errors)
	}
	for i := 0; i < len(got.ToolCalls) && i < len(c.Want.ToolCalls); i++ {
		g, w := got.ToolCalls[i], c.Want.ToolCalls[i]
		if g.Name != w.Name {
			t.Errorf("call %d: name = %q, want %q", i, g.Name, w.Name)
		}
		if w.Repairs != nil && strings.Join(g.Repairs, "; ") != strings.Join(*w.Repairs, "; ") {
			t.Errorf("call %d: repairs = %q, want %q", i, g.Repairs, *w.Repairs)
		}
		if w.ID != "" && g.ID != w.ID {
			t.Errorf("call %d: id = %q, want %q", i, g.ID, w.ID)
		}
		switch {
		case w.ID != "":
		case family == "mistral":
			if !isMistralCallID(g.ID) {
				t.Errorf("call %d: id %q is not 9 alphanumerics", i, g.ID)
			}
		case !isCallID(g.ID):
			t.Errorf("call %d: id %q is not call_ + 24 hex", i, g.ID)
		}
		wantArgs := string(w.Arguments)
		// Arguments may be written as a JSON object or as a JSON string
		// holding the exact expected text.
		var s string
		if json.Unmarshal(w.Arguments, &s) == nil {
			wantArgs = s
		}
		wantC, err := compactJSON(wantArgs)
		if err != nil {
			t.Fatalf("call %d: golden arguments %s are not JSON: %v", i, wantArgs, err)
		}
		if g.Arguments != wantC {
			t.Errorf("call %d (%s): arguments = %s, want %s", i, g.Name, g.Arguments, wantC)
		}
	}
	if len(got.Errors) != len(c.Want.Errors) {
		t.Errorf("got %d errors, want %d: %+v", len(got.Errors), len(c.Want.Errors), got.Errors)
	}
	for i := 0; i < len(got.Errors) && i < len(c.Want.Errors); i++ {
		g, w := got.Errors[i], c.Want.Errors[i]
		if g.Index != w.Index {
			t.Errorf("error %d: index = %d, want %d (%s)", i, g.Index, w.Index, g.Reason)
		}
		if !strings.Contains(g.Reason, w.ReasonContains) {
			t.Errorf("error %d: reason %q does not contain %q", i, g.Reason, w.ReasonContains)
		}
		if g.Snippet == "" {
			t.Errorf("error %d: empty snippet", i)
		}
	}
}

// checkCallsWellFormed asserts the contract every family keeps: arguments
// are compact JSON objects, ids are non-empty and unique.
func checkCallsWellFormed(t testing.TB, r Result) {
	t.Helper()
	seen := map[string]bool{}
	for i, c := range r.ToolCalls {
		if c.Name == "" {
			t.Errorf("call %d has an empty name", i)
		}
		if c.ID == "" || seen[c.ID] {
			t.Errorf("call %d: id %q empty or duplicate", i, c.ID)
		}
		seen[c.ID] = true
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(c.Arguments), &obj); err != nil || obj == nil {
			t.Errorf("call %d (%s): arguments %q are not a JSON object: %v", i, c.Name, c.Arguments, err)
		}
	}
	if r.Content != nil && *r.Content == "" {
		t.Errorf("content is an empty string, want nil")
	}
}

// reasoningCase is one entry of testdata/golden_reasoning/<name>.json.
type reasoningCase struct {
	Name             string `json:"name"`
	Input            string `json:"input"`
	ThinkingDisabled bool   `json:"thinking_disabled,omitempty"`
	Want             struct {
		Reasoning *string `json:"reasoning"`
		Content   string  `json:"content"`
	} `json:"want"`
}

func TestGoldenReasoning(t *testing.T) {
	names := ReasoningNames()
	if len(names) == 0 {
		t.Fatal("no reasoning parsers registered")
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			p, err := GetReasoning(name)
			if err != nil {
				t.Fatal(err)
			}
			var cases []reasoningCase
			loadGolden(t, "golden_reasoning", name, minReasoningCases, &cases)
			if len(cases) < minReasoningCases {
				t.Fatalf("reasoning parser %s has %d golden cases, want at least %d", name, len(cases), minReasoningCases)
			}
			for _, c := range cases {
				t.Run(c.Name, func(t *testing.T) {
					r, content := p.Extract(c.Input, ReasoningOptions{ThinkingDisabled: c.ThinkingDisabled})
					switch {
					case c.Want.Reasoning == nil && r != nil:
						t.Errorf("reasoning = %q, want null", *r)
					case c.Want.Reasoning != nil && r == nil:
						t.Errorf("reasoning = null, want %q", *c.Want.Reasoning)
					case r != nil && *r != *c.Want.Reasoning:
						t.Errorf("reasoning = %q, want %q", *r, *c.Want.Reasoning)
					}
					if content != c.Want.Content {
						t.Errorf("content = %q, want %q", content, c.Want.Content)
					}
				})
			}
		})
	}
}

func TestUnknownParser(t *testing.T) {
	if _, err := Get("no-such-family"); err == nil || !strings.Contains(err.Error(), "known parsers") {
		t.Errorf("Get(unknown) error = %v, want a list of known parsers", err)
	}
	if _, err := GetReasoning("no-such-family"); err == nil || !strings.Contains(err.Error(), "known parsers") {
		t.Errorf("GetReasoning(unknown) error = %v, want a list of known parsers", err)
	}
}
