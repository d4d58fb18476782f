package compress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/trajectory"
)

// words counts whitespace-separated words: a tokenizer for the unit tests.
type words struct{ calls atomic.Int64 }

func (w *words) Count(_ context.Context, text string) (int, error) {
	w.calls.Add(1)
	return len(strings.Fields(text)), nil
}

// fakeSum answers a fixed summary, or fails for inputs containing "FAIL",
// after a random short delay (so that lines finish out of order).
type fakeSum struct {
	calls atomic.Int64
	text  string
}

func (f *fakeSum) Summarize(_ context.Context, text string, maxTokens int) (string, error) {
	f.calls.Add(1)
	time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
	if strings.Contains(text, "FAIL") {
		return "", errors.New("summarizer down")
	}
	return f.text, nil
}

func turn(from string, n int, word string) trajectory.ShareGPTTurn {
	return trajectory.ShareGPTTurn{From: from, Value: strings.TrimSpace(strings.Repeat(word+" ", n))}
}

func line(t *testing.T, conv []trajectory.ShareGPTTurn, extra map[string]any) string {
	t.Helper()
	obj := map[string]any{"conversations": conv}
	for k, v := range extra {
		obj[k] = v
	}
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func decode(t *testing.T, l string) ([]trajectory.ShareGPTTurn, map[string]json.RawMessage) {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(l), &obj); err != nil {
		t.Fatalf("output line %q: %v", l, err)
	}
	var conv []trajectory.ShareGPTTurn
	if err := json.Unmarshal(obj["conversations"], &conv); err != nil {
		t.Fatal(err)
	}
	return conv, obj
}

// agentConv is system, human, then n rounds of gpt + tool turns of size
// words each.
func agentConv(n, size int, word string) []trajectory.ShareGPTTurn {
	conv := []trajectory.ShareGPTTurn{turn("system", 10, "sys"), turn("human", 10, "task")}
	for i := range n {
		conv = append(conv, turn("gpt", size, fmt.Sprintf("%s%d", word, i)), turn("tool", size, fmt.Sprintf("out%d", i)))
	}
	return conv
}

