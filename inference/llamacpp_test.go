package inference_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

// llamaPrompt is what llama.cpp itself would feed the model for msgs: the
// server's own /apply-template, tokenised by its /tokenize.
func llamaPrompt(t *testing.T, c *inference.Client, msgs []openai.ChatCompletionMessage, tools []openai.Tool) []int32 {
	t.Helper()
	ctx := context.Background()
	gp := true
	text, err := c.Pool().LlamaApplyTemplate(ctx, inference.CallOptions{}, &inference.LlamaTemplateRequest{Messages: msgs, Tools: tools, AddGenerationPrompt: &gp})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := c.Pool().LlamaTokenize(ctx, inference.CallOptions{}, &inference.LlamaTokenizeRequest{Content: text, AddSpecial: true, ParseSpecial: true})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// Tokens mode against llama-server's native routes is token-exact with the
// same drift as the vLLM backends, for every template (including the
// BOS-adding ones, whose template BOS llama.cpp drops).
func TestLlamaCppTokensModeExact(t *testing.T) {
	for _, fam := range sim.Families() {
		for _, thinking := range []bool{false, true} {
			srv := startSim(t, sim.Config{Engine: sim.EngineLlamaCpp, Family: fam, Reasoning: thinking, Seed: 7})
			for _, userMid := range []bool{false, true} {
				name := fmt.Sprintf("%s/think=%v/usermid=%v", fam, thinking, userMid)
				t.Run(name, func(t *testing.T) {
					c := openClient(t, inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{srv.URL}})
					spec := inference.EpisodeSpec{ID: "ll-" + strings.ReplaceAll(name, "/", "-"), Tools: []openai.Tool{terminalTool},
						Sampling: inference.Sampling{MaxTokens: 256}}
					turns, seq, msgs := runEpisode(t, c, spec, 3, userMid)
					checkSequence(t, seq, turns)
					if want := goldenDrift(fam, thinking, userMid); seq.DriftTokens != want {
						t.Fatalf("drift %d, want %d", seq.DriftTokens, want)
					}
					first := llamaPrompt(t, c, msgs[:2], spec.Tools)
					if !slices.Equal(seq.Tokens[:seq.PromptLen], first) {
						t.Fatalf("first prompt differs from the server's own render")
					}
				})
			}
		}
	}
	srv := startSim(t, sim.Config{Engine: sim.EngineLlamaCpp, Family: "hermes", Seed: 1})
	c := openClient(t, inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{srv.URL}})
	turns, seq, _ := runEpisode(t, c, inference.EpisodeSpec{ID: "routes", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 256}}, 2, false)
	checkSequence(t, seq, turns)
	st := srv.Stats().ByRoute
	// The turns' text comes from /completion's pieces: the one /detokenize
	// is the end-of-turn token's text, learned once per client.
	if st["POST /completion"] != 2 || st["POST /apply-template"] == 0 || st["POST /tokenize"] == 0 || st["POST /detokenize"] > 1 {
		t.Fatalf("routes used: %v", st)
	}
}

// A length cut (stop_type limit) and a stop word (stop_type word, whose
// tokens llama.cpp keeps in tokens but withholds from the probabilities)
// both leave an exact, aligned sequence.
func TestLlamaCppLengthAndStopWord(t *testing.T) {
	t.Run("limit", func(t *testing.T) {
		srv := startSim(t, sim.Config{Engine: sim.EngineLlamaCpp, Family: "hermes", ExactLength: true, Seed: 5})
		c := openClient(t, inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{srv.URL}})
		turns, seq, _ := runEpisode(t, c, inference.EpisodeSpec{ID: "len", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 7}}, 3, false)
		checkSequence(t, seq, turns)
		for i, tr := range turns {
			if tr.FinishReason != "length" || len(tr.CompletionIDs) != 7 {
				t.Fatalf("turn %d: finish %q with %d ids", i, tr.FinishReason, len(tr.CompletionIDs))
			}
		}
		if seq.DriftTokens != 0 {
			t.Fatalf("drift %d", seq.DriftTokens)
		}
	})
	t.Run("word", func(t *testing.T) {
		srv := startSim(t, sim.Config{Engine: sim.EngineLlamaCpp, Family: "hermes", Seed: 5})
		c := openClient(t, inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{srv.URL}})
		turns, seq, _ := runEpisode(t, c, inference.EpisodeSpec{ID: "word", Tools: []openai.Tool{terminalTool},
			Sampling: inference.Sampling{MaxTokens: 256, Stop: []string{"</tool_call>"}}}, 2, false)
		checkSequence(t, seq, turns)
		if turns[0].FinishReason != "stop" || strings.Contains(turns[0].Text, "</tool_call>") || !strings.Contains(turns[0].Text, "<tool_call>") {
			t.Fatalf("turn 0: finish %q text %q", turns[0].FinishReason, turns[0].Text)
		}
	})
}

