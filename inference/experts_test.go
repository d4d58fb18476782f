package inference_test

import (
	"context"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

// Routed experts through a multi-turn episode: the sequence's routing
// covers every token before the last sampled id, row for row what the
// engine routed at that position, on both engines' wire formats.
func TestRoutedExpertsAligned(t *testing.T) {
	x := &sim.Experts{Layers: 3, TopK: 2, Num: 8}
	for _, be := range []string{inference.BackendVLLMGenerate, inference.BackendSGLang} {
		t.Run(be, func(t *testing.T) {
			srv := startSim(t, sim.Config{Family: "hermes", Seed: 5, Experts: x})
			c := openClient(t, inference.Config{Backend: be, Endpoints: []string{srv.URL}, RoutedExperts: true, RoutedExpertsTopK: 2})
			turns, seq, _ := runEpisode(t, c, inference.EpisodeSpec{ID: "moe", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 128}}, 3, true)
			checkSequence(t, seq, turns)
			r := seq.Routing
			if r == nil {
				t.Fatal("no routing in the sequence")
			}
			last := seq.TurnStarts[len(seq.TurnStarts)-1] + len(turns[len(turns)-1].CompletionIDs)
			if r.Positions != last-1 || r.Layers != 3 || r.TopK != 2 {
				t.Fatalf("routing %d positions × %d layers × %d, want %d × 3 × 2", r.Positions, r.Layers, r.TopK, last-1)
			}
			ids := make([]int, last)
			for i := range ids {
				ids[i] = int(seq.Tokens[i])
			}
			want := x.ExpertsFor(ids)
			if len(want) != len(r.Experts) {
				t.Fatalf("%d experts, want %d", len(r.Experts), len(want))
			}
			for i := range want {
				if int32(r.Experts[i]) != want[i] {
					p := i / (r.Layers * r.TopK)
					t.Fatalf("expert %d (position %d, token %d) is %d, the engine routed %d", i, p, ids[p], r.Experts[i], want[i])
				}
			}
		})
	}
}

// Asking a server that returns no experts fails the turn with the fix;
// configurations that cannot work are refused at Open.
func TestRoutedExpertsErrors(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes", Seed: 5})
	for _, be := range []string{inference.BackendVLLMGenerate, inference.BackendSGLang} {
		c := openClient(t, inference.Config{Backend: be, Endpoints: []string{srv.URL}, RoutedExperts: true, RoutedExpertsTopK: 2})
		ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: "dense", Sampling: inference.Sampling{MaxTokens: 16}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}})
		if err == nil || !strings.Contains(err.Error(), "--enable-return-routed-experts") {
			t.Fatalf("%s: %v, want the missing-experts error", be, err)
		}
	}
	moe := startSim(t, sim.Config{Family: "hermes", Seed: 5, Experts: &sim.Experts{Layers: 2, TopK: 4, Num: 16}})
	c := openClient(t, inference.Config{Backend: inference.BackendVLLMGenerate, Endpoints: []string{moe.URL}, RoutedExperts: true, RoutedExpertsTopK: 2})
	ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: "topk", Sampling: inference.Sampling{MaxTokens: 16}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}}); err == nil || !strings.Contains(err.Error(), "top-k 4") {
		t.Fatalf("top-k mismatch: %v", err)
	}
	for _, cfg := range []inference.Config{
		{Backend: inference.BackendVLLM, RoutedExperts: true},
		{Backend: inference.BackendChat, RoutedExperts: true},
		{Backend: inference.BackendSGLang, RoutedExperts: true},
		{Backend: inference.BackendSGLang, RoutedExpertsTopK: -1},
	} {
		cfg.Endpoints = []string{srv.URL}
		if _, err := inference.Open(cfg); err == nil {
			t.Fatalf("%+v opened", cfg)
		}
	}
}
