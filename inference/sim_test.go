package inference_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/simtest"
	"github.com/rollout-rl/rollout/parsers"
)

var terminalTool = openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
	Name:        "terminal",
	Description: "run a shell command",
	Parameters:  map[string]any{"type": "object", "properties": map[string]any{"command": map[string]any{"type": "string"}}},
}}

var startSim = simtest.Start

func openClient(t testing.TB, cfg inference.Config) *inference.Client {
	t.Helper()
	c, err := inference.Open(cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// checkSequence asserts the structural invariants of a tokens-mode
// sequence: aligned slices, mask 1 exactly on the sampled ids of each turn,
// logprobs equal to the sampled ones there and 1.0 elsewhere.
func checkSequence(t *testing.T, seq inference.Sequence, turns []inference.Turn) {
	t.Helper()
	n := len(seq.Tokens)
	if len(seq.Mask) != n || len(seq.Logprobs) != n {
		t.Fatalf("misaligned: %d tokens, %d mask, %d logprobs", n, len(seq.Mask), len(seq.Logprobs))
	}
	if len(seq.TurnStarts) != len(turns) {
		t.Fatalf("%d turn starts for %d turns", len(seq.TurnStarts), len(turns))
	}
	want := make([]int8, n)
	for i, ts := range seq.TurnStarts {
		tr := turns[i]
		if len(tr.CompletionIDs) != len(tr.Logprobs) || len(tr.CompletionIDs) == 0 {
			t.Fatalf("turn %d: %d ids, %d logprobs", i, len(tr.CompletionIDs), len(tr.Logprobs))
		}
		if ts+len(tr.CompletionIDs) > n {
			t.Fatalf("turn %d overruns the sequence", i)
		}
		if !slices.Equal(seq.Tokens[ts:ts+len(tr.CompletionIDs)], tr.CompletionIDs) {
			t.Fatalf("turn %d: sampled ids not verbatim in the sequence", i)
		}
		if !slices.Equal(seq.Logprobs[ts:ts+len(tr.CompletionIDs)], tr.Logprobs) {
			t.Fatalf("turn %d: logprobs not aligned 1:1", i)
		}
		for j := range tr.CompletionIDs {
			want[ts+j] = 1
		}
		if i == 0 && ts != seq.PromptLen {
			t.Fatalf("first turn starts at %d, prompt is %d tokens", ts, seq.PromptLen)
		}
	}
	if !slices.Equal(seq.Mask, want) {
		t.Fatalf("mask does not cover exactly the sampled ids")
	}
	for i, m := range seq.Mask {
		if m == 0 && seq.Logprobs[i] != 1.0 {
			t.Fatalf("untrained position %d has logprob %v, want 1.0", i, seq.Logprobs[i])
		}
	}
}

// runEpisode plays a tool loop: every turn's raw text becomes the
// assistant message (so re-rendering reproduces it where the template
// allows), followed by a tool result; after `turns` turns a user message
// is added too, to trigger Qwen3's think stripping.
func runEpisode(t *testing.T, pol inference.Policy, spec inference.EpisodeSpec, turns int, userMid bool) ([]inference.Turn, inference.Sequence, []openai.ChatCompletionMessage) {
	t.Helper()
	out, seq, msgs, err := episode(pol, spec, turns, userMid)
	if err != nil {
		t.Fatal(err)
	}
	return out, seq, msgs
}

// episode is runEpisode's conversation without a *testing.T (for
// goroutines): the turns, the sequence and the messages, or the first
// error.
func episode(pol inference.Policy, spec inference.EpisodeSpec, turns int, userMid bool) ([]inference.Turn, inference.Sequence, []openai.ChatCompletionMessage, error) {
	ctx := context.Background()
	ep, err := pol.Start(ctx, spec)
	if err != nil {
		return nil, inference.Sequence{}, nil, fmt.Errorf("start: %w", err)
	}
	msgs := []openai.ChatCompletionMessage{
		{Role: "system", Content: "You are a careful agent."},
		{Role: "user", Content: "list files in /tmp and count them"},
	}
	var out []inference.Turn
	for i := 0; i < turns; i++ {
		tr, err := ep.Generate(ctx, msgs)
		if err != nil {
			return out, inference.Sequence{}, msgs, fmt.Errorf("turn %d: %w", i+1, err)
		}
		if tr.Parsed {
			return out, inference.Sequence{}, msgs, errors.New("tokens mode turn claims server-side parsing")
		}
		out = append(out, tr)
		msgs = append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: tr.Text})
		if i == turns-1 {
			break
		}
		msgs = append(msgs, openai.ChatCompletionMessage{Role: "tool", ToolCallID: fmt.Sprintf("call%05d", i), Content: fmt.Sprintf("file%d.txt\nfile%d.log", i, i)})
		if userMid && i == 0 {
			msgs = append(msgs, openai.ChatCompletionMessage{Role: "user", Content: "keep going"})
		}
	}
	seq, err := ep.Finish(ctx, msgs)
	if err != nil {
		return out, seq, msgs, fmt.Errorf("finish: %w", err)
	}
	return out, seq, msgs, nil
}