// Every request states the whole sampler, neutral by default, in each
// backend's own names; the simulator records what reached it.
func TestNeutralSamplerReachesServer(t *testing.T) {
	vllmWant := map[string]any{"temperature": 1.0, "top_p": 1.0, "top_k": -1.0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
	llamaWant := map[string]any{"temperature": 1.0, "top_p": 1.0, "top_k": 0.0, "min_p": 0.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
		"frequency_penalty": 0.0, "typical_p": 1.0, "top_n_sigma": -1.0, "xtc_probability": 0.0, "dry_multiplier": 0.0, "mirostat": 0.0,
		"dynatemp_range": 0.0, "n_probs": 1.0, "post_sampling_probs": false}
	llamaChatWant := map[string]any{"temperature": 1.0, "top_p": 1.0, "top_k": -1.0, "min_p": 0.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
		"frequency_penalty": 0.0, "typical_p": 1.0, "top_n_sigma": -1.0, "xtc_probability": 0.0, "dry_multiplier": 0.0, "mirostat": 0.0, "dynatemp_range": 0.0}
	cases := []struct {
		backend, engine string
		chatIDs         bool
		want            map[string]any
	}{
		{inference.BackendVLLM, sim.EngineVLLM, false, vllmWant},
		{inference.BackendVLLMGenerate, sim.EngineVLLM, false, vllmWant},
		{inference.BackendSGLang, sim.EngineVLLM, false, vllmWant},
		{inference.BackendAtropos, sim.EngineVLLM, false, vllmWant},
		{inference.BackendChat, sim.EngineVLLM, true, vllmWant},
		{inference.BackendLlamaCpp, sim.EngineLlamaCpp, false, llamaWant},
		{inference.BackendChat, sim.EngineLlamaCpp, true, llamaChatWant},
	}
	for _, tc := range cases {
		t.Run(tc.backend+"@"+tc.engine, func(t *testing.T) {
			srv := startSim(t, sim.Config{Engine: tc.engine, Family: "hermes", Seed: 3, RecordSamplers: true})
			c := openClient(t, inference.Config{Backend: tc.backend, Endpoints: []string{srv.URL}, ChatTokenIDs: tc.chatIDs})
			ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: "s", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 64}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: "list files in /tmp"}}); err != nil {
				t.Fatal(err)
			}
			recs := srv.Samplers()
			if tc.backend == inference.BackendChat && tc.engine == sim.EngineLlamaCpp && len(recs) == 2 {
				// The chat turn was replayed at its seed on /completion
				// (a call the server could not parse, or ids inside a
				// UTF-8 character): with the same neutral sampler.
				for k, v := range llamaWant {
					if k == "top_k" {
						v = recs[0].Fields[k] // off: llama.cpp reads any top_k ≤ 0 as off
					}
					if got := recs[1].Fields[k]; got != v {
						t.Errorf("replay: %s: server got %v (%T), want %v", k, got, got, v)
					}
				}
				if recs[0].Fields["seed"] == nil || recs[1].Fields["seed"] != recs[0].Fields["seed"] {
					t.Errorf("replay seed %v, chat seed %v", recs[1].Fields["seed"], recs[0].Fields["seed"])
				}
				recs = recs[:1]
			}
			if len(recs) != 1 {
				t.Fatalf("%d generation requests recorded", len(recs))
			}
			got := recs[0].Fields
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: server got %v (%T), want %v", k, got[k], got[k], v)
				}
			}
			if tc.engine == sim.EngineVLLM {
				if _, ok := got["repeat_penalty"]; ok {
					t.Errorf("llama.cpp field sent to a vLLM server: %v", got)
				}
			}
		})
	}
}

