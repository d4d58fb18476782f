package agentloop

import (
	"context"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/parsers"
	"github.com/rollout-rl/rollout/tools"
)

// The simulator emits well-formed, repairable and malformed hermes calls
// as sampled ids; through the real tokens-mode clients (vLLM and
// llama.cpp flavours) each call's status is recorded and its token span
// in the Sequence detokenises (by the simulator's tokenizer) to text that
// contains exactly the call as written, within the turn's sampled ids.
func TestCallSpansSimulator(t *testing.T) {
	task := "Look at the files (span test)."
	okCall := "<tool_call>\n{\"name\": \"look\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>"
	strArgs := "<tool_call>\n{\"name\": \"look\", \"arguments\": \"{\\\"path\\\": \\\"b\\\"}\"}\n</tool_call>"
	badArgs := "<tool_call>\n{\"name\": \"look\", \"arguments\": [1]}\n</tool_call>"
	unclosed := "<tool_call>\n{\"name\": \"look\", \"arguments\": {\"path\": \"ü€\"}}"
	turn1 := "Let me look. " + okCall + "\n" + strArgs + "\n" + badArgs
	steps := []sim.Step{{Final: turn1}, {Final: unclosed}, {Final: "done"}}
	raws := []string{okCall, strArgs, badArgs, unclosed}
	want := []CallStatus{
		{Turn: 1, Index: 0, Name: "look", Status: parsers.StatusOK},
		{Turn: 1, Index: 1, Name: "look", Status: parsers.StatusRepaired, Reason: parsers.RepairArgsString},
		{Turn: 1, Index: 2, Name: "look", Status: parsers.StatusMalformed, Reason: "arguments: arguments are a JSON array, not an object"},
		{Turn: 2, Index: 0, Name: "look", Status: parsers.StatusRepaired, Reason: parsers.RepairCloseMissing},
	}
	for _, engine := range []string{sim.EngineVLLM, sim.EngineLlamaCpp} {
		t.Run(engine, func(t *testing.T) {
			srv, err := sim.Start(context.Background(), sim.Config{Family: "hermes", Engine: engine, Scripts: []sim.Script{{Match: task, Steps: steps}}})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			backend := "vllm"
			if engine == sim.EngineLlamaCpp {
				backend = "llamacpp"
			}
			pol, err := inference.New(inference.Config{Backend: backend, Endpoints: []string{srv.URL}, Retries: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer pol.(interface{ Close() error }).Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tt := &testTools{}
			cfg := Config{ID: "span-" + engine, Parser: "hermes", Messages: []openai.ChatCompletionMessage{{Role: "user", Content: task}},
				MaxTurns: 5, Tools: tt.set(t), Sampling: inference.Sampling{MaxTokens: 512}}
			res, err := Run(ctx, cfg, Deps{Policy: pol, Runtime: tools.NewRuntime(&memSandbox{}, "span")})
			if err != nil || res.StopReason != StopFinished {
				t.Fatalf("stop %s: %v", res.StopReason, err)
			}
			if len(res.CallStatuses) != len(want) {
				t.Fatalf("statuses %+v", res.CallStatuses)
			}
			seq := res.Sequence
			tok := sim.NewTokenizer()
			for i, got := range res.CallStatuses {
				w := want[i]
				w.SpanStart, w.SpanEnd = got.SpanStart, got.SpanEnd
				if got != w {
					t.Fatalf("call %d: got %+v want %+v", i, got, w)
				}
				if got.SpanStart < 0 || got.SpanEnd <= got.SpanStart || got.SpanEnd > len(seq.Tokens) {
					t.Fatalf("call %d: span [%d, %d) of %d tokens", i, got.SpanStart, got.SpanEnd, len(seq.Tokens))
				}
				// Within the turn's sampled ids (some may be unscored, mask 0).
				from := seq.TurnStarts[got.Turn-1]
				if got.SpanStart < from || got.SpanEnd > from+res.Turns[got.Turn-1].CompletionTokens {
					t.Fatalf("call %d: span [%d, %d) outside turn %d's sampled ids [%d, %d)", i, got.SpanStart, got.SpanEnd, got.Turn, from, from+res.Turns[got.Turn-1].CompletionTokens)
				}
				ids := make([]int, 0, got.SpanEnd-got.SpanStart)
				for _, id := range seq.Tokens[got.SpanStart:got.SpanEnd] {
					ids = append(ids, int(id))
				}
				text, err := tok.Decode(ids, false)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(text, raws[i]) {
					t.Fatalf("call %d: span text %q does not contain %q", i, text, raws[i])
				}
				// Exact: dropping the first or last id loses part of the call.
				for _, cut := range [][]int{ids[1:], ids[:len(ids)-1]} {
					if s, _ := tok.Decode(cut, false); strings.Contains(s, raws[i]) {
						t.Fatalf("call %d: span [%d, %d) is wider than the call: %q", i, got.SpanStart, got.SpanEnd, s)
					}
				}
			}
		})
	}
}
