package agentloop

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

// guessResponder answers higher/lower for a secret number, with a turn
// reward of 1 for the hit, and records the turns it saw.
type guessResponder struct {
	target int
	turns  []int
	err    error
	nan    bool
	role   string
}

func (g *guessResponder) Respond(_ context.Context, turn int, msgs []openai.ChatCompletionMessage) (Feedback, error) {
	g.turns = append(g.turns, turn)
	if g.err != nil {
		return Feedback{}, g.err
	}
	last := msgs[len(msgs)-1]
	if last.Role == "tool" {
		return Feedback{Detail: "tool turn"}, nil // nothing to say to a tool turn
	}
	if last.Role != "assistant" {
		return Feedback{}, errors.New("the last message is neither the assistant's nor a tool result")
	}
	n, err := strconv.Atoi(strings.TrimSpace(last.Content))
	r := 0.0
	switch {
	case g.nan:
		r = math.NaN()
		return Feedback{Reward: &r}, nil
	case err != nil:
		r = -0.5
		return Feedback{Messages: []openai.ChatCompletionMessage{{Role: g.role, Content: "A number, please."}}, Reward: &r, Detail: "invalid"}, nil
	case n < g.target:
		return Feedback{Messages: []openai.ChatCompletionMessage{{Content: "Higher."}}, Detail: "higher"}, nil
	case n > g.target:
		return Feedback{Messages: []openai.ChatCompletionMessage{{Content: "Lower."}}, Detail: "lower"}, nil
	}
	r = 1
	return Feedback{Messages: []openai.ChatCompletionMessage{{Content: "Correct!"}}, Done: true, Reward: &r, Detail: "correct"}, nil
}

func TestResponderDrivesEpisode(t *testing.T) {
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "Guess my number (1-100)."}}
	t.Run("found", func(t *testing.T) {
		g := &guessResponder{target: 62}
		p := &scriptPolicy{steps: []step{chatTurn("stop", "50"), chatTurn("stop", "what?"), chatTurn("stop", "75"), chatTurn("stop", "62"), chatTurn("stop", "99")}}
		res, err := Run(context.Background(), Config{ID: "g", Messages: msgs, MaxTurns: 10, Responder: g}, Deps{Policy: p})
		if err != nil {
			t.Fatal(err)
		}
		if res.StopReason != StopEnvDone || !res.FinishedNaturally || res.TurnsUsed != 4 || res.StopReason.Failed() {
			t.Fatalf("stop %s natural %v turns %d", res.StopReason, res.FinishedNaturally, res.TurnsUsed)
		}
		if got := roles(res); got != "user,assistant,user,assistant,user,assistant,user,assistant,user" {
			t.Fatalf("roles %s", got)
		}
		if res.Messages[4].Content != "A number, please." || res.Messages[8].Content != "Correct!" {
			t.Fatalf("messages %+v", res.Messages)
		}
		if d := cmpFloats(res.TurnRewards, []float64{0, -0.5, 0, 1}); d != "" {
			t.Fatal(d)
		}
		want := "env_message:higher,turn_reward:-0.5,env_message:invalid,env_message:lower,turn_reward:1,env_message:correct,env_done:correct"
		if got := eventKinds(res); got != want {
			t.Fatalf("events\n got %s\nwant %s", got, want)
		}
		if res.Counters.EnvMessages != 4 || res.Counters.InsertedMessages != 0 {
			t.Fatalf("counters %+v", res.Counters)
		}
		if res.Events[len(res.Events)-2].Message != 8 {
			t.Fatalf("env message index %+v", res.Events)
		}
		if d := cmpInts(g.turns, []int{1, 2, 3, 4}); d != "" {
			t.Fatal(d)
		}
	})
	t.Run("turn budget runs out", func(t *testing.T) {
		g := &guessResponder{target: 3}
		p := &scriptPolicy{steps: []step{chatTurn("stop", "1"), chatTurn("stop", "x")}}
		res, err := Run(context.Background(), Config{ID: "g", Messages: msgs, MaxTurns: 2, Responder: g}, Deps{Policy: p})
		if err != nil {
			t.Fatal(err)
		}
		if res.StopReason != StopMaxTurns || res.FinishedNaturally {
			t.Fatalf("stop %s", res.StopReason)
		}
		if d := cmpFloats(res.TurnRewards, []float64{0, -0.5}); d != "" {
			t.Fatal(d)
		}
	})
	t.Run("no reward given", func(t *testing.T) {
		g := &guessResponder{target: 3}
		p := &scriptPolicy{steps: []step{chatTurn("stop", "1")}}
		res, _ := Run(context.Background(), Config{ID: "g", Messages: msgs, MaxTurns: 1, Responder: g}, Deps{Policy: p})
		if res.TurnRewards != nil {
			t.Fatalf("turn rewards %v", res.TurnRewards)
		}
	})
	for name, g := range map[string]*guessResponder{
		"responder error": {err: errors.New("user simulator unreachable")},
		"NaN reward":      {nan: true},
		"bad role":        {role: "assistant"},
	} {
		t.Run(name, func(t *testing.T) {
			p := &scriptPolicy{steps: []step{chatTurn("stop", "7x")}}
			res, err := Run(context.Background(), Config{ID: "g", Messages: msgs, Responder: g}, Deps{Policy: p})
			if err == nil || res.StopReason != StopEnvErr || !res.StopReason.Failed() || res.Error == "" {
				t.Fatalf("stop %s err %v", res.StopReason, err)
			}
		})
	}
	t.Run("after tool turns", func(t *testing.T) {
		// The responder also sees tool turns; a reply to them is optional.
		g := &guessResponder{target: 5}
		p := &scriptPolicy{steps: []step{calls([2]string{"nope", "{}"}), chatTurn("stop", "5")}}
		res, err := Run(context.Background(), Config{ID: "g", Messages: msgs, Responder: g}, Deps{Policy: p})
		if err != nil {
			t.Fatal(err)
		}
		// Turn 1: the unknown tool's error, then the responder, which has
		// nothing to say; turn 2 is the hit.
		if res.StopReason != StopEnvDone || roles(res) != "user,assistant,tool,assistant,user" || cmpInts(g.turns, []int{1, 2}) != "" {
			t.Fatalf("stop %s roles %s turns %v", res.StopReason, roles(res), g.turns)
		}
	})
}