// capture records slog warnings.
type capture struct {
	mu   sync.Mutex
	msgs []string
}

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }
func (c *capture) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return nil
	}
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	c.mu.Lock()
	c.msgs = append(c.msgs, b.String())
	c.mu.Unlock()
	return nil
}
func (c *capture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *capture) WithGroup(string) slog.Handler      { return c }
func (c *capture) count(sub string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// The effective sampler is reported for the manifest; a non-neutral config
// is recorded as such and warned about once per client (run); llama.cpp's
// own view (generation_settings) is recorded and agrees with what was sent.
func TestSamplerReportAndWarnings(t *testing.T) {
	topP := 0.9
	cfg := inference.Config{Backend: inference.BackendLlamaCpp, Sampling: inference.Sampling{TopP: &topP}}
	r := inference.EffectiveSampling(cfg, inference.Sampling{})
	if r.Neutral || !slices.Equal(r.NonNeutral, []string{"top_p"}) || r.Fields["top_p"] != 0.9 || r.Fields["top_k"] != 0 || r.Fields["temperature"] != 1.0 {
		t.Fatalf("report: %+v", r)
	}
	temp := 0.7
	r = inference.EffectiveSampling(inference.Config{Backend: inference.BackendVLLM}, inference.Sampling{Temperature: &temp})
	if !r.Neutral || r.Fields["temperature"] != 0.7 || r.Fields["top_k"] != -1 || r.Fields["repetition_penalty"] != 1.0 {
		t.Fatalf("report: %+v", r)
	}

	srv := startSim(t, sim.Config{Engine: sim.EngineLlamaCpp, Family: "hermes", Seed: 3})
	log := &capture{}
	cfg.Endpoints, cfg.Logger = []string{srv.URL}, slog.New(log)
	c := openClient(t, cfg)
	for i := range 2 {
		ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: fmt.Sprint("w", i), Sampling: inference.Sampling{MaxTokens: 16}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := log.count("sampler is not neutral"); n != 1 {
		t.Fatalf("%d non-neutral warnings, want 1: %v", n, log.msgs)
	}
	rep := c.SamplerReport(inference.Sampling{})
	if rep.Server == nil || rep.Server["top_p"] != 0.9 || rep.Server["top_k"] != 0.0 || len(rep.Mismatch) != 0 {
		t.Fatalf("server view %v, mismatch %v", rep.Server, rep.Mismatch)
	}
	if log.count("differs") != 0 {
		t.Fatalf("mismatch warned: %v", log.msgs)
	}
}

// A server that applies a sampler other than the one sent is recorded and
// warned about.
func TestServerSamplerMismatch(t *testing.T) {
	srv, _ := fakeServer(t, map[string]func(http.ResponseWriter, []byte){
		"GET /v1/models":       reply(`{"object":"list","data":[{"id":"m","object":"model","owned_by":"llamacpp","meta":{"n_ctx":4096,"n_ctx_train":4096}}]}`),
		"GET /props":           reply(`{"default_generation_settings":{"n_ctx":1024},"total_slots":4}`),
		"POST /apply-template": reply(`{"prompt":"<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"}`),
		"POST /tokenize":       reply(`{"tokens":[1,2,3]}`),
		"POST /completion": reply(`{"content":"a","tokens":[5,9],"stop_type":"eos","stopping_word":"","truncated":false,"tokens_predicted":2,
			"completion_probabilities":[{"id":5,"token":"a","logprob":-0.5,"top_logprobs":[]},{"id":9,"token":"<|im_end|>","logprob":-0.1,"top_logprobs":[]}],
			"generation_settings":{"temperature":1.0,"top_k":40,"top_p":1.0,"min_p":0.0,"n_ctx":1024}}`),
	})
	log := &capture{}
	c := openClient(t, inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{srv.URL}, Logger: slog.New(log)})
	ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: "mm", Sampling: inference.Sampling{MaxTokens: 8}})
	if err != nil {
		t.Fatal(err)
	}
	// The turn's closing probe renders too; the fake answers every render
	// alike, so the probe fails — the server view is recorded before that.
	_, _ = ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: "q"}})
	_, mm := c.ServerSampler()
	if len(mm) != 1 || !strings.Contains(mm[0], "top_k") {
		t.Fatalf("mismatch %v", mm)
	}
	if log.count("differs") != 1 {
		t.Fatalf("warnings %v", log.msgs)
	}
}

// Chat mode against llama.cpp: ids from the logprob entries' "id", the
// prompt ids from the server's own render, top_logprobs ≥ 1 sent.
func TestLlamaCppChatTokenIDs(t *testing.T) {
	srv := startSim(t, sim.Config{Engine: sim.EngineLlamaCpp, Family: "hermes", Seed: 2, RecordSamplers: true})
	c := openClient(t, inference.Config{Backend: inference.BackendChat, Endpoints: []string{srv.URL}, ChatTokenIDs: true})
	ctx := context.Background()
	ep, err := c.Start(ctx, inference.EpisodeSpec{ID: "lc", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 256}})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "list files in /tmp"}}
	var turns []inference.Turn
	for i := 0; i < 3; i++ {
		c.SetVersion(int64(10 + i)) // a trainer's weight update between turns
		tr, err := ep.Generate(ctx, msgs)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Version != int64(10+i) {
			t.Fatalf("turn %d: version %d, want %d", i, tr.Version, 10+i)
		}
		if len(tr.CompletionIDs) == 0 || len(tr.CompletionIDs) != len(tr.Logprobs) {
			t.Fatalf("turn %d: %d ids, %d logprobs", i, len(tr.CompletionIDs), len(tr.Logprobs))
		}
		if i == 0 {
			if want := llamaPrompt(t, c, msgs, []openai.Tool{terminalTool}); tr.PromptTokens != len(want) {
				t.Fatalf("prompt tokens %d, server render %d", tr.PromptTokens, len(want))
			}
		}
		turns = append(turns, tr)
		msgs = append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: tr.Content, ToolCalls: tr.ToolCalls})
		if len(tr.ToolCalls) == 0 {
			break
		}
		for _, tc := range tr.ToolCalls {
			msgs = append(msgs, openai.ChatCompletionMessage{Role: "tool", ToolCallID: tc.ID, Content: "ok"})
		}
	}
	seq, err := ep.Finish(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(seq.Tokens) == 0 || len(seq.Mask) != len(seq.Tokens) || len(seq.Logprobs) != len(seq.Tokens) || len(seq.TurnStarts) != len(turns) {
		t.Fatalf("sequence: %d tokens, %d mask, %d logprobs, %d turns", len(seq.Tokens), len(seq.Mask), len(seq.Logprobs), len(seq.TurnStarts))
	}
	for i, ts := range seq.TurnStarts {
		if !slices.Equal(seq.Tokens[ts:ts+len(turns[i].CompletionIDs)], turns[i].CompletionIDs) {
			t.Fatalf("turn %d ids not verbatim", i)
		}
	}
	// Chat mode stamps per-token versions too: every id of a turn carries
	// the version it was admitted under, the template ids before it the
	// version in force when they were appended.
	if len(seq.Versions) != len(seq.Tokens) {
		t.Fatalf("%d versions for %d tokens", len(seq.Versions), len(seq.Tokens))
	}
	for i, ts := range seq.TurnStarts {
		for k := ts; k < ts+len(turns[i].CompletionIDs); k++ {
			if seq.Versions[k] != turns[i].Version {
				t.Fatalf("turn %d token %d: version %d, want %d", i, k, seq.Versions[k], turns[i].Version)
			}
		}
		if from := ts - 1; from >= 0 && seq.Versions[from] != turns[i].Version {
			t.Fatalf("turn %d: the template id before it has version %d, want %d", i, seq.Versions[from], turns[i].Version)
		}
	}
	if n := srv.Stats().ByRoute["POST /apply-template"]; n != int64(len(turns)+1) {
		t.Fatalf("%d prompt renders for %d turns (+1 by the test)", n, len(turns))
	}
}

