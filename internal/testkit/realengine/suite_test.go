package realengine

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
	"github.com/rollout-rl/rollout/trajectory"
)

// The biased model: <tool_call> and </tool_call> strongly favoured, the
// JSON skeleton of a call favoured, <|im_end|> left alone. Tuned on
// tiny-qwen3 (seed 1414) so that over a run most turns hold a call, many
// are cut at max_tokens (64) inside a call, and some are well-formed.
const (
	biasCall = 8
	biasJSON = 8
	biasEnd  = 0
)

// slots is llama-server's -np: at least the rollouts in flight, each with
// 8192 tokens of context (terminal-tasks' first prompt is ~2,500 tokens).
const slots = 8

// biasFromEnv returns the bias strengths: REALENGINE_BIAS="call,json,end"
// (for tuning), else the constants above.
func biasFromEnv(t *testing.T) (float64, float64, float64) {
	v := os.Getenv("REALENGINE_BIAS")
	if v == "" {
		return biasCall, biasJSON, biasEnd
	}
	var c, j, e float64
	if _, err := fmt.Sscanf(v, "%g,%g,%g", &c, &j, &e); err != nil {
		t.Fatalf("REALENGINE_BIAS=%q: want call,json,end: %v", v, err)
	}
	return c, j, e
}

func startEngine(t *testing.T) *llamacpptest.Engine {
	t.Helper()
	return llamacpptest.Start(t, llamacpptest.Options{Slots: slots, Ctx: slots * 8192, Threads: 1})
}

func suiteCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestChatCommand runs `rollout chat` against the engine in tokens mode
// (backend llamacpp, hermes parser): the agent loop with real tools in a
// busybox sandbox, a few turns of a biased model, and the --out trajectory
// checked token by token against the server.
func TestChatCommand(t *testing.T) {
	e := startEngine(t)
	bias := llamacpptest.ToolCallBias(t, e, 6, 2, -2)
	out := filepath.Join(t.TempDir(), "traj.json")
	stdout, stderr, code := runRollout(t, suiteCtx(t), "chat", "--endpoint", e.URL, "--backend", "llamacpp", "--parser", "hermes",
		"--image", "rollout-sandbox:busybox", "--max-turns", "4", "--max-tokens", "48", "--toolsets", "terminal",
		"--extra-body", mustJSON(map[string]any{"logit_bias": bias}), "--out", out, "List the files in /workspace.")
	if code != 0 {
		t.Fatalf("rollout chat: exit %d\n%s\n%s\nserver log:\n%s", code, stdout, stderr, e.LogTail(30))
	}
	var traj struct {
		Messages   []message `json:"messages"`
		Tokens     []int32   `json:"tokens"`
		LossMask   []int8    `json:"loss_mask"`
		Logprobs   []float32 `json:"logprobs"`
		StopReason string    `json:"stop_reason"`
		TurnsUsed  int       `json:"turns_used"`
		Turns      []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"turns"`
		ToolErrors []struct {
			Kind string `json:"kind"`
		} `json:"tool_errors"`
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &traj); err != nil {
		t.Fatal(err)
	}
	t.Logf("rollout chat: stop %s after %d turns, %d tool errors\n%s", traj.StopReason, traj.TurnsUsed, len(traj.ToolErrors), tail(stdout, 30))
	if !strings.Contains(stdout, "user: List the files in /workspace.") || !strings.Contains(stdout, "stop: ") {
		t.Errorf("transcript lacks the task or the stop line:\n%s", stdout)
	}
	if traj.TurnsUsed < 1 || len(traj.Turns) != traj.TurnsUsed {
		t.Fatalf("turns_used %d, %d turn records", traj.TurnsUsed, len(traj.Turns))
	}
	// A cut generation is recorded as such (issue 14, defect 6), never as
	// a natural finish.
	if last := traj.Turns[len(traj.Turns)-1].FinishReason; last == "length" && traj.StopReason != "length" && traj.StopReason != "max_turns" {
		t.Errorf("last generation finished with %q but stop reason is %q", last, traj.StopReason)
	}
	n := len(traj.Tokens)
	if n == 0 || len(traj.LossMask) != n || len(traj.Logprobs) != n {
		t.Fatalf("%d tokens, %d loss_mask, %d logprobs", n, len(traj.LossMask), len(traj.Logprobs))
	}
	vocab, trained := llamacpptest.NVocab(t, e), 0
	for j, m := range traj.LossMask {
		if m != 1 {
			continue
		}
		trained++
		if want := llamacpptest.Rescore(t, e, vocab, traj.Tokens[:j], traj.Tokens[j]); math.Abs(float64(traj.Logprobs[j])-want) > logprobTolerance {
			t.Fatalf("token %d (id %d): logprob %.5f, the server's %.5f after the recorded prefix", j, traj.Tokens[j], traj.Logprobs[j], want)
		}
	}
	if trained == 0 {
		t.Errorf("no trained token in %d", n)
	}
}

// TestCollectChat is a GRPO collection of terminal-tasks in chat mode: the
// server renders the template and parses the calls.
func TestCollectChat(t *testing.T) {
	e := startEngine(t)
	c := collection{backend: "chat", chatIDs: chatIDs, groups: groupsFromEnv(t, 5), groupSize: 4, maxTokens: 64, maxTurns: 4,
		onTruncation: "tool_error", bias: collectionBias(t, e), inFlight: slots}
	dir, retried := c.run(t, suiteCtx(t), e)
	checkSampler(t, e, dir)
	s := check(t, e, dir, chatIDs, 8)
	errs := serverErrors(e)
	t.Logf("chat mode: %s\n  server errors: %v\n  rollouts retried as infrastructure failures: %v", s, errs, retried)
	// llama.cpp's 500 on the model's tool-call text and answers naming only
	// some ids are replayed at the turn's seed, never retried.
	if len(retried) != 0 {
		t.Errorf("chat mode: rollouts retried as infrastructure failures: %v", retried)
	}
	judge(t, c, s, errs)
}

func collectionBias(t *testing.T, e *llamacpptest.Engine) map[string]float64 {
	c, j, end := biasFromEnv(t)
	return llamacpptest.ToolCallBias(t, e, c, j, end)
}

// judge asserts what every collection must show.
func judge(t *testing.T, c collection, s stats, errs map[string]int) {
	t.Helper()
	if s.rollouts != c.groups*c.groupSize {
		t.Errorf("%d records, want %d", s.rollouts, c.groups*c.groupSize)
	}
	if s.infra != 0 {
		t.Errorf("%d infrastructure failures (model misbehaviour must never be one): %v", s.infra, s.byFailure)
	}
	// Truncated calls never poison the history (defect 1).
	if n := errs["Failed to parse tool call arguments as JSON"]; n != 0 {
		t.Errorf("the server refused %d histories with unparsable tool-call arguments", n)
	}
	// The biased model is cut at max_tokens often: truncation must show
	// as stop reason length or as truncated tool errors (defect 6).
	if s.byStop["length"]+s.toolErrors["truncated"] == 0 {
		t.Errorf("no generation recorded as cut at max_tokens: %v, tool errors %v", s.byStop, s.toolErrors)
	}
	if attempted := s.calls + s.toolErrors["parse_error"] + s.toolErrors["truncated"]; attempted == 0 {
		t.Errorf("no tool call attempted: the bias does not work")
	}
}

// chatIDs: chat mode asks llama.cpp for token ids (its logprob entries).
const chatIDs = true

// TestCollectTokens is the same collection in tokens mode: the llamacpp
// backend renders through /apply-template + /tokenize, generates from ids
// with /completion and parses the calls itself (hermes).
func TestCollectTokens(t *testing.T) {
	e := startEngine(t)
	c := collection{backend: "llamacpp", groups: groupsFromEnv(t, 5), groupSize: 4, maxTokens: 64, maxTurns: 4,
		onTruncation: "tool_error", bias: collectionBias(t, e), inFlight: slots}
	dir, retried := c.run(t, suiteCtx(t), e)
	checkSampler(t, e, dir)
	s := check(t, e, dir, true, 8)
	errs := serverErrors(e)
	t.Logf("tokens mode: %s\n  server errors: %v\n  rollouts retried as infrastructure failures: %v", s, errs, retried)
	// llama.cpp's scoring pass gives every sampled id its logprob (issue 37).
	if s.unscored != 0 {
		t.Errorf("tokens mode: %d sampled ids without a logprob, want 0", s.unscored)
	}
	// In tokens mode every call's token span is exact (issue 37 part 4).
	calls := 0
	for _, n := range s.callStatus {
		calls += n
	}
	if s.callSpans != calls {
		t.Errorf("tokens mode: %d of %d calls have a token span, want all", s.callSpans, calls)
	}
	// In tokens mode nothing the model writes reaches the server's parser:
	// no rollout may be retried as an infrastructure failure.
	if len(retried) != 0 {
		t.Errorf("tokens mode: rollouts retried as infrastructure failures: %v", retried)
	}
	judge(t, c, s, errs)
	for msg := range errs {
		if !knownServerErrors[msg] {
			t.Errorf("tokens mode: the server answered %d× %q", errs[msg], msg)
		}
	}
}

// TestCollectTokensDefaultServer runs tokens mode against a llama-server
// started with its defaults (no --no-prefill-assistant, as a new user
// starts it): it renders a trailing assistant message as a prefill, and
// refuses one while the template's thinking is on, so rollout must never
// send one. Every rollout must come back without an infrastructure
// failure, its tokens re-scored against the server.
func TestCollectTokensDefaultServer(t *testing.T) {
	e := llamacpptest.Start(t, llamacpptest.Options{Slots: 4, Ctx: 4 * 8192, Threads: 1, PrefillAssistant: true})
	if slices.Contains(e.Args, "--no-prefill-assistant") {
		t.Fatalf("llama-server started with --no-prefill-assistant: %v", e.Args)
	}
	c := collection{backend: "llamacpp", groups: 2, groupSize: 4, maxTokens: 64, maxTurns: 3,
		onTruncation: "tool_error", bias: collectionBias(t, e), inFlight: 4}
	dir, retried := c.run(t, suiteCtx(t), e)
	s := check(t, e, dir, true, 8)
	t.Logf("tokens mode, default llama-server: %s\n  rollouts retried as infrastructure failures: %v", s, retried)
	if s.rollouts != 8 || s.infra != 0 || len(retried) != 0 {
		t.Fatalf("default llama-server: %d rollouts, %d infra_failed, retried %v", s.rollouts, s.infra, retried)
	}
}

// neutralSampler is what llama-server must report for every slot a run
// used: the neutral sampler at temperature 1 (issue 14, defect 3).
var neutralSampler = map[string]float64{
	"temperature": 1, "top_k": 0, "top_p": 1, "min_p": 0, "typical_p": 1, "repeat_penalty": 1,
	"presence_penalty": 0, "frequency_penalty": 0, "xtc_probability": 0, "dry_multiplier": 0, "mirostat": 0,
	"top_n_sigma": -1, "dynatemp_range": 0,
}

// checkSampler compares the sampler the server reports for its slots
// (GET /slots: each slot's last request) with the neutral one, and checks
// that run.json records a sampler without mismatches. Call it before
// anything else sends requests.
func checkSampler(t *testing.T, e *llamacpptest.Engine, dir string) {
	t.Helper()
	var slotList []struct {
		ID       int            `json:"id"`
		NDecoded int            `json:"n_decoded"`
		Params   map[string]any `json:"params"`
	}
	e.MustCall(t, "/slots", nil, &slotList)
	used := 0
	for _, sl := range slotList {
		if sl.Params == nil {
			continue
		}
		if n, _ := sl.Params["n_probs"].(float64); n < 1 {
			continue // never used by the run (both modes ask for logprobs)
		}
		used++
		for k, want := range neutralSampler {
			got, ok := sl.Params[k].(float64)
			if !ok || got != want {
				t.Errorf("slot %d: the server sampled with %s = %v, want %v", sl.ID, k, sl.Params[k], want)
			}
		}
	}
	if used == 0 {
		t.Errorf("GET /slots: no slot shows the run's requests")
	}
	raw, err := os.ReadFile(filepath.Join(dir, "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Sampler *struct {
			Fields   map[string]any `json:"fields"`
			Server   map[string]any `json:"server"`
			Mismatch []string       `json:"mismatch"`
		} `json:"sampler"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if m.Sampler == nil || len(m.Sampler.Fields) == 0 {
		t.Fatalf("run.json records no sampler: %s", raw)
	}
	if len(m.Sampler.Mismatch) != 0 {
		t.Errorf("run.json: the server's sampler differs from the one sent in %v", m.Sampler.Mismatch)
	}
	t.Logf("run.json sampler: fields %v; server %v", m.Sampler.Fields, m.Sampler.Server)
}

// knownServerErrors are errors the server may log in tokens mode without
// failing a rollout: the final drift check re-renders the whole history,
// and an assistant message left empty (its only call unparsable, so not in
// tool_calls) is refused by llama.cpp's template; the drift check is then
// skipped with a warning (see docs/real-engines.md, "The real-engine
// suite").
var knownServerErrors = map[string]bool{"Assistant message must contain either 'content' or 'tool_calls'!": true}

// TestContextOverflow runs tokens mode against a server whose slots hold
// little more than terminal-tasks' first prompt (~2,600 tokens with the
// terminal and file tools), so episodes outgrow the context within a few
// turns: the stop reason is context_length, never an infrastructure
// failure (issue 14, defect 5) — whether the pre-flight check (one slot's
// n_ctx from /props) or the server's HTTP 400 exceed_context_size_error
// catches it. (Chat mode rarely gets past a first turn cut at max_tokens
// without a call; its HTTP 400 path is TestFirstPromptOverflow's.)
func TestContextOverflow(t *testing.T) {
	const slotCtx = 2816
	e := llamacpptest.Start(t, llamacpptest.Options{Slots: 2, Ctx: 2 * slotCtx, Threads: 1})
	bias := collectionBias(t, e)
	for _, c := range []collection{
		{backend: "llamacpp", groups: 1, groupSize: 2, maxTokens: 64, maxTurns: 12, onTruncation: "tool_error", bias: bias, inFlight: 2},
	} {
		t.Run(c.backend, func(t *testing.T) {
			dir, retried := c.run(t, suiteCtx(t), e)
			s := check(t, e, dir, true, 4)
			t.Logf("%s, -c %d per slot: %s\n  retried: %v", c.backend, slotCtx, s, retried)
			if s.infra != 0 {
				t.Errorf("%d infrastructure failures", s.infra)
			}
			if s.byStop["context_length"] == 0 {
				t.Errorf("no rollout stopped with context_length: %v", s.byStop)
			}
		})
	}
}

// TestFirstPromptOverflow: a slot smaller than terminal-tasks' first prompt.
// Nothing can be generated; the rollout fails as inference_rejected with a
// message that says so, and is not retried (the run then fails its exit
// policy, exit 3: no rollout ok) — not as "server returned no
// token ids", retried as an infrastructure failure.
func TestFirstPromptOverflow(t *testing.T) {
	e := llamacpptest.Start(t, llamacpptest.Options{Slots: 1, Ctx: 2048, Threads: 1})
	for _, c := range []collection{
		{backend: "llamacpp", groups: 1, groupSize: 2, maxTokens: 64, maxTurns: 4, onTruncation: "stop", inFlight: 2, wantExit: 3},
		{backend: "chat", chatIDs: true, groups: 1, groupSize: 2, maxTokens: 64, maxTurns: 4, onTruncation: "stop", inFlight: 2, wantExit: 3},
	} {
		t.Run(c.backend, func(t *testing.T) {
			dir, retried := c.run(t, suiteCtx(t), e)
			if len(retried) != 0 {
				t.Errorf("retried as infrastructure failures: %v", retried)
			}
			run, err := trajectory.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			recs, err := run.ReadAll(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if r.Status != "infra_failed" || r.Failure == nil || r.Failure.Kind != "inference_rejected" ||
					!strings.Contains(r.Failure.Message, "first prompt does not fit") || r.StopReason != "context_length" {
					t.Errorf("%s/%d: status %s, stop %s, failure %+v: want inference_rejected, the first prompt does not fit", r.ItemID, r.RolloutIndex, r.Status, r.StopReason, r.Failure)
				}
			}
		})
	}
}