func cmpFloats(got, want []float64) string {
	if len(got) != len(want) {
		return "got " + formatFloats(got) + " want " + formatFloats(want)
	}
	for i := range got {
		if got[i] != want[i] {
			return "got " + formatFloats(got) + " want " + formatFloats(want)
		}
	}
	return ""
}

func formatFloats(f []float64) string {
	var s []string
	for _, v := range f {
		s = append(s, strconv.FormatFloat(v, 'g', -1, 64))
	}
	return "[" + strings.Join(s, " ") + "]"
}

func cmpInts(got, want []int) string {
	if len(got) != len(want) {
		return "turns " + strconv.Itoa(len(got)) + " want " + strconv.Itoa(len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return "turn mismatch"
		}
	}
	return ""
}

// In tokens mode the environment's messages are rendered by the server's
// template and masked: the trained ids are exactly the sampled replies.
func TestResponderTokensModeMasksEnvMessages(t *testing.T) {
	task := "Guess my number between 1 and 100 (tokens test)."
	srv, err := sim.Start(context.Background(), sim.Config{Family: "hermes", Scripts: []sim.Script{{Match: task,
		Steps: []sim.Step{{Final: "50"}, {Final: "75"}, {Final: "62"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, backend := range []string{"vllm", "chat"} {
		t.Run(backend, func(t *testing.T) {
			pol, err := inference.New(inference.Config{Backend: backend, Endpoints: []string{srv.URL}, ChatTokenIDs: true, Retries: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer pol.(interface{ Close() error }).Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			g := &guessResponder{target: 62}
			res, err := Run(ctx, Config{ID: "tok-" + backend, Messages: []openai.ChatCompletionMessage{{Role: "user", Content: task}}, MaxTurns: 6, Responder: g,
				Sampling: inference.Sampling{MaxTokens: 256}}, Deps{Policy: pol})
			if err != nil {
				t.Fatal(err)
			}
			if res.StopReason != StopEnvDone || res.TurnsUsed != 3 {
				t.Fatalf("stop %s turns %d: %+v", res.StopReason, res.TurnsUsed, res.Messages)
			}
			seq := res.Sequence
			if len(seq.Tokens) == 0 || len(seq.Mask) != len(seq.Tokens) {
				t.Fatalf("sequence %d tokens %d mask", len(seq.Tokens), len(seq.Mask))
			}
			tok := sim.NewTokenizer()
			var trained, untrained []int
			for i, id := range seq.Tokens {
				if seq.Mask[i] == 1 {
					trained = append(trained, int(id))
				} else {
					untrained = append(untrained, int(id))
				}
			}
			tr, err := tok.Decode(trained, false)
			if err != nil {
				t.Fatal(err)
			}
			un, _ := tok.Decode(untrained, false)
			// "Correct!" came after the last generation: it is in the
			// messages, not in the sequence (nothing follows to train).
			for _, envText := range []string{"Lower.", "Higher."} {
				if strings.Contains(tr, envText) {
					t.Fatalf("env message %q is trained: %q", envText, tr)
				}
				if !strings.Contains(un, envText) {
					t.Fatalf("env message %q not rendered in the sequence: %q", envText, un)
				}
			}
			for _, guess := range []string{"50", "75", "62"} {
				if !strings.Contains(tr, guess) {
					t.Fatalf("sampled reply %q not trained: %q", guess, tr)
				}
			}
		})
	}
}
