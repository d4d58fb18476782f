package realengine

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
	"github.com/rollout-rl/rollout/trajectory"
)

// collection is one `rollout run` of terminal-tasks against the engine.
type collection struct {
	backend   string // chat | llamacpp
	chatIDs   bool   // inference.chat_token_ids
	groups    int
	groupSize int
	maxTokens int
	maxTurns  int
	// onTruncation is the loop's on_truncation: tool_error keeps an
	// episode going after a cut call, so cut calls reach the history that
	// is re-sent (issue 14, defect 1).
	onTruncation string
	bias         map[string]float64
	inFlight     int
	// wantExit is rollout run's expected exit status (3: the run failed
	// its exit policy, e.g. no rollout ok).
	wantExit int
	// env and envConfig replace terminal-tasks on busybox; extra keys are
	// added to the run config (e.g. mcp_servers).
	env       string
	envConfig map[string]any
	extra     map[string]any
}

// groupsFromEnv is the number of groups of the suite's collections:
// REALENGINE_GROUPS, else def (the "Done when" check of issue 14 is
// REALENGINE_GROUPS=20).
func groupsFromEnv(t *testing.T, def int) int {
	if s := os.Getenv("REALENGINE_GROUPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("REALENGINE_GROUPS=%q: want a positive integer", s)
		}
		return n
	}
	return def
}

