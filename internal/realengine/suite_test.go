package realengine

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/llamacpptest"
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

func startEngine(t *testing.T) *llamacpptest.Engine {
	t.Helper()
	return llamacpptest.Start(t, llamacpptest.Options{Slots: slots, Ctx: slots * 8192, Threads: 1})
}

func suiteCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestChatCommand runs `rollout chat` against the engine: the agent loop
// with real tools in a busybox sandbox, a few turns of a biased model.
func TestChatCommand(t *testing.T) {
	e := startEngine(t)
	bias := toolCallBias(t, e, biasCall, biasJSON, -4)
	out := filepath.Join(t.TempDir(), "traj.json")
	stdout, stderr, code := runRollout(t, suiteCtx(t), "chat", "--endpoint", e.URL, "--image", "rollout-sandbox:busybox",
		"--max-turns", "4", "--max-tokens", "48", "--toolsets", "terminal", "--extra-body", mustJSON(map[string]any{"logit_bias": bias}),
		"--token-ids=false", "--out", out, "List the files in /workspace.")
	if code != 0 {
		t.Fatalf("rollout chat: exit %d\n%s\n%s\nserver log:\n%s", code, stdout, stderr, e.LogTail(30))
	}
	var traj struct {
		Messages   []message `json:"messages"`
		StopReason string    `json:"stop_reason"`
		TurnsUsed  int       `json:"turns_used"`
		Turns      []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"turns"`
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &traj); err != nil {
		t.Fatal(err)
	}
	t.Logf("rollout chat: stop %s after %d turns\n%s", traj.StopReason, traj.TurnsUsed, tail(stdout, 30))
	if !strings.Contains(stdout, "user: List the files in /workspace.") || !strings.Contains(stdout, "stop: ") {
		t.Errorf("transcript lacks the task or the stop line:\n%s", stdout)
	}
	if traj.TurnsUsed < 1 || len(traj.Turns) != traj.TurnsUsed {
		t.Errorf("turns_used %d, %d turn records", traj.TurnsUsed, len(traj.Turns))
	}
	// A model biased away from <|im_end|> runs into max_tokens: the
	// truncation is recorded as such (issue 14, defect 6), never as a
	// natural finish.
	last := traj.Turns[len(traj.Turns)-1].FinishReason
	if last == "length" && traj.StopReason != "length" && traj.StopReason != "max_turns" {
		t.Errorf("last generation finished with %q but stop reason is %q", last, traj.StopReason)
	}
	if n := serverErrors(e)["Failed to parse tool call arguments as JSON"]; n != 0 {
		t.Errorf("the server refused %d histories with unparsable tool-call arguments", n)
	}
}

// TestCollectChat is a GRPO collection of terminal-tasks in chat mode: the
// server renders the template and parses the calls.
func TestCollectChat(t *testing.T) {
	e := startEngine(t)
	c := collection{backend: "chat", chatIDs: chatIDs, groups: groupsFromEnv(t, 5), groupSize: 4, maxTokens: 64, maxTurns: 4,
		onTruncation: "tool_error", bias: toolCallBias(t, e, biasCall, biasJSON, biasEnd), inFlight: slots}
	dir, _ := c.run(t, suiteCtx(t), e)
	s := check(t, e, dir, chatIDs, 8)
	errs := serverErrors(e)
	t.Logf("chat mode: %s\n  server errors: %v", s, errs)
	judge(t, c, s, errs)
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
	if s.turnsWithCalls == 0 {
		t.Errorf("no turn with a tool call: the bias does not work")
	}
}

// chatIDs: chat mode asks llama.cpp for token ids (its logprob entries).
const chatIDs = false
