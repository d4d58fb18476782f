package realengine

import (
	"context"
	"strconv"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
)

// nagger answers every reply of the model with a fixed user message (the
// tiny random model never names a number) and gives each turn a reward.
type nagger struct{ text string }

func (n nagger) Respond(_ context.Context, turn int, _ []openai.ChatCompletionMessage) (agentloop.Feedback, error) {
	r := -0.1 * float64(turn)
	return agentloop.Feedback{Messages: []openai.ChatCompletionMessage{{Content: n.text}}, Reward: &r, Detail: "nag"}, nil
}

// Environment feedback against the real llama.cpp engine in tokens mode:
// the env's messages are rendered by the server's template between the
// sampled turns and masked; the sampled tokens are trained.
func TestEnvFeedbackTokensMode(t *testing.T) {
	e := llamacpptest.Start(t, llamacpptest.Options{Slots: 1, Ctx: 8192, Threads: 1})
	pol, err := inference.New(inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{e.URL}, Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer pol.(interface{ Close() error }).Close()
	const nag = "Please answer with one integer between 1 and 100."
	// The random model rarely ends a turn by itself: bias <|im_end|> so
	// that replies end before max_tokens and the env gets to answer.
	var tok struct {
		Tokens []struct {
			ID int `json:"id"`
		} `json:"tokens"`
	}
	e.MustCall(t, "/tokenize", map[string]any{"content": "<|im_end|>", "parse_special": true, "with_pieces": true}, &tok)
	if len(tok.Tokens) != 1 {
		t.Fatalf("<|im_end|> is %d tokens", len(tok.Tokens))
	}
	bias := map[string]float64{strconv.Itoa(tok.Tokens[0].ID): 3}
	// A random reply can still run into max_tokens on the first turn (stop
	// reason length, nothing for the env to answer): try a few episodes.
	var res agentloop.Result
	for attempt := range 5 {
		res, err = agentloop.Run(suiteCtx(t), agentloop.Config{ID: "feedback-llama-" + strconv.Itoa(attempt),
			Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "Guess my number between 1 and 100."}},
			MaxTurns: 3, Sampling: inference.Sampling{MaxTokens: 48, ExtraBody: map[string]any{"logit_bias": bias}}, Responder: nagger{nag}}, agentloop.Deps{Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		if res.TurnsUsed > 1 {
			break
		}
	}
	if res.StopReason != agentloop.StopMaxTurns && res.StopReason != agentloop.StopLength {
		t.Fatalf("stop %s", res.StopReason)
	}
	seq := res.Sequence
	if len(seq.Tokens) == 0 || len(seq.Mask) != len(seq.Tokens) {
		t.Fatalf("sequence: %d tokens, %d mask", len(seq.Tokens), len(seq.Mask))
	}
	var trained, untrained []int
	for i, id := range seq.Tokens {
		if seq.Mask[i] == 1 {
			trained = append(trained, int(id))
		} else {
			untrained = append(untrained, int(id))
		}
	}
	detok := func(ids []int) string {
		var out struct {
			Content string `json:"content"`
		}
		e.MustCall(t, "/detokenize", map[string]any{"tokens": ids}, &out)
		return out.Content
	}
	// Messages after the last generation are not in the sequence: the env
	// answered res.TurnsUsed turns, all but the last before a generation
	// (a length stop leaves the turn unanswered).
	inSeq := strings.Count(detok(untrained), nag)
	answered := 0
	for _, ev := range res.Events {
		if ev.Kind == agentloop.EventEnvMessage {
			answered++
		}
	}
	if answered == 0 || inSeq < answered-1 || inSeq == 0 {
		t.Fatalf("env messages: %d added, %d rendered in the untrained ids", answered, inSeq)
	}
	if strings.Contains(detok(trained), nag) {
		t.Fatal("an env message is in the trained ids")
	}
	if len(res.TurnRewards) != res.TurnsUsed {
		t.Fatalf("turn rewards %v over %d turns", res.TurnRewards, res.TurnsUsed)
	}
	t.Logf("llama.cpp tokens mode: %d turns, %s, %d env messages (%d in the sequence), %d of %d tokens trained",
		res.TurnsUsed, res.StopReason, answered, inSeq, len(trained), len(seq.Tokens))
}