// goldenDrift is the drift the seeded 3-turn episode of
// TestTokensModeExactPerTemplate has, per template behaviour (see
// docs/inference.md, "What drift means"): 0 for append-only renders; the
// earlier think blocks the ChatML-style templates strip; the Qwen3
// template strips them only before the last user message; Mistral moves
// [AVAILABLE_TOOLS] before the last user message. Every backend must give
// the same number: a different one means the splice changed.
func goldenDrift(family string, thinking, userMid bool) int {
	switch family {
	case "qwen3_coder", "qwen3_xml": // qwen3 template
		if thinking && userMid {
			return 51
		}
		return 0
	case "mistral":
		switch {
		case thinking && userMid:
			return 306
		case thinking:
			return 129
		case userMid:
			return 177
		}
		return 0
	}
	if thinking {
		return 129
	}
	return 0
}

func TestTokensModeExactPerTemplate(t *testing.T) {
	backends := []string{inference.BackendVLLM, inference.BackendVLLMGenerate, inference.BackendSGLang, inference.BackendAtropos}
	for _, fam := range sim.Families() {
		for _, thinking := range []bool{false, true} {
			srv := startSim(t, sim.Config{Family: fam, Reasoning: thinking, Seed: 7})
			for _, be := range backends {
				for _, userMid := range []bool{false, true} {
					name := fmt.Sprintf("%s/think=%v/%s/usermid=%v", fam, thinking, be, userMid)
					t.Run(name, func(t *testing.T) {
						c := openClient(t, inference.Config{Backend: be, Endpoints: []string{srv.URL}})
						spec := inference.EpisodeSpec{ID: "ep-" + strings.ReplaceAll(name, "/", "-"), Tools: []openai.Tool{terminalTool},
							Sampling: inference.Sampling{MaxTokens: 256}}
						turns, seq, _ := runEpisode(t, c, spec, 3, userMid)
						checkSequence(t, seq, turns)
						if seq.DriftTokens < 0 {
							t.Fatalf("drift check did not run")
						}
						if want := goldenDrift(fam, thinking, userMid); seq.DriftTokens != want {
							t.Fatalf("drift %d, want %d: the splice or a template changed (%d tokens, %d turns)", seq.DriftTokens, want, len(seq.Tokens), len(turns))
						}
					})
				}
			}
		}
	}
}

// The sequence must never re-tokenise sampled ids: with think blocks the
// Qwen3 template strips reasoning from earlier turns on re-render, so the
// drift check sees a difference, but the sequence keeps the sampled think.
func TestQwen3ThinkStrippingKeepsSampledIDs(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "qwen3_coder", Reasoning: true, Seed: 3})
	c := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}})
	turns, seq, _ := runEpisode(t, c, inference.EpisodeSpec{ID: "q3", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 256}}, 3, true)
	checkSequence(t, seq, turns)
	if !strings.Contains(turns[0].Text, "<think>") && !strings.Contains(turns[0].Text, "</think>") {
		t.Fatalf("simulator did not think: %q", turns[0].Text)
	}
	if seq.DriftTokens == 0 {
		t.Fatalf("expected drift from think stripping after a user turn, got 0")
	}
}

