package inference_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

// countedEpisode runs a turns-long tool episode and returns the sequence
// and, per turn, the requests the simulator served during Generate.
func countedEpisode(t *testing.T, srv *sim.Server, c *inference.Client, id string, turns int, toolCalls bool) (inference.Sequence, []int64) {
	t.Helper()
	ctx := context.Background()
	ep, err := c.Start(ctx, inference.EpisodeSpec{ID: id, Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 256}})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []openai.ChatCompletionMessage{{Role: "system", Content: "You are a careful agent."}, {Role: "user", Content: "list files in /tmp"}}
	var per []int64
	for i := 0; i < turns; i++ {
		before := srv.Stats().Requests
		tr, err := ep.Generate(ctx, msgs)
		if err != nil {
			t.Fatalf("turn %d: %v", i+1, err)
		}
		per = append(per, srv.Stats().Requests-before)
		am := openai.ChatCompletionMessage{Role: "assistant", Content: tr.Text}
		callID := fmt.Sprintf("call%05d", i)
		if toolCalls {
			// A parsed assistant message, as the agent loop records it.
			am = openai.ChatCompletionMessage{Role: "assistant", ToolCalls: []openai.ToolCall{{ID: callID, Type: openai.ToolTypeFunction,
				Function: openai.FunctionCall{Name: "terminal", Arguments: fmt.Sprintf(`{"command":"ls /tmp/%d"}`, i)}}}}
		}
		msgs = append(msgs, am, openai.ChatCompletionMessage{Role: "tool", ToolCallID: callID, Content: fmt.Sprintf("file%d.txt", i)})
	}
	seq, err := ep.Finish(ctx, msgs[:len(msgs)-1])
	if err != nil {
		t.Fatal(err)
	}
	return seq, per
}

// Requests per turn, counted in the simulator: once the base render's
// closing count is known for an assistant shape (learned on the first
// later turn of that shape), a later turn takes one render plus the
// generation (plus the decode on /inference/v1/generate, which returns no
// text), one request fewer than the two-render path — with the very same
// token sequence.
func TestRequestsPerTurn(t *testing.T) {
	cases := []struct {
		backend, engine string
		want, before    int64 // later turns, one-render vs two-render
	}{
		{inference.BackendVLLM, sim.EngineVLLM, 2, 3},
		{inference.BackendVLLMGenerate, sim.EngineVLLM, 3, 4},
		{inference.BackendSGLang, sim.EngineVLLM, 2, 3},
	}
	for _, fam := range []string{"hermes", "qwen3_coder", "mistral", "llama3_json", "deepseek_v3"} {
		for _, tc := range cases {
			for _, calls := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/toolcalls=%v", fam, tc.backend, calls), func(t *testing.T) {
					srv := startSim(t, sim.Config{Family: fam, Engine: tc.engine, Seed: 3})
					one := openClient(t, inference.Config{Backend: tc.backend, Endpoints: []string{srv.URL}})
					seq1, per1 := countedEpisode(t, srv, one, "one", 5, calls)
					two := openClient(t, inference.Config{Backend: tc.backend, Endpoints: []string{srv.URL}, TwoRenderSegments: true})
					seq2, per2 := countedEpisode(t, srv, two, "one", 5, calls)
					if !slices.Equal(seq1.Tokens, seq2.Tokens) || !slices.Equal(seq1.Mask, seq2.Mask) {
						t.Fatalf("one-render sequence differs from the two-render one (%d vs %d tokens)", len(seq1.Tokens), len(seq2.Tokens))
					}
					if seq1.DriftTokens != seq2.DriftTokens {
						t.Fatalf("drift %d vs %d", seq1.DriftTokens, seq2.DriftTokens)
					}
					// Turn 1 renders the prompt and learns the closing; turn 2
					// learns the shape; turns 3.. are steady.
					for i := 2; i < len(per1); i++ {
						if per1[i] != tc.want || per2[i] != tc.before {
							t.Fatalf("turn %d: %d requests (two-render %d), want %d (%d); all turns %v / %v", i+1, per1[i], per2[i], tc.want, tc.before, per1, per2)
						}
					}
				})
			}
		}
	}
}