// retries counts the rollouts `rollout run` retried as infrastructure
// failures (its "rollout infra failure, retrying" log lines), by the
// server's message or the error's last clause.
func retries(stderr string) map[string]int {
	out := map[string]int{}
	for _, line := range strings.Split(stderr, "\n") {
		var l struct {
			Msg, Error string
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "rollout infra failure, retrying" {
			continue
		}
		msg := l.Error
		if i := strings.LastIndex(msg, ": HTTP "); i >= 0 {
			msg = msg[i+2:]
		} else if i := strings.Index(msg, "chat_token_ids is set but"); i >= 0 {
			msg = msg[i:]
			if j := strings.Index(msg, ";"); j > 0 {
				msg = msg[:j]
			}
		}
		out[digits.ReplaceAllString(msg, "N")]++
	}
	return out
}

var digits = regexp.MustCompile(`[0-9]+`)

// replays counts the chat turns the chat backend replayed on llama.cpp's
// /completion at their seed (its log lines), by reason, and the replays
// beyond the first that a turn needed.
func replays(stderr string) (map[string]int, int) {
	out, extra := map[string]int{}, 0
	for _, line := range strings.Split(stderr, "\n") {
		var l struct {
			Msg, Reason string
			Replays     int
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "inference: chat turn replayed on /completion at its seed" {
			continue
		}
		out[l.Reason]++
		extra += l.Replays - 1
	}
	return out, extra
}

// run writes the run config and runs `rollout run`; it returns the output
// directory and the rollouts retried as infrastructure failures.
func (c collection) run(t *testing.T, ctx context.Context, e *llamacpptest.Engine) (string, map[string]int) {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	cfg := map[string]any{
		"env":        "terminal-tasks",
		"env_config": map[string]any{"image": "rollout-sandbox:busybox", "max_turns": c.maxTurns},
		"groups":     c.groups,
		"group_size": c.groupSize,
		"seed":       14,
		"inference": map[string]any{
			"backend": c.backend, "endpoints": []string{e.URL}, "retries": 3, "timeout": "2m",
			"chat_token_ids": c.chatIDs,
		},
		"sampling": map[string]any{
			"temperature": 1.0, "max_tokens": c.maxTokens,
			"extra_body": map[string]any{"logit_bias": c.bias},
		},
		"loop":            map[string]any{"on_truncation": c.onTruncation},
		"parser":          "hermes",
		"rollout_timeout": "5m",
		// Mangled calls are the point: let episodes run to max_turns.
		"max_consecutive_invalid": 20,
		"limits":                  map[string]any{"rollouts_in_flight": c.inFlight, "groups_in_flight": max(1, c.inFlight/c.groupSize), "sandboxes": c.inFlight},
		"sandbox":                 map[string]any{"warm_pool": -1},
		"output":                  map[string]any{"dir": out},
	}
	if c.env != "" {
		cfg["env"], cfg["env_config"] = c.env, c.envConfig
	}
	for k, v := range c.extra {
		cfg[k] = v
	}
	// Chat mode keeps parser hermes: the loop's fallback for calls left in
	// content, and the parser of a turn llama.cpp's own tool-call parser
	// refused (replayed raw, see docs/inference.md).
	path := filepath.Join(dir, "run.yaml")
	// JSON is YAML.
	if err := os.WriteFile(path, []byte(mustJSON(cfg)), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stdout, stderr, code := runRollout(t, ctx, "run", "-c", path)
	t.Logf("rollout run (%s, chat_token_ids %v): %d groups × %d in %s\n%s", c.backend, c.chatIDs, c.groups, c.groupSize, time.Since(start).Round(time.Second), stdout)
	if code != c.wantExit {
		t.Fatalf("rollout run: exit %d (want %d)\nstdout:\n%s\nstderr (tail):\n%s\nserver log:\n%s", code, c.wantExit, stdout, tail(stderr, 40), e.LogTail(30))
	}
	if r, extra := replays(stderr); len(r) > 0 {
		t.Logf("chat turns replayed on /completion at their seed: %v (%d extra replays)", r, extra)
	}
	return out, retries(stderr)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stats are the counts a collection is judged and reported by.
type stats struct {
	rollouts, ok, infra     int
	byStop, byFailure       map[string]int
	toolErrors, loopEvents  map[string]int
	callStatus              map[string]int // call_statuses by status
	callSpans               int            // call_statuses with a token span
	turns, turnsWithCalls   int
	calls, trained, checked int
	unscored                int // sampled tokens without a logprob (unscored_tokens)
}

func (s stats) String() string {
	f := func(m map[string]int) string {
		keys := slices.Sorted(maps.Keys(m))
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
		return strings.Join(parts, ", ")
	}
	return fmt.Sprintf("rollouts %d (ok %d, failed %d)\n  stop reasons: %s\n  failure kinds: %s\n  turns %d, with calls %d, calls %d\n  call parsing: %s (with a token span %d)\n  tool errors: %s\n  loop events: %s\n  trained tokens %d (and %d sampled without a logprob, untrained), re-scored against the server %d",
		s.rollouts, s.ok, s.infra, f(s.byStop), f(s.byFailure), s.turns, s.turnsWithCalls, s.calls, f(s.callStatus), s.callSpans, f(s.toolErrors), f(s.loopEvents), s.trained, s.unscored, s.checked)
}

type message struct {
	Role       string `json:"role"`
	Content    any    `json:"content"`
	ToolCallID string `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// logprobTolerance: llama.cpp's logits depend on how a position was
// batched (measured on tiny-qwen3: re-scoring the same ids after the same
// prefix differs by up to 0.08 nats between a cached and an uncached
// prompt, by ~0.02 at the first generated position), so a logprob is
// compared within 0.15 nats. A misaligned id (an id shifted or dropped)
// is off by nats, not hundredths.
const logprobTolerance = 0.15

// check reads the run's records and asserts the suite's invariants:
// every rollout ok (model misbehaviour is never infrastructure), and, when
// the backend promises token ids (wantIDs), tokens, loss_mask and logprobs
// of equal length with at least one trained token, every checked trained
// token's logprob equal to the server's own for that id after that prefix
// (rescorePerRollout positions per rollout, 0 = all).
func check(t *testing.T, e *llamacpptest.Engine, dir string, wantIDs bool, rescorePerRollout int) stats {
	t.Helper()
	run, err := trajectory.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := stats{byStop: map[string]int{}, byFailure: map[string]int{}, toolErrors: map[string]int{}, loopEvents: map[string]int{}, callStatus: map[string]int{}}
	vocab := llamacpptest.NVocab(t, e)
	rng := rand.New(rand.NewPCG(14, 14))
	for i := range recs {
		r := &recs[i]
		s.rollouts++
		name := fmt.Sprintf("%s/%d", r.ItemID, r.RolloutIndex)
		if r.Status != "ok" {
			kind, msg := "?", ""
			if r.Failure != nil {
				kind, msg = r.Failure.Kind, r.Failure.Message
			}
			s.byFailure[kind]++
			s.infra++
			t.Errorf("%s: status %s, failure %s: %s", name, r.Status, kind, msg)
			continue
		}
		s.ok++
		s.byStop[r.StopReason]++
		s.turns += int(r.Turns)
		for _, te := range r.ToolErrors {
			s.toolErrors[te.Kind]++
		}
		for _, ev := range r.LoopEvents {
			s.loopEvents[ev.Kind]++
		}
		var msgs []message
		if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
			t.Fatalf("%s: messages: %v", name, err)
		}
		// Every call in the history was read by the parser (ok or
		// repaired); the malformed ones are left out of it.
		inHistory := 0
		for _, m := range msgs {
			if m.Role == "assistant" {
				inHistory += len(m.ToolCalls)
			}
		}
		read := 0
		for _, cs := range r.CallStatuses {
			s.callStatus[cs.Status]++
			if cs.Status != trajectory.CallMalformed {
				read++
			}
			if cs.SpanEnd <= cs.SpanStart {
				continue // no exact span (chat mode)
			}
			s.callSpans++
			// The span's ids, detokenised by the engine, hold the call
			// as the parser read it: its open marker and its name.
			if cs.SpanStart < 0 || int(cs.SpanEnd) > len(r.Tokens) {
				t.Errorf("%s: call %d/%d span [%d, %d) outside the %d tokens", name, cs.Turn, cs.Index, cs.SpanStart, cs.SpanEnd, len(r.Tokens))
				continue
			}
			text := detokenize(t, e, r.Tokens[cs.SpanStart:cs.SpanEnd])
			if !strings.Contains(text, "<tool_call>") || !strings.Contains(text, cs.Name) {
				t.Errorf("%s: call %d/%d (%s, %s) span [%d, %d) detokenises to %q", name, cs.Turn, cs.Index, cs.Name, cs.Status, cs.SpanStart, cs.SpanEnd, text)
			}
		}
		if read != inHistory {
			t.Errorf("%s: %d calls parsed ok or repaired (call_statuses), %d in the history", name, read, inHistory)
		}
		for _, m := range msgs {
			if m.Role == "assistant" && len(m.ToolCalls) > 0 {
				s.turnsWithCalls++
				s.calls += len(m.ToolCalls)
				for _, c := range m.ToolCalls {
					// The history re-sent to the server must be one its
					// template accepts: arguments are a JSON object.
					var obj map[string]any
					if err := json.Unmarshal([]byte(c.Function.Arguments), &obj); err != nil {
						t.Errorf("%s: a call in the history has arguments that are not a JSON object: %q", name, c.Function.Arguments)
					}
				}
			}
		}
		if !wantIDs {
			continue
		}
		n := len(r.Tokens)
		if n == 0 || len(r.LossMask) != n || len(r.Logprobs) != n {
			t.Errorf("%s: ok row with %d tokens, %d loss_mask, %d logprobs", name, n, len(r.LossMask), len(r.Logprobs))
			continue
		}
		var trained []int
		for j, m := range r.LossMask {
			if m == 1 {
				trained = append(trained, j)
			}
		}
		s.trained += len(trained)
		// Both modes stamp a policy version on every token (chat mode:
		// each turn's ids with the version it was admitted under).
		if len(r.TokenVersions) != n {
			t.Errorf("%s: %d token_versions for %d tokens", name, len(r.TokenVersions), n)
		}
		// Unscored sampled tokens are untrained placeholders after the
		// first prompt: there must be at least that many.
		untrained := 0
		for j := int(r.PromptTokens); j < n; j++ {
			if r.LossMask[j] == 0 && r.Logprobs[j] == trajectory.LogprobPlaceholder {
				untrained++
			}
		}
		if r.UnscoredTokens < 0 || int(r.UnscoredTokens) > untrained {
			t.Errorf("%s: unscored_tokens %d, but only %d untrained placeholder positions after the prompt", name, r.UnscoredTokens, untrained)
		}
		s.unscored += int(r.UnscoredTokens)
		if len(trained) == 0 {
			t.Errorf("%s: ok row with no trained token (%d tokens)", name, n)
			continue
		}
		// The first and last trained positions, then a random sample.
		pick := trained
		if rescorePerRollout > 0 && len(trained) > rescorePerRollout {
			pick = []int{trained[0], trained[len(trained)-1]}
			for _, k := range rng.Perm(len(trained) - 2)[:rescorePerRollout-2] {
				pick = append(pick, trained[k+1])
			}
			sort.Ints(pick)
		}
		for _, j := range pick {
			want := llamacpptest.Rescore(t, e, vocab, r.Tokens[:j], r.Tokens[j])
			s.checked++
			if got := float64(r.Logprobs[j]); math.Abs(got-want) > logprobTolerance {
				t.Errorf("%s: token %d (id %d, %q): recorded logprob %.5f, the server's %.5f after the recorded prefix",
					name, j, r.Tokens[j], detokenize(t, e, r.Tokens[j:j+1]), got, want)
				break
			}
		}
	}
	return s
}