func TestCompress(t *testing.T) {
	sum := &fakeSum{text: "the agent listed files and two tests failed"} // 8 words; +2 for the prefix
	short := agentConv(2, 10, "ok")                                      // 20 + 40 = 60 words
	long := agentConv(10, 20, "step")
	long[2].Value = "<tool_call> " + long[2].Value // 20 + 400 + 1 = 421 words
	failing := agentConv(10, 20, "FAIL")
	// Protected: the first system, human, gpt, tool turns (20 + 40) and
	// the last 4 (80): 140 words, over a target of 100 with any summary.
	over := agentConv(10, 20, "big")
	in := strings.Join([]string{
		line(t, short, map[string]any{"reward": 1.0, "env": "e"}),
		line(t, long, map[string]any{"reward": 0.5}),
		"",
		line(t, failing, nil),
	}, "\n") + "\n"
	var out bytes.Buffer
	tok := &words{}
	st, err := Run(context.Background(), strings.NewReader(in), &out, tok, sum, Options{TargetTokens: 300, SummaryTokens: 50, Concurrency: 3})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d output lines, want 3 (the blank one is skipped): %q", len(lines), out.String())
	}
	// A conversation within the target is written byte for byte.
	if want := line(t, short, map[string]any{"reward": 1.0, "env": "e"}); lines[0] != want {
		t.Fatalf("unchanged line rewritten:\n%s\n%s", lines[0], want)
	}
	conv, obj := decode(t, lines[1])
	if string(obj["reward"]) != "0.5" {
		t.Fatalf("other fields not kept: %s", lines[1])
	}
	// 420 words, 120 over the target, +50 for the summary: the turns from
	// index 4 on go until 170 words are gone: 9 turns of 20 (180).
	if len(conv) != len(long)-9+1 {
		t.Fatalf("%d turns after compression, want %d", len(conv), len(long)-9+1)
	}
	for i := range 4 {
		want := long[i]
		if i == 0 {
			want.Value += "\n\n" + SummaryNotice
		}
		if conv[i] != want {
			t.Fatalf("protected turn %d changed: %+v", i, conv[i])
		}
	}
	if conv[4].From != "human" || conv[4].Value != "[CONTEXT SUMMARY]: "+sum.text {
		t.Fatalf("summary turn %+v", conv[4])
	}
	if !strings.Contains(lines[1], "<tool_call>") {
		t.Fatalf("tags escaped in the output: %.200s", lines[1])
	}
	for i, want := range long[13:] {
		if conv[5+i] != want {
			t.Fatalf("kept turn %d changed: %+v", 13+i, conv[5+i])
		}
	}
	// The failed summary leaves the conversation as it was.
	if want := line(t, failing, nil); lines[2] != want {
		t.Fatal("a conversation whose summary failed was changed")
	}
	if st.Lines != 3 || st.WithinLimit != 1 || st.Compressed != 1 || st.Failed != 1 || st.StillOver != 0 || len(st.Errors) != 1 || st.Errors[0].Line != 4 || st.TurnsSummarized != 9 {
		t.Fatalf("stats %+v", st)
	}
	notice := int64(len(strings.Fields(SummaryNotice)))
	if st.TokensBefore != 60+421+420 || st.TokensAfter != 60+(421-180+10+notice)+420 {
		t.Fatalf("tokens %d -> %d", st.TokensBefore, st.TokensAfter)
	}

	// Still over: the protected turns alone exceed the target.
	out.Reset()
	st, err = Run(context.Background(), strings.NewReader(line(t, over, nil)), &out, tok, sum, Options{TargetTokens: 100, SummaryTokens: 10, Notice: "-"})
	if err != nil || st.Compressed != 1 || st.StillOver != 1 {
		t.Fatalf("still over: %+v, %v", st, err)
	}
	if conv, _ := decode(t, strings.TrimSpace(out.String())); conv[0] != over[0] {
		t.Fatal("the notice was added with Notice \"-\"")
	}
	// ProtectLast < 0 protects no last turn: the summary runs to the end.
	out.Reset()
	st, err = Run(context.Background(), strings.NewReader(line(t, over, nil)), &out, tok, sum, Options{TargetTokens: 100, SummaryTokens: 10, ProtectLast: -1, Notice: "-"})
	// 17 turns of 20 words go (330 needed); with the last 4 protected at
	// most the 14 between the opening and them could.
	if err != nil || st.StillOver != 0 || st.TurnsSummarized != 17 {
		t.Fatalf("nothing protected at the end: %+v, %v", st, err)
	}
	// Nothing between the protected turns: unchanged, counted.
	out.Reset()
	tiny := []trajectory.ShareGPTTurn{turn("system", 50, "s"), turn("human", 50, "h"), turn("gpt", 50, "g")}
	st, err = Run(context.Background(), strings.NewReader(line(t, tiny, nil)), &out, tok, sum, Options{TargetTokens: 100, SummaryTokens: 10})
	if err != nil || st.Uncompressible != 1 || strings.TrimSpace(out.String()) != line(t, tiny, nil) {
		t.Fatalf("uncompressible: %+v, %v", st, err)
	}
}

// Many lines keep their order through the concurrent workers.
func TestCompressKeepsOrder(t *testing.T) {
	var in strings.Builder
	for i := range 200 {
		conv := agentConv(1+i%7, 20, "w")
		conv[1].Value = fmt.Sprintf("task %d", i)
		in.WriteString(line(t, conv, map[string]any{"i": i}) + "\n")
	}
	var out bytes.Buffer
	st, err := Run(context.Background(), strings.NewReader(in.String()), &out, &words{}, &fakeSum{text: "s"}, Options{TargetTokens: 150, SummaryTokens: 10, Concurrency: 16})
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		_, obj := decode(t, l)
		if string(obj["i"]) != fmt.Sprint(i) {
			t.Fatalf("line %d carries i=%s", i, obj["i"])
		}
	}
	if st.Lines != 200 || st.Compressed == 0 || st.WithinLimit == 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Bad input stops the run with the line's number; nothing is written for
