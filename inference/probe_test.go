package inference_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

// TestConcurrentEpisodesShareTemplateProbe starts many episodes at once
// (a run's first wave): the template-closing probe (two renders) and the
// end-of-turn decode happen once for all of them, and each episode's
// renders are exactly its own (first prompt, two per later turn with
// two_render_segments — one once another episode has learned the
// assistant shape —, the drift render), whatever the interleaving.
func TestConcurrentEpisodesShareTemplateProbe(t *testing.T) {
	for _, two := range []bool{true, false} {
		t.Run(fmt.Sprintf("two_render_segments=%v", two), func(t *testing.T) { concurrentProbe(t, two) })
	}
}

func concurrentProbe(t *testing.T, twoRenders bool) {
	srv := startSim(t, sim.Config{Family: "hermes", Seed: 7, Latency: sim.Latency{TTFT: 20 * time.Millisecond}})
	c := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL},
		Sampling: inference.Sampling{MaxTokens: 64}, TwoRenderSegments: twoRenders})
	const episodes, turns = 48, 2
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, episodes)
	start := make(chan struct{})
	for i := range episodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs <- playEpisode(ctx, c, fmt.Sprintf("ep-%d", i), turns)
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	st := srv.Stats()
	// Per episode: the first prompt, two renders per later turn, the
	// drift render; plus the closing probe's two renders, once.
	wantTok := int64(episodes*(1+2*(turns-1)+1) + 2)
	// One render per later turn for the episodes that reach it after the
	// shape was learned: how many do depends on the interleaving.
	least := int64(episodes*(1+(turns-1)+1) + 2 + 1)
	if got := st.ByRoute["POST /tokenize"]; twoRenders && got != wantTok || !twoRenders && (got < least || got > wantTok) {
		t.Errorf("%d /tokenize requests, want %d (%d episodes × %d turns, one shared closing probe; with one render per known shape at least %d)",
			got, wantTok, episodes, turns, least)
	}
	if got := st.ByRoute["POST /detokenize"]; got > 1 {
		t.Errorf("%d /detokenize requests, want at most 1 (the end-of-turn token's text, shared)", got)
	}
	if got := st.ByRoute["POST /v1/completions"]; got != episodes*turns {
		t.Errorf("%d generations, want %d", got, episodes*turns)
	}
}

func playEpisode(ctx context.Context, pol inference.Policy, id string, turns int) error {
	ep, err := pol.Start(ctx, inference.EpisodeSpec{ID: id, Tools: []openai.Tool{terminalTool}})
	if err != nil {
		return fmt.Errorf("%s: start: %w", id, err)
	}
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "list files"}}
	for i := range turns {
		tr, err := ep.Generate(ctx, msgs)
		if err != nil {
			return fmt.Errorf("%s turn %d: %w", id, i+1, err)
		}
		msgs = append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: tr.Text},
			openai.ChatCompletionMessage{Role: "tool", ToolCallID: fmt.Sprintf("call%05d", i), Content: "file.txt"})
	}
	seq, err := ep.Finish(ctx, msgs[:len(msgs)-1])
	if err != nil {
		return fmt.Errorf("%s: finish: %w", id, err)
	}
	if seq.DriftTokens != 0 {
		return fmt.Errorf("%s: drift %d tokens, want 0", id, seq.DriftTokens)
	}
	return nil
}