// No silent empties: chat_token_ids against a server that returns no ids
// is an error of its own class, never a turn with 0 tokens.
func TestChatTokenIDsMissingIsAnError(t *testing.T) {
	srv, _ := fakeServer(t, map[string]func(http.ResponseWriter, []byte){
		"GET /v1/models":            reply(`{"data":[{"id":"m","max_model_len":4096}]}`),
		"POST /v1/chat/completions": reply(`{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`),
	})
	c := openClient(t, inference.Config{Backend: inference.BackendChat, Endpoints: []string{srv.URL}, ChatTokenIDs: true})
	ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: "empty", Sampling: inference.Sampling{MaxTokens: 8}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: "q"}})
	if !errors.Is(err, inference.ErrNoTokenIDs) || !errors.Is(err, inference.ErrInfra) {
		t.Fatalf("want ErrNoTokenIDs (infra), got %v", err)
	}
}

// llama.cpp's context: one slot's share (/props), not the whole -c; an
// over-long prompt's HTTP 400 exceed_context_size_error is ErrContextLength.
func TestLlamaCppContext(t *testing.T) {
	srv := startSim(t, sim.Config{Engine: sim.EngineLlamaCpp, Family: "hermes", MaxModelLen: 700, Slots: 4})
	t.Run("preflight per slot", func(t *testing.T) {
		c := openClient(t, inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{srv.URL}})
		ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: "pf", Sampling: inference.Sampling{MaxTokens: 600}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: strings.Repeat("x", 200)}})
		if !errors.Is(err, inference.ErrContextLength) || !strings.Contains(err.Error(), "max_model_len 700") {
			t.Fatalf("want the per-slot guard (700, not 2800), got %v", err)
		}
		if n := srv.Stats().ByRoute["POST /completion"]; n != 0 {
			t.Fatalf("%d completions sent past the guard", n)
		}
	})
	t.Run("server 400", func(t *testing.T) {
		c := openClient(t, inference.Config{Backend: inference.BackendChat, Endpoints: []string{srv.URL}, BreakerFailures: 1})
		ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: "over"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: strings.Repeat("y", 900)}})
		if !errors.Is(err, inference.ErrContextLength) || !errors.Is(err, inference.ErrRequest) || errors.Is(err, inference.ErrInfra) {
			t.Fatalf("want ErrContextLength, got %v", err)
		}
	})
}

// A history the server's template cannot render (tool-call arguments that
// are not JSON) is a content error: ErrRequest + ErrContent, sent once,
// and the endpoint stays in the pool.
func TestTemplateContentErrorNotRetried(t *testing.T) {
	bad := []openai.ChatCompletionMessage{
		{Role: "user", Content: "list files"},
		{Role: "assistant", ToolCalls: []openai.ToolCall{{ID: "call_1", Type: "function", Function: openai.FunctionCall{Name: "terminal", Arguments: `{"command": "ls`}}}},
		{Role: "tool", ToolCallID: "call_1", Content: "a b"},
	}
	for _, engine := range []string{sim.EngineLlamaCpp, sim.EngineVLLM} {
		t.Run(engine, func(t *testing.T) {
			srv := startSim(t, sim.Config{Engine: engine, Family: "hermes", Seed: 1})
			c := openClient(t, inference.Config{Backend: inference.BackendChat, Endpoints: []string{srv.URL}, Retries: 3, BackoffBase: time.Millisecond, BreakerFailures: 1})
			ctx := context.Background()
			ep, err := c.Start(ctx, inference.EpisodeSpec{ID: "tmpl", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 64}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = ep.Generate(ctx, bad)
			if !errors.Is(err, inference.ErrRequest) || !errors.Is(err, inference.ErrContent) || errors.Is(err, inference.ErrInfra) {
				t.Fatalf("want ErrRequest+ErrContent, got %v", err)
			}
			if n := srv.Stats().ByRoute["POST /v1/chat/completions"]; n != 1 {
				t.Fatalf("sent %d times, want 1 (no retry)", n)
			}
			// Not held against the endpoint: the next request is served.
			if _, err := ep.Generate(ctx, bad[:1]); err != nil {
				t.Fatalf("endpoint ejected after a content error: %v", err)
			}
		})
	}
}

// sampler_fields: openai states only the fields the OpenAI API knows, and
// the report lists only those.
func TestSamplerFieldsOpenAI(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes", Seed: 3, RecordSamplers: true})
	cfg := inference.Config{Backend: inference.BackendChat, Endpoints: []string{srv.URL}, SamplerFields: inference.SamplerFieldsOpenAI}
	c := openClient(t, cfg)
	ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: "oa", Sampling: inference.Sampling{MaxTokens: 16}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}}); err != nil {
		t.Fatal(err)
	}
	got := srv.Samplers()[0].Fields
	for _, k := range []string{"top_k", "min_p", "repetition_penalty"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s sent with sampler_fields openai: %v", k, got)
		}
	}
	if got["temperature"] != 1.0 || got["top_p"] != 1.0 || got["presence_penalty"] != 0.0 {
		t.Fatalf("OpenAI fields not stated: %v", got)
	}
	r := c.SamplerReport(inference.Sampling{})
	if _, ok := r.Fields["top_k"]; ok || len(r.Fields) != 4 {
		t.Fatalf("report fields %v", r.Fields)
	}
	if _, err := inference.Open(inference.Config{Backend: inference.BackendChat, Endpoints: []string{srv.URL}, SamplerFields: "all"}); err == nil {
		t.Fatal("unknown sampler_fields accepted")
	}
}