// a failed run's lines beyond what the writer had (the CLI writes through
// a temp file).
func TestCompressBadInput(t *testing.T) {
	good := line(t, agentConv(1, 5, "w"), nil)
	for _, tc := range []struct{ in, want string }{
		{good + "\n{not json\n", "line 2: not a JSON object"},
		{good + "\n" + `{"messages": []}` + "\n", `line 2: no "conversations" array`},
		{`{"conversations": [{"from": 1}]}`, `line 1: "conversations"`},
	} {
		_, err := Run(context.Background(), strings.NewReader(tc.in), &bytes.Buffer{}, &words{}, &fakeSum{text: "s"}, Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.in, err, tc.want)
		}
	}
	for _, o := range []Options{{TargetTokens: 10, SummaryTokens: 10}, {TargetTokens: -1}, {Concurrency: -1}} {
		if _, err := Run(context.Background(), strings.NewReader(good), &bytes.Buffer{}, &words{}, &fakeSum{}, o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
}

// A tokenizer that fails stops the run: counts are not guessed.
func TestCompressTokenizerFailure(t *testing.T) {
	_, err := Run(context.Background(), strings.NewReader(line(t, agentConv(3, 5, "w"), nil)), &bytes.Buffer{}, failingTok{}, &fakeSum{}, Options{})
	if err == nil || !strings.Contains(err.Error(), "count the tokens") {
		t.Fatalf("tokenizer failure: %v", err)
	}
}

type failingTok struct{}

func (failingTok) Count(context.Context, string) (int, error) { return 0, errors.New("tokenizer down") }

func TestSummaryInput(t *testing.T) {
	long := strings.Repeat("a", 1500) + strings.Repeat("b", 2000) + strings.Repeat("c", 500)
	s := summaryInput([]trajectory.ShareGPTTurn{{From: "gpt", Value: "short"}, {From: "tool", Value: long}})
	if !strings.HasPrefix(s, "[gpt]\nshort\n\n[tool]\n"+strings.Repeat("a", 1500)+"\n…[cut]…\n"+strings.Repeat("c", 500)) || strings.Contains(s, "b") {
		t.Fatalf("summary input %q…", s[:80])
	}
}

// Against the simulator: its /tokenize counts (vLLM's route, a prompt
// without special tokens) and its chat route writes the summary (a script
// matched on the summarizer's prompt).
func TestCompressOnSimulator(t *testing.T) {
	ctx := context.Background()
	const summary = "The agent listed the directory and ran the tests; two failed on an import error."
	srv, err := sim.Start(ctx, sim.Config{Family: "hermes", SuccessProb: 1,
		Scripts: []sim.Script{{Match: "Summarize them in at most about", Steps: []sim.Step{{Final: summary}}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	tok, err := NewEngineTokenizer(srv.URL, "vllm", "rollout-sim", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	sum, err := NewChatSummarizer(srv.URL, "rollout-sim", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sum.Close()
	n, err := tok.Count(ctx, "hello world")
	if err != nil || n == 0 {
		t.Fatalf("count: %d, %v", n, err)
	}
	conv := agentConv(12, 40, "step")
	var out bytes.Buffer
	st, err := Run(ctx, strings.NewReader(line(t, conv, nil)), &out, tok, sum, Options{TargetTokens: 3000, SummaryTokens: 200})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := decode(t, strings.TrimSpace(out.String()))
	if st.Compressed != 1 || st.StillOver != 0 || st.TokensAfter > 3000 || got[4].Value != "[CONTEXT SUMMARY]: "+summary {
		t.Fatalf("stats %+v, summary turn %+v", st, got[4])
	}
	// The counts are the simulator's, read back: the output's turns count
	// to what the stats say.
	total := 0
	for _, tr := range got {
		c, err := tok.Count(ctx, tr.Value)
		if err != nil {
			t.Fatal(err)
		}
		total += c
	}
	if int64(total) != st.TokensAfter {
		t.Fatalf("output counts %d tokens, stats say %d", total, st.TokensAfter)
	}
	if _, err := NewEngineTokenizer(srv.URL, "tgi", "", "", nil); err == nil {
		t.Fatal("an unknown tokenizer backend was accepted")
	}
}
