package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// runParse runs `rollout parse args...` in process with stdin and returns
// stdout and the exit code execute would use.
func runParse(t *testing.T, stdin string, args ...string) (string, int, error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetArgs(append([]string{"parse"}, args...))
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errOut)
	err := root.ExecuteContext(context.Background())
	code := 0
	if err != nil {
		code = 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		} else if isUsageError(err) {
			code = 2
		}
	}
	return out.String(), code, err
}

type parseOut struct {
	Content   *string `json:"content"`
	Reasoning *string `json:"reasoning"`
	ToolCalls []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
	Errors []struct {
		Index  int    `json:"index"`
		Reason string `json:"reason"`
	} `json:"errors"`
}

func TestParseCommand(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stdin     string
		args      []string
		code      int
		content   *string
		reasoning *string
		calls     []string // "name args"
		errors    int
		outHas    string // for non-JSON output
		errHas    string
	}{
		{
			name:    "hermes_with_content",
			stdin:   "Let me look.\n<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"ls <dir> & echo\"}}\n</tool_call>",
			args:    []string{"--parser", "hermes"},
			content: pPtr("Let me look."),
			calls:   []string{`terminal {"command":"ls <dir> & echo"}`},
		},
		{
			name:      "reasoning_then_tools_typed",
			stdin:     "<think>run it</think>\n<tool_call>\n<function=terminal>\n<parameter=command>\nls\n</parameter>\n<parameter=timeout>\n60\n</parameter>\n</function>\n</tool_call>",
			args:      []string{"--parser", "qwen3_coder", "--reasoning-parser", "qwen3", "--tools", "testdata/parse_tools.json"},
			reasoning: pPtr("run it"),
			calls:     []string{`terminal {"command":"ls","timeout":60}`},
		},
		{
			name:      "qwen3_thinking_disabled",
			stdin:     "Hello.",
			args:      []string{"--parser", "hermes", "--reasoning-parser", "qwen3", "--thinking-disabled"},
			content:   pPtr("Hello."),
			reasoning: nil,
		},
		{
			name:   "malformed_sibling_reported",
			stdin:  "<tool_call>{\"name\": \"a\", \"arguments\": {x}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>",
			args:   []string{"--parser", "hermes"},
			calls:  []string{`b {}`},
			errors: 1,
		},
		{name: "list", args: []string{"--list"}, outHas: "kimi_k2\n"},
		{name: "list_reasoning", args: []string{"--list-reasoning"}, outHas: "deepseek_r1\n"},
		{name: "unknown_parser", args: []string{"--parser", "nope"}, code: 2, errHas: "known parsers: "},
		{name: "unknown_reasoning", args: []string{"--parser", "hermes", "--reasoning-parser", "nope"}, code: 2, errHas: "known parsers: "},
		{name: "missing_parser", args: nil, code: 2, errHas: "--parser is required"},
		{name: "bad_tools_file", args: []string{"--parser", "hermes", "--tools", "testdata/missing.json"}, code: 2, errHas: "read tools"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code, err := runParse(t, tc.stdin, tc.args...)
			if code != tc.code {
				t.Fatalf("exit code = %d, want %d (err %v)", code, tc.code, err)
			}
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error = %v, want it to contain %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.outHas != "" {
				if !strings.Contains(out, tc.outHas) {
					t.Fatalf("output %q does not contain %q", out, tc.outHas)
				}
				return
			}
			if strings.Count(out, "\n") != 1 {
				t.Errorf("want exactly one JSON line, got %q", out)
			}
			var got parseOut
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("output is not JSON: %v\n%s", err, out)
			}
			if !strings.Contains(out, `"tool_calls":[`) || !strings.Contains(out, `"errors":[`) {
				t.Errorf("lists must be arrays, not null: %s", out)
			}
			if !pEqPtr(got.Content, tc.content) {
				t.Errorf("content = %v, want %v", pDeref(got.Content), pDeref(tc.content))
			}
			if !pEqPtr(got.Reasoning, tc.reasoning) {
				t.Errorf("reasoning = %v, want %v", pDeref(got.Reasoning), pDeref(tc.reasoning))
			}
			var calls []string
			for _, c := range got.ToolCalls {
				if c.Type != "function" || !strings.HasPrefix(c.ID, "call_") {
					t.Errorf("bad call envelope: %+v", c)
				}
				calls = append(calls, c.Function.Name+" "+c.Function.Arguments)
			}
			if strings.Join(calls, "|") != strings.Join(tc.calls, "|") {
				t.Errorf("calls = %q, want %q", calls, tc.calls)
			}
			if len(got.Errors) != tc.errors {
				t.Errorf("errors = %+v, want %d", got.Errors, tc.errors)
			}
		})
	}
}

func pPtr(s string) *string { return &s }

func pEqPtr(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func pDeref(p *string) any {
	if p == nil {
		return nil
	}
	return *p
}
