package inference_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/metrictest"
)

// judgeServer answers every chat request with reply(prompt) and counts the
// requests.
func judgeServer(t *testing.T, status int, reply func(prompt string) string) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if r.URL.Path != "/v1/chat/completions" {
			http.Error(w, "no route "+r.URL.Path, http.StatusNotFound)
			return
		}
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) != 1 {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		if status != http.StatusOK {
			http.Error(w, `{"error":{"message":"judge says no"}}`, status)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"message": map[string]any{"role": "assistant", "content": reply(req.Messages[0].Content)}}}})
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// A rollout of three turns on the simulator: the first two are followed by
// tool output, the last is the answer.
func hintRollout(t *testing.T, srv *sim.Server) inference.HintInput {
	t.Helper()
	ctx := context.Background()
	msgs := []openai.ChatCompletionMessage{
		{Role: "system", Content: "You are a coding agent."},
		{Role: "user", Content: "Make the tests in /work pass."},
	}
	tok := func(m []openai.ChatCompletionMessage, gp bool) []int32 {
		body, _ := json.Marshal(map[string]any{"model": "rollout-sim", "messages": m, "add_generation_prompt": gp})
		resp, err := http.Post(srv.URL+"/tokenize", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct{ Tokens []int32 }
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Tokens) == 0 {
			t.Fatalf("tokenize: %v", err)
		}
		return out.Tokens
	}
	var seq inference.Sequence
	add := func(ids []int32, trained int8) {
		seq.Tokens = append(seq.Tokens, ids...)
		for range ids {
			seq.Mask = append(seq.Mask, trained)
		}
	}
	add(tok(msgs, true), 0)
	for i, text := range []string{"Let me run the tests.", "I will fix the import.", "All tests pass now."} {
		seq.TurnStarts = append(seq.TurnStarts, len(seq.Tokens))
		sampled := tok([]openai.ChatCompletionMessage{{Role: "user", Content: text}}, false)
		add(sampled[len(sampled)/2:], 1)
		msgs = append(msgs, openai.ChatCompletionMessage{Role: "assistant", Content: text})
		if i < 2 {
			out := openai.ChatCompletionMessage{Role: "tool", Name: "terminal", ToolCallID: "c", Content: "FAILED test_app.py::test_import - ModuleNotFoundError"}
			msgs = append(msgs, out)
			add(tok([]openai.ChatCompletionMessage{out}, true), 0)
		}
	}
	_ = ctx
	return inference.HintInput{Messages: msgs, First: 2, Sequence: seq}
}