func TestHermesNoDrift(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes", Seed: 1})
	for _, be := range []string{inference.BackendVLLM, inference.BackendVLLMGenerate, inference.BackendSGLang, inference.BackendAtropos} {
		t.Run(be, func(t *testing.T) {
			c := openClient(t, inference.Config{Backend: be, Endpoints: []string{srv.URL}})
			turns, seq, _ := runEpisode(t, c, inference.EpisodeSpec{ID: "h-" + be, Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 256}}, 3, false)
			checkSequence(t, seq, turns)
			if seq.DriftTokens != 0 {
				t.Fatalf("drift %d, want 0 for ChatML with raw-text assistant messages", seq.DriftTokens)
			}
			for i, tr := range turns {
				if strings.Contains(tr.Text, "<|im_end|>") || !strings.Contains(tr.Text, "<tool_call>") && i == 0 {
					t.Fatalf("turn %d text %q: want tool-call markers kept and the end-of-turn token dropped", i, tr.Text)
				}
			}
		})
	}
}

// The Atropos server has no /tokenize: a separate tokenizer pool serves it.
func TestSeparateTokenizerEndpoints(t *testing.T) {
	gen := startSim(t, sim.Config{Family: "hermes", Seed: 4})
	tok := startSim(t, sim.Config{Family: "hermes", Seed: 4})
	c := openClient(t, inference.Config{Backend: inference.BackendAtropos, Endpoints: []string{gen.URL}, TokenizerEndpoints: []string{tok.URL}})
	turns, seq, _ := runEpisode(t, c, inference.EpisodeSpec{ID: "sep", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 256}}, 2, false)
	checkSequence(t, seq, turns)
	if n := gen.Stats().ByRoute["POST /tokenize"]; n != 0 {
		t.Fatalf("generation server got %d tokenize calls", n)
	}
	if tok.Stats().ByRoute["POST /tokenize"] == 0 || gen.Stats().ByRoute["POST /generate"] != 2 {
		t.Fatalf("routing: tokenizer %v, generator %v", tok.Stats().ByRoute, gen.Stats().ByRoute)
	}
}

// A turn cut by finish_reason=length has no end-of-turn token: the
// template's closing goes in masked, and the next turn still lines up.
func TestLengthCut(t *testing.T) {
	for _, fam := range sim.Families() {
		t.Run(fam, func(t *testing.T) {
			srv := startSim(t, sim.Config{Family: fam, ExactLength: true, Seed: 5})
			c := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}})
			turns, seq, _ := runEpisode(t, c, inference.EpisodeSpec{ID: "len-" + fam, Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 7}}, 3, false)
			checkSequence(t, seq, turns)
			for i, tr := range turns {
				if tr.FinishReason != "length" || len(tr.CompletionIDs) != 7 {
					t.Fatalf("turn %d: finish %q with %d ids", i, tr.FinishReason, len(tr.CompletionIDs))
				}
			}
			// Between turns: the masked closing must precede the next segment.
			gap := seq.Tokens[seq.TurnStarts[0]+7 : seq.TurnStarts[1]]
			if len(gap) == 0 {
				t.Fatalf("no template tokens between turns")
			}
			if seq.DriftTokens != 0 {
				t.Fatalf("drift %d after length cuts, want 0", seq.DriftTokens)
			}
		})
	}
}

func TestContextLengthGuard(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes", MaxModelLen: 1200})
	c := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}})
	ctx := context.Background()
	ep, err := c.Start(ctx, inference.EpisodeSpec{ID: "ctx", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 300}})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: strings.Repeat("long prompt ", 20)}}
	var lastErr error
	done := 0
	for i := 0; i < 20; i++ {
		tr, err := ep.Generate(ctx, msgs)
		if err != nil {
			lastErr = err
			break
		}
		done++
		msgs = append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: tr.Text},
			openai.ChatCompletionMessage{Role: "tool", Content: strings.Repeat("output ", 20)})
	}
	if !errors.Is(lastErr, inference.ErrContextLength) || !errors.Is(lastErr, inference.ErrRequest) {
		t.Fatalf("want ErrContextLength, got %v", lastErr)
	}
	// The failed turn left no trace: the sequence is still consistent.
	seq, err := ep.Finish(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if done == 0 || len(seq.TurnStarts) != done || len(seq.Tokens) > 1200 {
		t.Fatalf("sequence of %d tokens", len(seq.Tokens))
	}
}

