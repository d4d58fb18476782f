package capture_test

import (
	"context"
	"encoding/json"
	"math"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/builtin"
	"github.com/rollout-rl/rollout/gateway/capture"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
	"github.com/rollout-rl/rollout/internal/testkit/metrictest"
)

// TestRealEngineSession drives a normalising tool-using harness through
// the OpenAI door against llama.cpp's llama-server serving the tiny
// random Qwen3 model biased to tool calls, then compacts its history:
// two branches whose trained ids re-score against the server. The random
// model's calls are nearly always malformed (cut or mangled JSON): they
// come back as content, the model's misbehaviour, never an error; the
// simulator's tests cover well-formed calls and their anchoring. It runs
// against llama-server started as the suite starts it
// (--no-prefill-assistant) and started with its defaults, as a user would.
func TestRealEngineSession(t *testing.T) { bothPrefills(t, realEngineSession) }

// bothPrefills runs f against llama-server started as the suite starts it
// (--no-prefill-assistant) and started with its defaults (prefill on).
func bothPrefills(t *testing.T, f func(t *testing.T, prefill bool)) {
	t.Run("no-prefill-assistant", func(t *testing.T) { f(t, false) })
	t.Run("server-defaults", func(t *testing.T) { f(t, true) })
}

func realEngineSession(t *testing.T, prefill bool) {
	e := llamacpptest.Start(t, llamacpptest.Options{Slots: 1, Ctx: 8192, Threads: 1, PrefillAssistant: prefill})
	var models struct {
		Data []struct {
			ID   string `json:"id"`
			Meta struct {
				NVocab int `json:"n_vocab"`
			} `json:"meta"`
		} `json:"data"`
	}
	e.MustCall(t, "/v1/models", nil, &models)
	model, vocab := models.Data[0].ID, models.Data[0].Meta.NVocab
	pol, err := inference.New(inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{e.URL}, Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer pol.(interface{ Close() error }).Close()
	one := 1.0
	gw, err := capture.New(pol, capture.Options{Parser: "hermes", ReasoningParser: "qwen3",
		Sampling: inference.Sampling{Temperature: &one, MaxTokens: 48, ExtraBody: map[string]any{"logit_bias": llamacpptest.ToolCallBias(t, e, 8, 8, 2)}}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(capture.Handler(gw, builtin.FrontDoors()))
	defer hs.Close()
	s, err := gw.Open(context.Background(), inference.EpisodeSpec{ID: "real"})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := gw.Models(context.Background(), s.ID())
	if err != nil || ms[0].ContextLength != 8192 {
		t.Fatalf("models %+v, %v (want llama-server's n_ctx 8192)", ms, err)
	}
	base := hs.URL + "/s/" + s.ID() + "/v1"
	h := newHarness(base, "List the files in the working directory.")
	h.normalise = true
	h.extra = map[string]any{"model": model, "temperature": 0.1}
	calls := 0
	for i := 0; i < 3; i++ {
		if f := h.step(t); f != "tool_calls" {
			h.msgs = append(h.msgs, map[string]any{"role": "user", "content": "Continue."})
		}
		calls++
	}
	// The harness compacts: a summary replaces the history.
	h.msgs = []map[string]any{h.msgs[0], {"role": "user", "content": "List the files. Summary so far: nothing found yet."}}
	h.step(t)
	rec, err := s.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Calls) != 4 {
		t.Fatalf("%d calls", len(rec.Calls))
	}
	for _, c := range rec.Calls {
		if c.Status != gateway.CallOK || c.Requested["temperature"] != 0.1 {
			t.Fatalf("call %+v", c)
		}
	}
	if n := len(rec.Branches); n != 2 {
		t.Fatalf("%d branches, want 2 (one conversation, one compaction): %+v", n, rec.Calls)
	}
	b0, b1 := rec.Branches[0], rec.Branches[1]
	if len(b0.Calls) != 3 || b1.Parent != 0 || b1.SplitCall != 3 || b1.Shared == 0 || b1.Shared >= b1.Sequence.PromptLen {
		t.Fatalf("graph: b0 calls %v; b1 parent %d split %d shared %d prompt %d", b0.Calls, b1.Parent, b1.SplitCall, b1.Shared, b1.Sequence.PromptLen)
	}
	checked, unscored := 0, 0
	for _, b := range rec.Branches {
		seq := b.Sequence
		trained := 0
		for k, ci := range b.Calls {
			st := seq.TurnStarts[k]
			n := rec.Calls[ci].CompletionTokens
			for j := st; j < st+n; j++ {
				if seq.Mask[j] == 0 {
					unscored++ // sampled without a logprob (docs/real-engines.md)
					continue
				}
				trained++
				if j%3 != 0 {
					continue // every third trained id is re-scored: enough, and quick
				}
				want := llamacpptest.Rescore(t, e, vocab, seq.Tokens[:j], seq.Tokens[j])
				checked++
				if got := float64(seq.Logprobs[j]); math.Abs(got-want) > 0.15 {
					t.Fatalf("branch %d position %d: recorded logprob %.4f, the server's %.4f", b.Index, j, got, want)
				}
			}
		}
		sum := 0
		for _, m := range seq.Mask {
			sum += int(m)
		}
		if sum != trained {
			t.Fatalf("branch %d: %d trained positions, %d inside its turns", b.Index, sum, trained)
		}
	}
	if checked == 0 {
		t.Fatal("nothing re-scored")
	}
	// The run's sampler governs: the harness asked 0.1.
	var slots []struct {
		Params map[string]any `json:"params"`
	}
	e.MustCall(t, "/slots", nil, &slots)
	if temp := slots[0].Params["temperature"]; temp != 1.0 {
		t.Errorf("the server sampled at temperature %v, want the run's 1", temp)
	}
	raw, _ := json.Marshal(rec.Calls)
	t.Logf("calls: %s\nrewritten %d, unanchored %d, re-scored %d ids, %d sampled without a logprob", raw, rec.Rewritten, rec.Unanchored, checked, unscored)
}

// TestRealEngineLocalRender runs the same greedy conversation through a
// gateway rendering through llama-server and one rendering in-process from
// the model's own GGUF (inference.Config.LocalRender, copied out of the
// server's container): the records are the same, id for id, the local
// renders never differed from the server's, and once the shapes are
// checked the segments come from the learned text (no server render).
func TestRealEngineLocalRender(t *testing.T) { bothPrefills(t, realEngineLocalRender) }

func realEngineLocalRender(t *testing.T, prefill bool) {
	e := llamacpptest.Start(t, llamacpptest.Options{Slots: 1, Ctx: 8192, Threads: 1, PrefillAssistant: prefill})
	gguf := e.CopyFile(t, "/models/tiny-qwen3.gguf", t.TempDir())
	bias := llamacpptest.ToolCallBias(t, e, 8, 8, 2)
	run := func(local string) (gateway.SessionRecord, *inference.Client) {
		c, err := inference.Open(inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{e.URL}, Retries: -1, LocalRender: local})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		zero := 0.0
		gw, err := capture.New(c, capture.Options{Parser: "hermes", ReasoningParser: "qwen3",
			Sampling: inference.Sampling{Temperature: &zero, MaxTokens: 32, ExtraBody: map[string]any{"logit_bias": bias}}})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(capture.Handler(gw, builtin.FrontDoors()))
		defer hs.Close()
		var rec gateway.SessionRecord
		for i := range 3 {
			s, err := gw.Open(context.Background(), inference.EpisodeSpec{ID: "lr" + strconv.Itoa(i)})
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(hs.URL+"/s/"+s.ID()+"/v1", "List the files in the working directory.")
			h.extra = map[string]any{"model": "/models/tiny-qwen3.gguf"}
			for range 4 {
				if f := h.step(t); f != "tool_calls" {
					h.msgs = append(h.msgs, map[string]any{"role": "user", "content": "Continue, step " + strconv.Itoa(len(h.msgs)) + "."})
				}
			}
			if rec, err = s.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		return rec, c
	}
	counter := func(result string) float64 {
		return metrictest.Find(t, "rollout_inference_local_renders_total", "result", result).GetCounter().GetValue()
	}
	server, _ := run("")
	seg0, mis0 := counter("segment"), counter("mismatch")
	local, c := run(gguf)
	if c.LocalRenderOff() || counter("mismatch") != mis0 {
		t.Fatal("a local render differed from llama-server's")
	}
	if counter("segment") == seg0 {
		t.Fatal("no segment came from the learned text")
	}
	if len(server.Branches) != len(local.Branches) {
		t.Fatalf("%d branches through the server, %d rendering locally", len(server.Branches), len(local.Branches))
	}
	for i := range server.Branches {
		a, b := server.Branches[i].Sequence, local.Branches[i].Sequence
		if !slices.Equal(a.Tokens, b.Tokens) || !slices.Equal(a.Mask, b.Mask) || a.DriftTokens != b.DriftTokens {
			t.Fatalf("branch %d: %d ids (drift %d) through the server, %d (drift %d) rendering locally", i, len(a.Tokens), a.DriftTokens, len(b.Tokens), b.DriftTokens)
		}
	}
	t.Logf("last session: %d branches, %d ids in the first; segments from learned text %v, local renders %v, verified %v",
		len(local.Branches), len(local.Branches[0].Sequence.Tokens), counter("segment")-seg0, counter("local"), counter("verified"))
}
