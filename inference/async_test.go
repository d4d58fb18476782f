package inference_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

// waitGenerating waits until the simulator is running a generation.
func waitGenerating(t *testing.T, srv *sim.Server, route string, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for srv.Async().Running < int(n) {
		if time.Now().After(deadline) {
			t.Fatalf("no generation in flight on %s", route)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// An update in each mode while a turn is being generated: the turn's ids
// and logprobs are exactly what the simulator sampled, every sampled id
// carries the version it was sampled under, and an abort is recorded as a
// cut and continued without re-tokenising.
func TestUpdateDuringGeneration(t *testing.T) {
	for _, be := range []string{inference.BackendVLLM, inference.BackendSGLang, inference.BackendVLLMGenerate} {
		for _, mode := range inference.PauseModes() {
			t.Run(be+"/"+mode, func(t *testing.T) {
				srv := startSim(t, sim.Config{Seed: 3, RecordGenerations: true, Latency: sim.Latency{PerToken: 4 * time.Millisecond}})
				c := openClient(t, inference.Config{Backend: be, Endpoints: []string{srv.URL}})
				ctx := context.Background()
				ep, err := c.Start(ctx, inference.EpisodeSpec{ID: "ep", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 200}})
				if err != nil {
					t.Fatal(err)
				}
				msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "list the files in /tmp and count them"}}
				type res struct {
					turn inference.Turn
					err  error
				}
				done := make(chan res, 1)
				go func() {
					tr, err := ep.Generate(ctx, msgs)
					done <- res{tr, err}
				}()
				route := map[string]string{inference.BackendVLLM: "POST /v1/completions", inference.BackendSGLang: "POST /generate", inference.BackendVLLMGenerate: "POST /inference/v1/generate"}[be]
				waitGenerating(t, srv, route, 1)
				time.Sleep(20 * time.Millisecond) // a few tokens in
				st, err := c.BeginUpdate(ctx, mode)
				if err != nil {
					t.Fatalf("begin: %v", err)
				}
				if st.Fallback {
					t.Fatalf("%s has a pause API; got the fallback", be)
				}
				if !c.Updating() {
					t.Fatal("not updating after BeginUpdate")
				}
				srv.SetPolicyVersion(1) // the trainer loads weights
				if _, err := c.EndUpdate(ctx, 1); err != nil {
					t.Fatalf("end: %v", err)
				}
				r := <-done
				if r.err != nil {
					t.Fatalf("generate: %v", r.err)
				}
				seq, err := ep.Finish(ctx, append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: r.turn.Text}))
				if err != nil {
					t.Fatal(err)
				}
				if len(seq.Versions) != len(seq.Tokens) {
					t.Fatalf("%d versions for %d tokens", len(seq.Versions), len(seq.Tokens))
				}
				gens := srv.Generations()
				var ids []int32
				var lps []float32
				var vers []int64
				for _, g := range gens {
					for j, id := range g.IDs {
						ids = append(ids, int32(id))
						lps = append(lps, float32(g.Logprobs[j]))
						vers = append(vers, g.Versions[j])
					}
				}
				start := seq.TurnStarts[0]
				got := seq.Tokens[start:]
				if !slices.Equal(got, ids) {
					t.Fatalf("sequence ids differ from what the simulator sampled:\n got %v\nwant %v", got, ids)
				}
				if !slices.Equal(seq.Logprobs[start:], lps) {
					t.Fatalf("logprobs differ from the simulator's")
				}
				switch mode {
				case inference.PauseAbort:
					if len(gens) != 2 || gens[0].Finish != "abort" {
						t.Fatalf("want an aborted generation and its continuation, got %d generations (first finish %q)", len(gens), gens[0].Finish)
					}
					if !strings.HasSuffix(gens[1].RequestID, "-c1") {
						t.Fatalf("continuation request id %q", gens[1].RequestID)
					}
					// The continuation's prompt is the first prompt plus the partial ids, verbatim.
					want := append(slices.Clone(gens[0].Prompt), gens[0].IDs...)
					if !slices.Equal(gens[1].Prompt, want) {
						t.Fatal("continuation prompt is not prompt + partial ids")
					}
					if len(seq.Cuts) != 1 || seq.Cuts[0].Kind != inference.PauseAbort || seq.Cuts[0].Position != start+len(gens[0].IDs) || seq.Cuts[0].From != 0 || seq.Cuts[0].To != 1 {
						t.Fatalf("cuts %+v, want one abort cut at %d from 0 to 1", seq.Cuts, start+len(gens[0].IDs))
					}
					if !slices.Equal(seq.Versions[start:], vers) {
						t.Fatalf("versions %v, simulator %v", seq.Versions[start:], vers)
					}
				case inference.PauseWait:
					if len(gens) != 1 || gens[0].Finish == "abort" || len(seq.Cuts) != 0 {
						t.Fatalf("wait mode: %d generations, cuts %+v", len(gens), seq.Cuts)
					}
					for _, v := range seq.Versions[start:] {
						if v != 0 {
							t.Fatalf("drained generation stamped %d", v)
						}
					}
				case inference.PauseKeep:
					if len(gens) != 1 || gens[0].FrozenAt < 0 {
						t.Fatalf("keep mode: %d generations, frozen at %d", len(gens), gens[0].FrozenAt)
					}
					if be == inference.BackendSGLang {
						// SGLang reports per-token version spans: every id
						// carries the version it was sampled under, and the
						// switch point is exact.
						if !slices.Equal(seq.Versions[start:], vers) {
							t.Fatalf("versions %v, simulator %v", seq.Versions[start:], vers)
						}
						fz := gens[0].FrozenAt
						if fz >= len(gens[0].IDs) {
							t.Skipf("the generation ended before the freeze took effect (%d ids)", len(gens[0].IDs))
						}
						if vers[0] != 0 || vers[len(vers)-1] != 1 {
							t.Fatalf("simulator versions %v: want 0 then 1", vers)
						}
						if len(seq.Cuts) != 1 || seq.Cuts[0].Kind != inference.PauseKeep || seq.Cuts[0].Position != start+fz || seq.Cuts[0].From != 0 || seq.Cuts[0].To != 1 {
							t.Fatalf("keep mode cuts %+v, want one at %d from 0 to 1", seq.Cuts, start+fz)
						}
						break
					}
					if len(seq.Cuts) != 1 || seq.Cuts[0].Kind != inference.PauseKeep || seq.Cuts[0].Position != -1 {
						t.Fatalf("keep mode cuts %+v", seq.Cuts)
					}
					// vLLM reports no per-token versions: the switch point is
					// not observable and the older version, a lower bound, is
					// stamped.
					for _, v := range seq.Versions[start:] {
						if v != 0 {
							t.Fatalf("keep-mode generation stamped %d, want the lower bound 0", v)
						}
					}
				}
				if c.PolicyVersion() != 1 {
					t.Fatalf("version %d after the update", c.PolicyVersion())
				}
			})
		}
	}
}