func TestChatBackend(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes", Reasoning: true, Seed: 2})
	c := openClient(t, inference.Config{Backend: inference.BackendChat, Endpoints: []string{srv.URL}, ChatTokenIDs: true})
	ctx := context.Background()
	zero := 0.0
	ep, err := c.Start(ctx, inference.EpisodeSpec{ID: "chat", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{Temperature: &zero, MaxTokens: 256}})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "list files in /tmp"}}
	var turns []inference.Turn
	for i := 0; i < 3; i++ {
		tr, err := ep.Generate(ctx, msgs)
		if err != nil {
			t.Fatal(err)
		}
		if !tr.Parsed {
			t.Fatal("chat turn not marked parsed")
		}
		if len(tr.CompletionIDs) == 0 || len(tr.CompletionIDs) != len(tr.Logprobs) {
			t.Fatalf("turn %d: %d ids, %d logprobs", i, len(tr.CompletionIDs), len(tr.Logprobs))
		}
		turns = append(turns, tr)
		msgs = append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: tr.Content, ReasoningContent: tr.Reasoning, ToolCalls: tr.ToolCalls})
		if len(tr.ToolCalls) == 0 {
			break
		}
		for _, tc := range tr.ToolCalls {
			msgs = append(msgs, openai.ChatCompletionMessage{Role: "tool", ToolCallID: tc.ID, Content: "ok"})
		}
	}
	if len(turns[0].ToolCalls) == 0 || turns[0].Reasoning == "" {
		t.Fatalf("first turn: tool calls %v, reasoning %q", turns[0].ToolCalls, turns[0].Reasoning)
	}
	seq, err := ep.Finish(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(seq.Tokens) == 0 || len(seq.Mask) != len(seq.Tokens) || len(seq.Logprobs) != len(seq.Tokens) {
		t.Fatalf("chat sequence: %d tokens, %d mask, %d logprobs", len(seq.Tokens), len(seq.Mask), len(seq.Logprobs))
	}
}

func TestModelResolutionAndUnknownModel(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes", Model: "m1"})
	c := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL + "/v1"}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Start(ctx, inference.EpisodeSpec{ID: "a"}); err != nil {
		t.Fatalf("default model: %v", err)
	}
	_, err := c.Start(ctx, inference.EpisodeSpec{ID: "b", Model: "nope"})
	if !errors.Is(err, inference.ErrRequest) || !strings.Contains(err.Error(), "m1") {
		t.Fatalf("unknown model: %v", err)
	}
}

// Chat mode: the guard uses the last prompt + completion as a lower bound
// before sending; the server's 400 "maximum context length" maps to the
// same class when the bound was not enough.
func TestChatContextLength(t *testing.T) {
	for _, maxTok := range []int{300, 0} {
		t.Run(fmt.Sprint("max_tokens=", maxTok), func(t *testing.T) {
			srv := startSim(t, sim.Config{Family: "hermes", MaxModelLen: 1200, Scripts: []sim.Script{{Match: "loop", Steps: []sim.Step{
				{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls"}}}},
				{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls"}}}},
				{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls"}}}},
				{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls"}}}},
				{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls"}}}},
				{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls"}}}},
				{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls"}}}},
				{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls"}}}},
			}}}})
			c := openClient(t, inference.Config{Backend: inference.BackendChat, Endpoints: []string{srv.URL}, ChatTokenIDs: true})
			ctx := context.Background()
			ep, err := c.Start(ctx, inference.EpisodeSpec{ID: "cctx", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: maxTok}})
			if err != nil {
				t.Fatal(err)
			}
			msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "loop forever"}}
			var lastErr error
			for i := 0; i < 30 && lastErr == nil; i++ {
				var tr inference.Turn
				tr, lastErr = ep.Generate(ctx, msgs)
				if lastErr != nil {
					break
				}
				msgs = append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: tr.Content, ToolCalls: tr.ToolCalls})
				for _, tc := range tr.ToolCalls {
					msgs = append(msgs, openai.ChatCompletionMessage{Role: "tool", ToolCallID: tc.ID, Content: strings.Repeat("output ", 30)})
				}
				if len(tr.ToolCalls) == 0 {
					msgs = append(msgs, openai.ChatCompletionMessage{Role: "user", Content: strings.Repeat("more ", 30)})
				}
			}
			if !errors.Is(lastErr, inference.ErrContextLength) || !errors.Is(lastErr, inference.ErrRequest) || errors.Is(lastErr, inference.ErrInfra) {
				t.Fatalf("want ErrContextLength, got %v", lastErr)
			}
		})
	}
}

func TestRewrittenHistoryRejected(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes"})
	c := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}})
	ctx := context.Background()
	ep, err := c.Start(ctx, inference.EpisodeSpec{ID: "rw", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 128}})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "list files"}}
	tr, err := ep.Generate(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	msgs = append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: tr.Text}, openai.ChatCompletionMessage{Role: "tool", Content: "a b"})
	edited := slices.Clone(msgs)
	edited[0].Content = "summarised"
	if _, err := ep.Generate(ctx, edited); !errors.Is(err, inference.ErrRequest) || !strings.Contains(err.Error(), "message 0 changed") {
		t.Fatalf("rewritten history: %v", err)
	}
	if _, err := ep.Generate(ctx, msgs[:1]); !errors.Is(err, inference.ErrRequest) {
		t.Fatalf("missing assistant turn: %v", err)
	}
	// The original history still works after the rejected calls.
	tr2, err := ep.Generate(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	msgs = append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: tr2.Text})
	seq, err := ep.Finish(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	checkSequence(t, seq, []inference.Turn{tr, tr2})
	if seq.DriftTokens != 0 {
		t.Fatalf("drift %d", seq.DriftTokens)
	}
	if _, err := ep.Generate(ctx, msgs); !errors.Is(err, inference.ErrRequest) {
		t.Fatalf("Generate after Finish: %v", err)
	}
}

