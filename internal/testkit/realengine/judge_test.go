package realengine

import (
	"errors"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
	"github.com/rollout-rl/rollout/rewards"
)

// TestJudgeOnLlamaServer: an LLM judge asks llama-server's chat route
// through its default client (the inference pool's transport). The
// random-weight model writes no verdict, so the reward fails as a reward
// error naming the reply it got — a real chat answer read to the end and
// decoded — never as a score of 0 and never as an unreachable endpoint —
// in two rounds of four concurrent verdicts.
func TestJudgeOnLlamaServer(t *testing.T) {
	e := llamacpptest.Start(t, llamacpptest.Options{Slots: 4, Ctx: 4 * 2048, Threads: 1})
	j, err := rewards.NewJudge(rewards.Judge{BaseURL: e.URL, Model: "tiny", Retries: 1})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		errs := make(chan error, 4)
		for range 4 {
			go func() {
				_, err := j.Score(suiteCtx(t), rewards.Input{Final: "The answer is 4."})
				errs <- err
			}()
		}
		for range 4 {
			err := <-errs
			if !errors.Is(err, rewards.ErrReward) || !strings.Contains(err.Error(), "no JSON object with a numeric score") {
				t.Fatalf("round %d: err = %v, want a reward error about the reply's missing verdict", round, err)
			}
		}
	}
}

// TestHintJudgeOnLlamaServer: distillation hints with llama-server as the
// judge (the teacher is the simulator: llama-server has no
// prompt_logprobs). The judge's chat requests are accepted and answered;
// the random-weight model writes no \boxed verdict, so every vote counts
// for no hint — model output, not a failure — and no turn is rescored.
func TestHintJudgeOnLlamaServer(t *testing.T) {
	e := llamacpptest.Start(t, llamacpptest.Options{Slots: 2, Ctx: 2 * 4096, Threads: 1})
	srv, err := sim.Start(suiteCtx(t), sim.Config{Family: "hermes", Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	tc, err := inference.NewTeacher(inference.TeacherConfig{Endpoint: srv.URL, Model: "rollout-sim", TopK: 2,
		Hints: &inference.HintConfig{Endpoint: e.URL, Model: "tiny", Votes: 2, MaxTokens: 48}})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	in := inference.HintInput{
		Messages: []openai.ChatCompletionMessage{
			{Role: openai.ChatMessageRoleUser, Content: "Make the tests pass."},
			{Role: openai.ChatMessageRoleAssistant, Content: "I will run them."},
			{Role: openai.ChatMessageRoleTool, Name: "terminal", Content: "FAILED: 1 of 3"},
			{Role: openai.ChatMessageRoleAssistant, Content: "Done."},
		},
		First: 1,
		Sequence: inference.Sequence{
			Tokens:     []int32{60, 61, 62, 63, 70, 71, 72, 64, 65, 73, 74},
			Mask:       []int8{0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1},
			TurnStarts: []int{4, 9},
		},
	}
	// The start check reads llama-server's own /v1/models: a judge model it
	// does not serve is refused by name.
	wrong, err := inference.NewTeacher(inference.TeacherConfig{Endpoint: srv.URL, Model: "rollout-sim",
		Hints: &inference.HintConfig{Endpoint: e.URL, Model: "no-such-judge"}})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if err := wrong.Ready(suiteCtx(t), 10*time.Second); !errors.Is(err, inference.ErrModelNotServed) || !strings.Contains(err.Error(), "distill hint judge start check") {
		t.Fatalf("judge model not served by llama-server: %v", err)
	}
	hinted, st, err := tc.HintTurns(suiteCtx(t), in)
	if err != nil {
		t.Fatalf("judge on llama-server: %v", err)
	}
	if len(hinted) != 0 || st.Judged != 1 || st.Unreadable != 2 {
		t.Fatalf("hinted %+v, stats %+v: want the one turn with a next state judged, both votes without a verdict", hinted, st)
	}
}