// The hint-enhanced teacher context against the simulator as teacher and a
// scripted judge: the turns a judge found a hint for are scored again, on
// their own sampled positions only, under a context that differs from the
// student's; the answer is never judged; judge failures are errors, judge
// replies without a verdict are not.
func TestHintTurnsOnSimulator(t *testing.T) {
	srv, err := sim.Start(context.Background(), sim.Config{Family: "hermes", Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	in := hintRollout(t, srv)
	teacher := func(judge string, h inference.HintConfig) *inference.Teacher {
		h.Endpoint, h.Model = judge, "judge"
		tc, err := inference.NewTeacher(inference.TeacherConfig{Endpoint: srv.URL, Model: "rollout-sim", TopK: 3, Retries: -1, Timeout: 10 * time.Second, Hints: &h})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tc.Close() })
		return tc
	}
	ctx := context.Background()

	// Turn 1's next state earns a hint; turn 2's does not (the judge sees
	// the response in its prompt).
	judge, calls := judgeServer(t, http.StatusOK, func(p string) string {
		if strings.Contains(p, "Let me run the tests.") {
			return "The import fails. [HINT_START]Check that the module is importable before running the tests.[HINT_END]\n\\boxed{1}"
		}
		return "Nothing to add. \\boxed{-1}"
	})
	tc := teacher(judge.URL+"/v1/", inference.HintConfig{}) // the /v1 and slash are dropped
	hinted0, positive0 := metrictest.Find(t, "rollout_distill_hinted_turns_total", "", "").GetCounter().GetValue(), metrictest.Find(t, "rollout_distill_hint_votes_total", "verdict", "positive").GetCounter().GetValue()
	hinted, st, err := tc.HintTurns(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 6 || st.Judged != 2 || st.Unreadable != 0 {
		t.Fatalf("%d judge calls, stats %+v; want 3 votes for each of the 2 turns with a next state", calls.Load(), st)
	}
	if len(hinted) != 1 {
		t.Fatalf("%d hinted turns, want 1", len(hinted))
	}
	if d, p := metrictest.Find(t, "rollout_distill_hinted_turns_total", "", "").GetCounter().GetValue()-hinted0, metrictest.Find(t, "rollout_distill_hint_votes_total", "verdict", "positive").GetCounter().GetValue()-positive0; d != 1 || p != 3 {
		t.Fatalf("metrics: %v hinted turns, %v positive votes; want 1 and 3", d, p)
	}
	h := hinted[0]
	start := in.Sequence.TurnStarts[0]
	n := in.Sequence.TurnStarts[1] - start
	for in.Sequence.Mask[start+n-1] == 0 {
		n--
	}
	if h.Turn != 0 || h.Message != 2 || h.Start != start || len(h.IDs) != n || h.Positive != 3 || h.Votes != 3 ||
		h.Hint != "Check that the module is importable before running the tests." {
		t.Fatalf("hinted turn %+v (want turn 0, message 2, start %d, %d positions)", h, start, n)
	}
	plain, _, err := tc.Score(ctx, in.Sequence.Tokens, func(p int) bool { return in.Sequence.Mask[p] == 1 })
	if err != nil {
		t.Fatal(err)
	}
	differ := 0
	for j := range h.IDs {
		if len(h.IDs[j]) != 3 || len(h.Logprobs[j]) != 3 {
			t.Fatalf("position %d: %v %v", start+j, h.IDs[j], h.Logprobs[j])
		}
		if !slices.Equal(h.IDs[j], plain[start+j]) {
			differ++
		}
	}
	if differ == 0 {
		t.Fatal("the hinted context scored every position exactly as the student's context did")
	}

	// Judges that say nothing usable: no hints, no error.
	mute, _ := judgeServer(t, http.StatusOK, func(string) string { return "I am not sure." })
	hinted, st, err = teacher(mute.URL, inference.HintConfig{Votes: 2}).HintTurns(ctx, in)
	if err != nil || len(hinted) != 0 || st.Unreadable != 4 {
		t.Fatalf("mute judge: %v, %d hinted, %+v", err, len(hinted), st)
	}
	short, _ := judgeServer(t, http.StatusOK, func(string) string { return "[HINT_START]retry[HINT_END] \\boxed{1}" })
	if hinted, _, err = teacher(short.URL, inference.HintConfig{}).HintTurns(ctx, in); err != nil || len(hinted) != 0 {
		t.Fatalf("a 5-character hint: %v, %d hinted", err, len(hinted))
	}

	// A judge that fails is an error of its class, naming the judge.
	for status, class := range map[int]error{http.StatusInternalServerError: inference.ErrInfra, http.StatusBadRequest: inference.ErrRequest} {
		broken, _ := judgeServer(t, status, nil)
		_, _, err := teacher(broken.URL, inference.HintConfig{}).HintTurns(ctx, in)
		if !errors.Is(err, class) || !strings.Contains(err.Error(), broken.URL) {
			t.Fatalf("judge answering %d: %v", status, err)
		}
	}

	// Without hints the teacher rescored nothing.
	plainTC, _ := inference.NewTeacher(inference.TeacherConfig{Endpoint: srv.URL, Model: "rollout-sim"})
	defer plainTC.Close()
	if hs, _, err := plainTC.HintTurns(ctx, in); err != nil || hs != nil || plainTC.Hints() {
		t.Fatalf("teacher without hints: %v %v", hs, err)
	}
	for _, h := range []inference.HintConfig{{Votes: -1}, {MaxTokens: -5}, {APIKeyEnv: "NOPE"}, {Endpoint: "judge:8000"}} {
		if _, err := inference.NewTeacher(inference.TeacherConfig{Endpoint: srv.URL, Model: "m", Hints: &h}); err == nil {
			t.Errorf("hints %+v accepted", h)
		}
	}
}