// llama.cpp gives no probability to a token that leaves the text inside a
// UTF-8 character: tokens mode keeps such ids verbatim but untrained
// (mask 0, placeholder 1.0, counted in Unscored); chat mode, whose ids come
// only from the logprob entries, fails with ErrNoTokenIDs instead of
// returning a sequence with ids missing.
func TestLlamaCppIncompleteUTF8(t *testing.T) {
	script := sim.Script{Match: "count them", Steps: []sim.Step{{Final: "Zählung: drei — fertig ✓"}}}
	srv := startSim(t, sim.Config{Engine: sim.EngineLlamaCpp, Family: "hermes", Seed: 1, Scripts: []sim.Script{script}})
	c := openClient(t, inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{srv.URL}})
	turns, seq, _ := runEpisode(t, c, inference.EpisodeSpec{ID: "utf8", Sampling: inference.Sampling{MaxTokens: 256}}, 1, false)
	tr := turns[0]
	if !strings.Contains(tr.Text, "Zählung: drei — fertig ✓") {
		t.Fatalf("text %q", tr.Text)
	}
	// Entries were withheld: the text came from /detokenize.
	if n := srv.Stats().ByRoute["POST /detokenize"]; n == 0 {
		t.Fatal("text of a turn with withheld entries decoded without /detokenize")
	}
	// ä: 2 bytes, —: 3, ✓: 3 → 1 + 2 + 2 ids without a probability.
	if seq.Unscored != 5 {
		t.Fatalf("unscored %d, want 5", seq.Unscored)
	}
	ts := seq.TurnStarts[0]
	if !slices.Equal(seq.Tokens[ts:ts+len(tr.CompletionIDs)], tr.CompletionIDs) {
		t.Fatal("sampled ids not verbatim")
	}
	trained := 0
	for i := range tr.CompletionIDs {
		m, lp := seq.Mask[ts+i], seq.Logprobs[ts+i]
		if lp != tr.Logprobs[i] {
			t.Fatalf("position %d: logprob %v, turn says %v", i, lp, tr.Logprobs[i])
		}
		if m == 1 {
			trained++
			if lp > 0 {
				t.Fatalf("trained position %d has the placeholder", i)
			}
		} else if lp != 1.0 {
			t.Fatalf("untrained sampled position %d has logprob %v", i, lp)
		}
	}
	if trained+seq.Unscored != len(tr.CompletionIDs) || seq.DriftTokens != 0 {
		t.Fatalf("%d trained + %d unscored of %d; drift %d", trained, seq.Unscored, len(tr.CompletionIDs), seq.DriftTokens)
	}

	// Chat mode: the logprob entries name only the scored ids; the turn is
	// replayed at its seed on /completion, which returns every id, and the
	// replay agrees with the ids the answer named.
	chat := openClient(t, inference.Config{Backend: inference.BackendChat, Endpoints: []string{srv.URL}, ChatTokenIDs: true})
	before := srv.Stats().ByRoute["POST /completion"]
	ctx := context.Background()
	ep, err := chat.Start(ctx, inference.EpisodeSpec{ID: "utf8-chat", Sampling: inference.Sampling{MaxTokens: 256}})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "list files in /tmp and count them"}}
	ct, err := ep.Generate(ctx, msgs)
	if err != nil {
		t.Fatalf("chat turn with ids inside UTF-8 characters: %v", err)
	}
	if !strings.Contains(ct.Content, "Zählung: drei — fertig ✓") || ct.Replay != inference.ReplayIDs {
		t.Fatalf("chat turn: content %q, replay %q", ct.Content, ct.Replay)
	}
	// The replay, and the scoring pass of its withheld ids, which the
	// simulator refuses (HTTP 400: it serves one prompt per request).
	if n := srv.Stats().ByRoute["POST /completion"] - before; n != 2 {
		t.Fatalf("%d requests on /completion, want 2 (replay, refused scoring pass)", n)
	}
	if !slices.Equal(ct.CompletionIDs, tr.CompletionIDs) || len(ct.Logprobs) != len(ct.CompletionIDs) {
		t.Fatalf("chat ids %v (%d logprobs), tokens-mode ids %v", ct.CompletionIDs, len(ct.Logprobs), tr.CompletionIDs)
	}
	cseq, err := ep.Finish(ctx, append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: ct.Content}))
	if err != nil {
		t.Fatal(err)
	}
	if cseq.Unscored != 5 || len(cseq.Mask) != len(cseq.Tokens) {
		t.Fatalf("chat sequence: unscored %d (want 5), %d mask for %d tokens", cseq.Unscored, len(cseq.Mask), len(cseq.Tokens))
	}
	cts := cseq.TurnStarts[0]
	for i := range ct.CompletionIDs {
		if m := cseq.Mask[cts+i]; (m == 0) != (ct.Logprobs[i] == 1.0) {
			t.Fatalf("chat position %d: mask %d, logprob %v", i, m, ct.Logprobs[i])
		}
	}
}

