package trajectory

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExportsGolden(t *testing.T) {
	recs := fixtureRecords()
	one := 1.0
	envID := 3
	tests := []struct {
		golden string
		run    func(buf *bytes.Buffer) (ExportStats, error)
		want   ExportStats
	}{
		{"sft_sharegpt.jsonl", func(b *bytes.Buffer) (ExportStats, error) {
			return WriteSFT(b, recs, FormatShareGPT, Filter{})
		}, ExportStats{Read: 6, Written: 5, Filtered: 1}},
		{"sft_messages_filtered.jsonl", func(b *bytes.Buffer) (ExportStats, error) {
			return WriteSFT(b, recs, FormatMessages, Filter{MinReward: &one, TopK: 1, Dedupe: true})
		}, ExportStats{Read: 6, Written: 2, Filtered: 4}},
		{"sft_sharegpt_dedupe_finished.jsonl", func(b *bytes.Buffer) (ExportStats, error) {
			return WriteSFT(b, recs, FormatShareGPT, Filter{Dedupe: true, FinishedOnly: true})
		}, ExportStats{Read: 6, Written: 4, Filtered: 2}},
		{"dpo.jsonl", func(b *bytes.Buffer) (ExportStats, error) {
			return WriteDPO(b, recs, DPOOptions{MinMargin: 0.5})
		}, ExportStats{Read: 6, Written: 2, Filtered: 1}},
		{"atropos.jsonl", func(b *bytes.Buffer) (ExportStats, error) {
			return WriteAtropos(b, recs, AtroposOptions{EnvID: &envID, ZeroAdvantageOnTruncation: true, IncludeMessages: true})
		}, ExportStats{Read: 6, Written: 2, Filtered: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			var buf bytes.Buffer
			st, err := tt.run(&buf)
			if err != nil {
				t.Fatal(err)
			}
			if st != tt.want {
				t.Errorf("stats = %+v, want %+v", st, tt.want)
			}
			checkGolden(t, tt.golden, buf.Bytes())
		})
	}
}

func TestShareGPTHermesLayout(t *testing.T) {
	r := fixtureRecords()[0]
	conv, err := ShareGPT(&r)
	if err != nil {
		t.Fatal(err)
	}
	var froms []string
	for _, c := range conv {
		froms = append(froms, c.From)
	}
	if got := strings.Join(froms, ","); got != "system,human,gpt,tool,gpt" {
		t.Fatalf("turns = %s", got)
	}
	checks := []struct {
		turn int
		want string
	}{
		{0, "You are a careful agent.\n\n"},
		{0, "<tools>\n[{\"name\": \"terminal\", \"description\": \"Run a shell command\", \"parameters\": {\"type\": \"object\""},
		{2, "<think>\nI should compute it.\n</think>\n<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"echo $((2+1))\"}}\n</tool_call>"},
		{3, "<tool_response>\n{\"tool_call_id\": \"call_1\", \"name\": \"terminal\", \"content\": {\"output\": \"3\", \"exit_code\": 0}}\n</tool_response>"},
		{4, "<think>\n</think>\nThe answer is 3."},
	}
	for _, c := range checks {
		if !strings.Contains(conv[c.turn].Value, c.want) {
			t.Errorf("turn %d = %q, want it to contain %q", c.turn, conv[c.turn].Value, c.want)
		}
	}
}

