package inference_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/conntest"
)

func TestTeacherScoresAgainstSimulator(t *testing.T) {
	srv, err := sim.Start(context.Background(), sim.Config{Family: "hermes", Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	tc, err := inference.NewTeacher(inference.TeacherConfig{Endpoint: srv.URL, Model: "rollout-sim", TopK: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	ids := make([]int32, 40)
	for i := range ids {
		ids[i] = int32('A' + i%20)
	}
	want := func(p int) bool { return p >= 10 && p%2 == 0 }
	got, lps, err := tc.Score(context.Background(), ids, want)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ids) || len(lps) != len(ids) {
		t.Fatalf("%d/%d positions for %d tokens", len(got), len(lps), len(ids))
	}
	hitTop := 0
	for p := range ids {
		if !want(p) {
			if got[p] != nil || lps[p] != nil {
				t.Fatalf("position %d scored without being asked", p)
			}
			continue
		}
		if len(got[p]) != 4 || len(lps[p]) != 4 {
			t.Fatalf("position %d: %v %v", p, got[p], lps[p])
		}
		for i := 1; i < 4; i++ {
			if lps[p][i] > lps[p][i-1] {
				t.Fatalf("position %d not in rank order: %v", p, lps[p])
			}
		}
		if got[p][0] == ids[p] {
			hitTop++
		}
	}
	if hitTop == 0 {
		t.Fatal("the teacher never ranks the student's token first")
	}
	again, _, _ := tc.Score(context.Background(), ids, want)
	if again[10][0] != got[10][0] {
		t.Fatal("not deterministic")
	}

	// Refusals are request errors; an unreachable teacher is infra.
	big, _ := inference.NewTeacher(inference.TeacherConfig{Endpoint: srv.URL, Model: "rollout-sim", TopK: 50})
	if _, _, err := big.Score(context.Background(), ids, want); !errors.Is(err, inference.ErrRequest) {
		t.Fatalf("top_k over the server's limit: %v", err)
	}
	big.Close()
	dead, _ := inference.NewTeacher(inference.TeacherConfig{Endpoint: "http://127.0.0.1:1", Model: "m", Retries: -1, Timeout: 5 * time.Second})
	if _, _, err := dead.Score(context.Background(), ids, want); !errors.Is(err, inference.ErrInfra) {
		t.Fatalf("dead teacher: %v", err)
	}
	dead.Close()
	for _, c := range []inference.TeacherConfig{{Model: "m"}, {Endpoint: "http://x"}, {Endpoint: "http://x", Model: "m", TopK: -1}, {Endpoint: "teacher:8000", Model: "m"}} {
		if _, err := inference.NewTeacher(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if _, err := inference.NewTeacher(inference.TeacherConfig{Endpoint: "http://x", Model: "m", APIKeyEnv: "K"}); err == nil {
		t.Error("empty api key accepted")
	}
}

// Scores asked for by many rollouts at once reuse their connections: a
// teacher does not dial anew for every request beyond two (net/http's
// default idle connections per host).
func TestTeacherKeepsConnections(t *testing.T) {
	srv := conntest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt []int32 `json:"prompt"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		pl := make([]map[string]any, len(req.Prompt))
		for p := 1; p < len(pl); p++ {
			pl[p] = map[string]any{fmt.Sprint(req.Prompt[p]): map[string]any{"logprob": -0.5, "rank": 1}}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"prompt_logprobs": pl}}})
	}))
	defer srv.Close()
	tc, err := inference.NewTeacher(inference.TeacherConfig{Endpoint: srv.URL, Model: "m", TopK: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	const callers, rounds = 16, 4
	conntest.Rounds(t, callers, rounds, func() error {
		_, _, err := tc.Score(context.Background(), []int32{1, 2, 3}, func(int) bool { return true })
		return err
	})
	if n := srv.Conns(); n > callers {
		t.Fatalf("%d rounds of %d concurrent scores used %d connections, want at most %d", rounds, callers, n, callers)
	}
}

// A teacher (or hint judge) that answers 429 is rate-limiting, not
// refusing: the request is sent again after at least its Retry-After, and
// when the limit outlasts the retries the error is infra (the rollout may
// be retried), not a request error.
func TestTeacherRetriesRateLimits(t *testing.T) {
	var calls, limited atomic.Int32
	var first, second atomic.Int64 // UnixNano of the first two attempts
	limited.Store(2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		switch n {
		case 1:
			first.Store(time.Now().UnixNano())
		case 2:
			second.Store(time.Now().UnixNano())
		}
		if n <= limited.Load() {
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":{"message":"rate limit"}}`, http.StatusTooManyRequests)
			return
		}
		// Three positions: null, then the prompt's own token at rank 1.
		_, _ = w.Write([]byte(`{"choices":[{"prompt_logprobs":[null,{"5":{"logprob":-0.1,"rank":1}},{"6":{"logprob":-0.2,"rank":1}}]}]}`))
	}))
	defer srv.Close()
	tc, err := inference.NewTeacher(inference.TeacherConfig{Endpoint: srv.URL, Model: "m", TopK: 1, Retries: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	ids, _, err := tc.Score(context.Background(), []int32{4, 5, 6}, func(p int) bool { return p > 0 })
	if err != nil || calls.Load() != 3 || len(ids[2]) != 1 || ids[2][0] != 6 {
		t.Fatalf("after two 429s: %v, %d calls, ids %v", err, calls.Load(), ids)
	}
	if gap := time.Duration(second.Load() - first.Load()); gap < time.Second {
		t.Fatalf("the second attempt came %s after the first, before the Retry-After of 1 s", gap)
	}
	calls.Store(0)
	limited.Store(100)
	tc2, _ := inference.NewTeacher(inference.TeacherConfig{Endpoint: srv.URL, Model: "m", TopK: 1, Retries: 1})
	defer tc2.Close()
	_, _, err = tc2.Score(context.Background(), []int32{4, 5, 6}, func(p int) bool { return p > 0 })
	var ie *inference.Error
	if !errors.Is(err, inference.ErrInfra) || !errors.As(err, &ie) || ie.Status != http.StatusTooManyRequests || calls.Load() != 2 {
		t.Fatalf("a limit outlasting the retries: %v after %d calls", err, calls.Load())
	}
}
