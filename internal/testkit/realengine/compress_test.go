package realengine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
	"github.com/rollout-rl/rollout/trajectory"
	"github.com/rollout-rl/rollout/trajectory/compress"
)

// TestCompressOnLlamaServer: SFT compression with llama-server as both the
// tokenizer (its /tokenize "content" flavour) and the summarizer (its chat
// route). A long conversation is brought under the target; the stats'
// token counts are llama.cpp's own, read back from the output.
func TestCompressOnLlamaServer(t *testing.T) {
	e := llamacpptest.Start(t, llamacpptest.Options{Slots: 2, Ctx: 2 * 4096, Threads: 1})
	ctx := suiteCtx(t)
	tok, err := compress.NewEngineTokenizer(e.URL, "llamacpp", "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	sum, err := compress.NewChatSummarizer(e.URL, "tiny", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sum.Close()
	conv := []trajectory.ShareGPTTurn{{From: "system", Value: "You are a coding agent."}, {From: "human", Value: "Fix the failing tests."}}
	for i := range 12 {
		conv = append(conv,
			trajectory.ShareGPTTurn{From: "gpt", Value: fmt.Sprintf("<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"pytest -q tests/test_%d.py\"}}\n</tool_call>", i)},
			trajectory.ShareGPTTurn{From: "tool", Value: strings.Repeat(fmt.Sprintf("FAILED tests/test_%d.py::test_case - AssertionError: expected 3, got 4\n", i), 6)})
	}
	in, _ := json.Marshal(map[string]any{"conversations": conv, "reward": 0.25})
	var out bytes.Buffer
	st, err := compress.Run(ctx, bytes.NewReader(in), &out, tok, sum, compress.Options{TargetTokens: 1500, SummaryTokens: 48})
	if err != nil {
		t.Fatal(err)
	}
	if st.Lines != 1 || st.Compressed != 1 || st.StillOver != 0 || st.TokensBefore <= 1500 || st.TokensAfter > 1500 {
		t.Fatalf("stats %+v: want the conversation compressed under 1500 tokens", st)
	}
	var got struct {
		Conversations []trajectory.ShareGPTTurn `json:"conversations"`
		Reward        float64                   `json:"reward"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || got.Reward != 0.25 {
		t.Fatalf("output %s: %v", out.Bytes(), err)
	}
	total := 0
	for _, tr := range got.Conversations {
		n, err := tok.Count(ctx, tr.Value)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if int64(total) != st.TokensAfter || !strings.HasPrefix(got.Conversations[4].Value, "[CONTEXT SUMMARY]: ") {
		t.Fatalf("output counts %d tokens (stats %d); turn 4 %q", total, st.TokensAfter, got.Conversations[4].Value)
	}
}