func TestPyJSON(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"b":1,"a":[1,2.50,{"x":null}],"s":"<a&b>"}`, `{"b": 1, "a": [1, 2.50, {"x": null}], "s": "<a&b>"}`},
		{`[]`, `[]`},
		{`{}`, `{}`},
		{`"x"`, `"x"`},
		{`[true,false,"é"]`, `[true, false, "é"]`},
	}
	for _, tt := range tests {
		got, err := pyJSON([]byte(tt.in))
		if err != nil || got != tt.want {
			t.Errorf("pyJSON(%s) = %s, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func FuzzShareGPT(f *testing.F) {
	f.Add(fixtureRecords()[0].Messages, fixtureTools)
	f.Add(`[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"x","arguments":"{bad"}}]}]`, `[]`)
	f.Add(`[{"role":"tool","content":[{"type":"text","text":"{\"a\":1}"}]}]`, ``)
	f.Fuzz(func(t *testing.T, msgs, tools string) {
		r := Record{Messages: msgs, Tools: tools}
		conv, err := ShareGPT(&r)
		if err == nil {
			if _, err := json.Marshal(conv); err != nil {
				t.Fatalf("conversation not encodable: %v", err)
			}
		}
		_, _ = atroposMessages(&r)
	})
}

func TestExportBadInput(t *testing.T) {
	r := fixtureRecords()[0]
	r.Messages = `{"not":"a list"}`
	var buf bytes.Buffer
	_, err := WriteSFT(&buf, []Record{r}, FormatShareGPT, Filter{})
	if err == nil || !strings.Contains(err.Error(), `group "g-1" rollout 0: messages column is not a JSON list`) {
		t.Errorf("bad messages: %v", err)
	}
	if _, err := WriteSFT(&buf, nil, "alpaca", Filter{}); err == nil || !strings.Contains(err.Error(), `unknown SFT format "alpaca"`) {
		t.Errorf("bad format: %v", err)
	}
	chat := fixtureRecords()[0]
	chat.Tokens, chat.Masks, chat.LossMask, chat.Logprobs = nil, nil, nil, nil
	if _, err := WriteAtropos(&buf, []Record{chat}, AtroposOptions{}); !errors.Is(err, ErrNoTokens) {
		t.Errorf("atropos without tokens: %v", err)
	}
	// A harness that never called the model generated nothing: filtered,
	// not a tokens-mode error.
	none := fixtureRecords()[0]
	none.Tokens, none.Masks, none.LossMask, none.Logprobs = nil, nil, nil, nil
	none.PromptTokens, none.CompletionTokens, none.StopReason = 0, 0, "harness_no_calls"
	groups, st, err := AtroposGroups([]Record{none, fixtureRecords()[0]}, AtroposOptions{})
	if err != nil || st.Filtered != 1 || len(groups) != 1 || len(groups[0].Tokens) != 1 {
		t.Errorf("a row that generated nothing: %d groups, %+v, %v", len(groups), st, err)
	}
}

func TestPassAtK(t *testing.T) {
	// Reference values from the binomial formula 1 - C(n-c,k)/C(n,k).
	tests := []struct {
		n, c, k int
		want    float64
	}{
		{4, 0, 1, 0}, {4, 4, 1, 1}, {4, 1, 1, 0.25}, {4, 2, 2, 1 - 1.0/6}, {10, 3, 5, 1 - 21.0/252}, {5, 3, 3, 1},
	}
	for _, tt := range tests {
		if got := PassAtK(tt.n, tt.c, tt.k); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("PassAtK(%d,%d,%d) = %v, want %v", tt.n, tt.c, tt.k, got, tt.want)
		}
	}
}

func TestEvalReportGolden(t *testing.T) {
	dir := t.TempDir()
	rep, err := WriteEvalReport(dir, fixtureRecords(), EvalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	all := rep.Results["all"]
	// Items: "1" has 3 samples, 2 passing; "5" has 2 ok samples, 1 passing.
	if math.Abs(all["pass@1"]-(2.0/3+0.5)/2) > 1e-12 || all["pass@2"] != 1 || all["infra_failure_rate"] != 1.0/6 {
		t.Errorf("all = %v", all)
	}
	if _, ok := rep.Results["atropos|arith:hard|0"]; !ok {
		t.Errorf("no per-category result: %v", rep.Results)
	}
	for _, name := range []string{"metrics.json", "samples.jsonl"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		checkGolden(t, "eval_"+name, b)
	}
}

// An env's own metrics join its task block of metrics.json.
func TestEvalEnvMetrics(t *testing.T) {
	recs := fixtureRecords()
	env := recs[0].Env
	rep := ComputeEval(recs, EvalOptions{EnvMetrics: map[string]map[string]float64{env: {"check_pass_rate": 0.25}}})
	block := rep.Results["atropos|"+env+"|0"]
	if block["check_pass_rate"] != 0.25 {
		t.Fatalf("env block %v", block)
	}
	if _, ok := block["pass@1"]; !ok {
		t.Fatalf("the env's metrics replaced the standard ones: %v", block)
	}
}
