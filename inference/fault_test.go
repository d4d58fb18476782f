package inference_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

// playTurns runs a tool loop of n turns, retrying a failed Generate (the
// episode rolls back a failed turn, so a retry with the same messages is
// safe). It returns the turns, the sequence and how many errors it saw.
func playTurns(ctx context.Context, pol inference.Policy, id string, n, maxRetries int, between func(turn int)) ([]inference.Turn, inference.Sequence, int, error) {
	ep, err := pol.Start(ctx, inference.EpisodeSpec{ID: id, Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 128}})
	if err != nil {
		return nil, inference.Sequence{}, 0, err
	}
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "list files in /tmp"}}
	var turns []inference.Turn
	errs := 0
	for i := 0; i < n; i++ {
		if between != nil {
			between(i)
		}
		var tr inference.Turn
		for {
			tr, err = ep.Generate(ctx, msgs)
			if err == nil {
				break
			}
			if !errors.Is(err, inference.ErrInfra) || errors.Is(err, inference.ErrRequest) {
				return nil, inference.Sequence{}, errs, fmt.Errorf("unexpected class: %w", err)
			}
			errs++
			if errs > maxRetries {
				return nil, inference.Sequence{}, errs, err
			}
		}
		turns = append(turns, tr)
		msgs = append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: tr.Text},
			openai.ChatCompletionMessage{Role: "tool", Content: fmt.Sprintf("out %d", i)})
	}
	msgs = msgs[:len(msgs)-1]
	seq, err := ep.Finish(ctx, msgs)
	return turns, seq, errs, err
}

// An endpoint dying mid-run moves its load to the survivor: every episode
// completes with an exact sequence.
func TestEndpointDyingMidRun(t *testing.T) {
	lat := sim.Latency{TTFT: 2 * time.Millisecond}
	a := startSim(t, sim.Config{Family: "hermes", Latency: lat, Seed: 1})
	b := startSim(t, sim.Config{Family: "hermes", Latency: lat, Seed: 1})
	c := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{a.URL, b.URL},
		Retries: 4, BackoffBase: time.Millisecond, BreakerFailures: 2, BreakerCooldown: time.Hour, Timeout: 10 * time.Second})
	ctx := context.Background()
	const episodes, turns = 32, 4
	var killOnce sync.Once
	var reachedTurn2 atomic.Int64
	kill := func(turn int) {
		if turn == 2 && reachedTurn2.Add(1) == episodes/2 {
			killOnce.Do(func() { go a.Close() })
		}
	}
	var wg sync.WaitGroup
	type res struct {
		turns []inference.Turn
		seq   inference.Sequence
		err   error
	}
	out := make([]res, episodes)
	for i := range episodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr, seq, _, err := playTurns(ctx, c, fmt.Sprintf("die-%d", i), turns, 0, kill)
			out[i] = res{tr, seq, err}
		}()
	}
	wg.Wait()
	killOnce.Do(func() { a.Close() })
	for i, r := range out {
		if r.err != nil {
			t.Fatalf("episode %d: %v", i, r.err)
		}
		checkSequence(t, r.seq, r.turns)
	}
	aGen := a.Stats().ByRoute["POST /v1/completions"]
	bGen := b.Stats().ByRoute["POST /v1/completions"]
	if aGen+bGen < episodes*turns || bGen <= aGen {
		t.Fatalf("generations: dead endpoint %d, survivor %d", aGen, bGen)
	}
	st := c.Pool().State()
	if st[0].Healthy {
		t.Fatalf("dead endpoint not ejected: %+v", st)
	}
	t.Logf("dead endpoint served %d generations, survivor %d", aGen, bGen)
}

// With the simulator's fault injection, every failure is ErrInfra, never a
// panic or a corrupt sequence, and retrying the turn continues cleanly.
func TestInjectedFaults(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes", Seed: 11, Faults: sim.Faults{ErrorRate: 0.1, DropRate: 0.05, MalformedRate: 0.05, TruncateRate: 0.05}})
	c := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL},
		Retries: 2, BackoffBase: time.Millisecond, BreakerFailures: 1000, Timeout: 10 * time.Second})
	total := 0
	for i := range 12 {
		turns, seq, errs, err := playTurns(context.Background(), c, fmt.Sprintf("flt-%d", i), 3, 20, nil)
		if err != nil {
			t.Fatalf("episode %d: %v", i, err)
		}
		total += errs
		checkSequence(t, seq, turns)
		if seq.DriftTokens != 0 {
			t.Fatalf("episode %d: drift %d after retried turns", i, seq.DriftTokens)
		}
	}
	if f := srv.Stats().Faults; len(f) == 0 {
		t.Fatal("no faults injected")
	}
	t.Logf("faults %v, turn-level errors surfaced %d", srv.Stats().Faults, total)
}

// A hung server is cut off by the per-attempt timeout and retried.
func TestHangHitsAttemptTimeout(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes", Faults: sim.Faults{HangRate: 1}})
	c := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL},
		Retries: 1, BackoffBase: time.Millisecond, Timeout: 100 * time.Millisecond})
	ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: "hang", Sampling: inference.Sampling{MaxTokens: 8}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: "q"}})
	if !errors.Is(err, inference.ErrInfra) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(err.Error(), "hang-t1") {
		t.Fatalf("request not named: %v", err)
	}
}