// The agent loop appends the *parsed* assistant message (content,
// reasoning, tool_calls), not the raw text. The splice must still line up:
// the base render then holds a tool-call assistant turn, and the
// normalised JSON only shows up as drift.
func TestParsedAssistantMessages(t *testing.T) {
	schemas, err := parsers.ToolsFromOpenAI([]byte(`[{"type":"function","function":{"name":"terminal","parameters":{"type":"object","properties":{"command":{"type":"string"}}}}}]`))
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range sim.Families() {
		tp, err := parsers.Get(fam)
		if err != nil {
			t.Logf("skip %s: %v", fam, err)
			continue
		}
		t.Run(fam, func(t *testing.T) {
			srv := startSim(t, sim.Config{Family: fam, Reasoning: true, Seed: 9})
			c := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}})
			ctx := context.Background()
			ep, err := c.Start(ctx, inference.EpisodeSpec{ID: "parsed-" + fam, Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 256}})
			if err != nil {
				t.Fatal(err)
			}
			msgs := []openai.ChatCompletionMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "list files in /tmp"}}
			var turns []inference.Turn
			for i := 0; i < 4; i++ {
				tr, err := ep.Generate(ctx, msgs)
				if err != nil {
					t.Fatalf("turn %d: %v", i+1, err)
				}
				turns = append(turns, tr)
				p := parsers.Split(tr.Text, tp, parsers.NewThinkParser("<think>", "</think>"), schemas, parsers.ReasoningOptions{})
				m := openai.ChatCompletionMessage{Role: "assistant"}
				if p.Content != nil {
					m.Content = *p.Content
				}
				if p.Reasoning != nil {
					m.ReasoningContent = *p.Reasoning
				}
				for j, tc := range p.ToolCalls {
					m.ToolCalls = append(m.ToolCalls, openai.ToolCall{ID: fmt.Sprintf("call%02d%03d", i, j), Type: "function", Function: openai.FunctionCall{Name: tc.Name, Arguments: tc.Arguments}})
				}
				msgs = append(msgs, m)
				if len(m.ToolCalls) == 0 {
					break
				}
				for _, tc := range m.ToolCalls {
					msgs = append(msgs, openai.ChatCompletionMessage{Role: "tool", ToolCallID: tc.ID, Content: "a.txt b.txt"})
				}
			}
			seq, err := ep.Finish(ctx, msgs)
			if err != nil {
				t.Fatal(err)
			}
			checkSequence(t, seq, turns)
			t.Logf("%d turns, %d tokens, drift %d", len(turns), len(seq.Tokens), seq.DriftTokens)
		})
	}
}

// Episodes starting together ask /v1/models once, not once each (a run's
// first groups start thousands of episodes at the same moment).
func TestModelsAskedOnceUnderConcurrentStarts(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes", Latency: sim.Latency{TTFT: 0}})
	c := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Start(context.Background(), inference.EpisodeSpec{ID: fmt.Sprintf("ep-%d", i)}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := srv.Stats().ByRoute["GET /v1/models"]; n < 1 || n > 4 {
		t.Fatalf("/v1/models asked %d times for 64 concurrent starts", n)
	}
}