// Every chat request to llama.cpp carries an explicit seed: distinct per
// rollout and per turn, the same for the same rollout and turn, and mixed
// with a configured seed.
func TestLlamaCppChatSeed(t *testing.T) {
	var mu sync.Mutex
	var seeds []float64
	srv, _ := fakeServer(t, map[string]func(http.ResponseWriter, []byte){
		"GET /v1/models": reply(`{"data":[{"id":"m","meta":{"n_ctx":4096}}],"models":[{"name":"m"}]}`),
		"GET /props":     reply(`{"default_generation_settings":{"n_ctx":4096},"total_slots":1}`),
		"POST /v1/chat/completions": func(w http.ResponseWriter, body []byte) {
			var req map[string]any
			if err := json.Unmarshal(body, &req); err != nil {
				t.Error(err)
			}
			mu.Lock()
			seed, _ := req["seed"].(float64)
			seeds = append(seeds, seed)
			mu.Unlock()
			reply(`{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)(w, body)
		},
	})
	c := openClient(t, inference.Config{Backend: inference.BackendChat, Endpoints: []string{srv.URL}})
	gen := func(id string, turns int, seed *int64) {
		ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: id, Sampling: inference.Sampling{MaxTokens: 8, Seed: seed}})
		if err != nil {
			t.Fatal(err)
		}
		for range turns {
			if _, err := ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: "q"}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	seven := int64(7)
	gen("r0", 2, nil)
	gen("r1", 1, nil)
	gen("r0", 1, nil)
	gen("r0", 1, &seven)
	if len(seeds) != 5 {
		t.Fatalf("%d requests", len(seeds))
	}
	for i, s := range seeds {
		if s <= 0 || s >= 1<<31 {
			t.Fatalf("request %d: seed %v (want explicit, in [1, 2^31))", i, s)
		}
	}
	if seeds[0] == seeds[1] || seeds[0] == seeds[2] || seeds[0] != seeds[3] || seeds[0] == seeds[4] {
		t.Fatalf("seeds %v: want r0/t1 ≠ r0/t2, r0 ≠ r1, r0/t1 repeatable, a configured seed mixed in", seeds)
	}
}

// llama.cpp's HTTP 500 for a tool call its template-derived parser cannot
// read is the model's output, not a server failure: it is not retried, the
// turn is replayed at its seed on /completion and handed to the loop as raw
// text with its ids.
func TestLlamaCppServerParseFailureReplayed(t *testing.T) {
	script := sim.Script{Match: "cut", Steps: []sim.Step{{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls -la /tmp && echo a long command line"}}}}}}
	srv := startSim(t, sim.Config{Engine: sim.EngineLlamaCpp, Family: "hermes", Seed: 3, Scripts: []sim.Script{script}})
	const cutAt = 30 // inside the call's arguments
	for _, ids := range []bool{true, false} {
		c := openClient(t, inference.Config{Backend: inference.BackendChat, Endpoints: []string{srv.URL}, ChatTokenIDs: ids})
		before := srv.Stats().ByRoute["POST /v1/chat/completions"]
		ctx := context.Background()
		ep, err := c.Start(ctx, inference.EpisodeSpec{ID: fmt.Sprint("cut-", ids), Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: cutAt}})
		if err != nil {
			t.Fatal(err)
		}
		msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "cut this call"}}
		tr, err := ep.Generate(ctx, msgs)
		if err != nil {
			t.Fatalf("chat_token_ids %v: %v", ids, err)
		}
		if n := srv.Stats().ByRoute["POST /v1/chat/completions"] - before; n != 1 {
			t.Fatalf("the 500 was sent %d times, want once (not retried)", n)
		}
		if tr.Replay != inference.ReplayServerParse || !tr.Parsed || len(tr.ToolCalls) != 0 || !strings.Contains(tr.Content, "<tool_call>") || tr.FinishReason != "length" {
			t.Fatalf("turn: replay %q, parsed %v, %d calls, content %q, finish %q", tr.Replay, tr.Parsed, len(tr.ToolCalls), tr.Content, tr.FinishReason)
		}
		if !ids {
			if tr.CompletionIDs != nil {
				t.Fatalf("ids without chat_token_ids: %v", tr.CompletionIDs)
			}
			continue
		}
		if len(tr.CompletionIDs) != cutAt || len(tr.Logprobs) != cutAt {
			t.Fatalf("%d ids, %d logprobs; want %d", len(tr.CompletionIDs), len(tr.Logprobs), cutAt)
		}
		text, err := c.Pool().Detokenize(ctx, inference.CallOptions{}, "", tr.CompletionIDs)
		if err != nil || text != tr.Content {
			t.Fatalf("ids decode to %q (%v), content %q", text, err, tr.Content)
		}
		seq, err := ep.Finish(ctx, append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: tr.Content}))
		if err != nil {
			t.Fatal(err)
		}
		if ts := seq.TurnStarts[0]; !slices.Equal(seq.Tokens[ts:], tr.CompletionIDs) || seq.PromptLen != ts {
			t.Fatalf("sequence does not end with the replayed ids")
		}
	}
}

// A replay that does not reproduce the ids the chat answer named is
// repeated once; when neither reproduces them, the last replay (every id,
// its logprobs, its raw text) is the turn, never a mixture of the two.
func TestLlamaCppReplayMismatchReplaces(t *testing.T) {
	srv, rec := fakeServer(t, map[string]func(http.ResponseWriter, []byte){
		"GET /v1/models":       reply(`{"data":[{"id":"m","meta":{"n_ctx":4096}}],"models":[{"name":"m"}]}`),
		"GET /props":           reply(`{"default_generation_settings":{"n_ctx":4096},"total_slots":1}`),
		"POST /apply-template": reply(`{"prompt":"p"}`),
		"POST /tokenize":       reply(`{"tokens":[1,2]}`),
		"POST /v1/chat/completions": reply(`{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"ab"},"finish_reason":"stop",
			"logprobs":{"content":[{"id":5,"token":"a","logprob":-1,"top_logprobs":[]},{"id":6,"token":"b","logprob":-1,"top_logprobs":[]}]}}],"usage":{"prompt_tokens":2,"completion_tokens":3}}`),
		"POST /completion": reply(`{"content":"xb","tokens":[9,9,6],"stop_type":"eos","completion_probabilities":[{"id":9,"logprob":-1},{"id":9,"logprob":-2},{"id":6,"logprob":-3}]}`),
		"POST /detokenize": reply(`{"content":"xyb"}`),
	})
	c := openClient(t, inference.Config{Backend: inference.BackendChat, Endpoints: []string{srv.URL}, ChatTokenIDs: true})
	ep, err := c.Start(context.Background(), inference.EpisodeSpec{ID: "mm", Sampling: inference.Sampling{MaxTokens: 8}})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := ep.Generate(context.Background(), []openai.ChatCompletionMessage{{Role: "user", Content: "q"}})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Replay != inference.ReplayReplaced || tr.Content != "xyb" || len(tr.ToolCalls) != 0 ||
		!slices.Equal(tr.CompletionIDs, []int32{9, 9, 6}) || !slices.Equal(tr.Logprobs, []float32{-1, -2, -3}) {
		t.Fatalf("turn: replay %q, content %q, ids %v, logprobs %v", tr.Replay, tr.Content, tr.CompletionIDs, tr.Logprobs)
	}
	if n := rec.count("/completion"); n != 2 {
		t.Fatalf("%d replays, want 2", n)
	}
	seq, err := ep.Finish(context.Background(), nil)
	if err != nil || !slices.Equal(seq.Tokens, []int32{1, 2, 9, 9, 6}) || seq.PromptLen != 2 {
		t.Fatalf("sequence %v (prompt %d), %v", seq.Tokens, seq.PromptLen, err)
	}
}

// A llama-server started without --no-prefill-assistant (its default)
// renders a trailing assistant message as a prefill; the tokens backend
// never renders one, so episodes work the same against it: the second
// turn's sequence is the first turn's plus the segment, token for token
// what a server started with the flag gives.
func TestLlamaCppPrefillAssistantDefault(t *testing.T) {
	for _, fam := range sim.Families() {
		t.Run(fam, func(t *testing.T) {
			var seqs [2]inference.Sequence
			for i, prefill := range []bool{false, true} {
				srv := startSim(t, sim.Config{Engine: sim.EngineLlamaCpp, Family: fam, Seed: 1, PrefillAssistant: prefill})
				c := openClient(t, inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{srv.URL}})
				ctx := context.Background()
				if err := c.CheckTemplate(ctx, inference.Sampling{MaxTokens: 32}); err != nil {
					t.Fatalf("prefill %v: start check: %v", prefill, err)
				}
				ep, err := c.Start(ctx, inference.EpisodeSpec{ID: "prefill", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 32}})
				if err != nil {
					t.Fatal(err)
				}
				msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "list files"}}
				turn, err := ep.Generate(ctx, msgs)
				if err != nil {
					t.Fatalf("prefill %v: turn 1: %v", prefill, err)
				}
				msgs = append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: turn.Text}, openai.ChatCompletionMessage{Role: "user", Content: "again"})
				if _, err := ep.Generate(ctx, msgs); err != nil {
					t.Fatalf("prefill %v: turn 2: %v", prefill, err)
				}
				if seqs[i], err = ep.Finish(ctx, nil); err != nil {
					t.Fatalf("prefill %v: finish: %v", prefill, err)
				}
			}
			if !slices.Equal(seqs[0].Tokens, seqs[1].Tokens) || !slices.Equal(seqs[0].Mask, seqs[1].Mask) {
				t.Fatalf("sequences differ with and without prefill:\n%v\n%v", seqs[0].Tokens, seqs[1].Tokens)
			}
		})
	}
}

// The tokens-mode start check refuses a template whose tool-calling turns
// close differently from its other turns (Llama 3.1's ipython mode:
// <|eom_id|> after a call), on every backend and whether or not
// llama-server prefills, where the per-turn cut has no base render to
// catch it.
func TestCheckTemplateRefusesMixedClosings(t *testing.T) {
	kw := map[string]any{"builtin_tools": []any{"brave_search"}}
	for _, tc := range []struct {
		engine, backend string
		prefill         bool
	}{
		{sim.EngineVLLM, inference.BackendVLLM, false},
		{sim.EngineLlamaCpp, inference.BackendLlamaCpp, false},
		{sim.EngineLlamaCpp, inference.BackendLlamaCpp, true},
	} {
		srv := startSim(t, sim.Config{Engine: tc.engine, Family: "llama3_json", Seed: 1, PrefillAssistant: tc.prefill})
		c := openClient(t, inference.Config{Backend: tc.backend, Endpoints: []string{srv.URL}})
		ctx := context.Background()
		err := c.CheckTemplate(ctx, inference.Sampling{MaxTokens: 16, ChatTemplateKwargs: kw})
		if !errors.Is(err, inference.ErrTemplate) || !errors.Is(err, inference.ErrRequest) || errors.Is(err, inference.ErrInfra) {
			t.Errorf("%s prefill %v: %v, want a template error", tc.backend, tc.prefill, err)
		}
		if err := c.CheckTemplate(ctx, inference.Sampling{MaxTokens: 16}); err != nil {
			t.Errorf("%s prefill %v without builtin_tools: %v", tc.backend, tc.prefill, err)
		}
	}
}

// On llama.cpp a turn's text and its tool calls' token spans come from the
// pieces /completion spells for each id: no /detokenize request, and the
// same spans as the server's detokenizer gives (the vLLM flavour of the
// same script, whose spans are found by bisection over /detokenize).
func TestLlamaCppTextAndSpansFromPieces(t *testing.T) {
	type spanner interface {
		TokenSpans(ctx context.Context, ids []int32, text string, ranges []inference.ByteRange) ([]inference.TokenSpan, error)
	}
	script := sim.Script{Match: "count them", Steps: []sim.Step{{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls /tmp | wc -l"}}}}}}
	ctx := context.Background()
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "list files in /tmp and count them"}}
	spans := map[string][]inference.TokenSpan{}
	for _, c := range []struct{ engine, backend string }{{sim.EngineLlamaCpp, inference.BackendLlamaCpp}, {sim.EngineVLLM, inference.BackendVLLM}} {
		srv := startSim(t, sim.Config{Engine: c.engine, Family: "hermes", Seed: 1, Scripts: []sim.Script{script}})
		pol := openClient(t, inference.Config{Backend: c.backend, Endpoints: []string{srv.URL}})
		ep, err := pol.Start(ctx, inference.EpisodeSpec{ID: "pieces-" + c.backend, Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 256}})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := ep.Generate(ctx, msgs)
		if err != nil {
			t.Fatal(err)
		}
		open, end := strings.Index(tr.Text, "<tool_call>"), strings.Index(tr.Text, "</tool_call>")
		if open < 0 || end < open {
			t.Fatalf("%s: text %q has no tool call", c.backend, tr.Text)
		}
		end += len("</tool_call>")
		ranges := []inference.ByteRange{{Start: open, End: end}, {Start: open + len("<tool_call>"), End: end - len("</tool_call>")}, {Start: 0, End: len(tr.Text)}}
		got, err := ep.(spanner).TokenSpans(ctx, tr.CompletionIDs, tr.Text, ranges)
		if err != nil {
			t.Fatal(err)
		}
		spans[c.backend] = got
		detok := srv.Stats().ByRoute["POST /detokenize"]
		if c.backend == inference.BackendLlamaCpp && detok != 0 {
			t.Fatalf("llamacpp: %d /detokenize requests, want none (text and spans from the pieces)", detok)
		}
		if c.backend == inference.BackendVLLM && detok == 0 {
			t.Fatal("vllm: spans placed without /detokenize: the comparison is void")
		}
	}
	if l, v := spans[inference.BackendLlamaCpp], spans[inference.BackendVLLM]; !slices.Equal(l, v) {
		t.Fatalf("spans from pieces %v, from the detokenizer %v", l, v)
	}
	for _, sp := range spans[inference.BackendLlamaCpp] {
		if sp.Start < 0 {
			t.Fatalf("a span was not placed: %v", spans[inference.BackendLlamaCpp])
		}
	}
}