func TestUpdateErrors(t *testing.T) {
	srv := startSim(t, sim.Config{Seed: 1})
	c := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}})
	ctx := context.Background()
	if _, err := c.BeginUpdate(ctx, "freeze"); !errors.Is(err, inference.ErrUpdate) || !strings.Contains(err.Error(), "keep, wait, abort") {
		t.Fatalf("bad mode: %v", err)
	}
	if _, err := c.EndUpdate(ctx, 1); !errors.Is(err, inference.ErrUpdate) {
		t.Fatalf("end without begin: %v", err)
	}
	if _, err := c.BeginUpdate(ctx, inference.PauseKeep); err != nil {
		t.Fatal(err)
	}
	if !srv.Async().Paused {
		t.Fatal("simulator not paused")
	}
	if _, err := c.BeginUpdate(ctx, inference.PauseKeep); !errors.Is(err, inference.ErrUpdate) {
		t.Fatalf("second begin: %v", err)
	}
	if _, err := c.EndUpdate(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if srv.Async().Paused {
		t.Fatal("simulator still paused")
	}
	if _, err := c.BeginUpdate(ctx, inference.PauseWait); err != nil {
		t.Fatal(err)
	}
	if _, err := c.EndUpdate(ctx, 2); !errors.Is(err, inference.ErrUpdate) || !strings.Contains(err.Error(), "older") {
		t.Fatalf("version going back: %v", err)
	}
	if _, err := c.EndUpdate(ctx, 3); err != nil {
		t.Fatal(err)
	}
}

// llama.cpp has no pause API: drain-and-wait, and the generation that was
// in flight finishes under the old version.
func TestUpdateFallbackLlamaCpp(t *testing.T) {
	srv := startSim(t, sim.Config{Seed: 1, Engine: sim.EngineLlamaCpp, Latency: sim.Latency{PerToken: 2 * time.Millisecond}})
	c := openClient(t, inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{srv.URL}})
	ctx := context.Background()
	ep, err := c.Start(ctx, inference.EpisodeSpec{ID: "ep", Sampling: inference.Sampling{MaxTokens: 64}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ep.Generate(ctx, []openai.ChatCompletionMessage{{Role: "user", Content: "hello"}})
		done <- err
	}()
	waitGenerating(t, srv, "POST /completion", 1)
	st, err := c.BeginUpdate(ctx, inference.PauseAbort)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Fallback {
		t.Fatal("llama.cpp should get the drain-and-wait fallback")
	}
	if n := srv.Async().Running; n != 0 {
		t.Fatalf("BeginUpdate returned with %d generations still running", n)
	}
	if _, err := c.EndUpdate(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
