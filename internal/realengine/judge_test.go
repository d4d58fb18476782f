package realengine

import (
	"errors"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/internal/llamacpptest"
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
