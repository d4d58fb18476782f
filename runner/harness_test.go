package runner

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/sandbox"
)

func TestHarnessResult(t *testing.T) {
	branch := func(i int) gateway.Branch {
		return gateway.Branch{Index: i, Parent: -1, Sequence: inference.Sequence{Tokens: []int32{1, 2}, Mask: []int8{0, 1}, Logprobs: []float32{0, -1}, PromptLen: 1}}
	}
	two := gateway.SessionRecord{ID: "s", Branches: []gateway.Branch{branch(0), branch(1)},
		Calls: []gateway.CallRecord{{Index: 0, Branch: 0, Status: gateway.CallOK}, {Index: 1, Branch: 1, Status: gateway.CallOK}, {Index: 2, Branch: -1, Status: gateway.CallError, Reason: "bad request"}}}
	two.Branches[1].Messages = []openai.ChatCompletionMessage{{Role: "assistant", Content: "final"}}
	for _, c := range []struct {
		name  string
		rec   gateway.SessionRecord
		res   sandbox.ExecResult
		limit int
		want  string
	}{
		{"exit", two, sandbox.ExecResult{}, 1000, string(StopHarnessExit)},
		{"crash", two, sandbox.ExecResult{ExitCode: 3, Stderr: []byte("Traceback: boom")}, 1000, string(StopHarnessCrash)},
		{"timeout", two, sandbox.ExecResult{ExitCode: 124, TimedOut: true, Duration: time.Second}, 1000, string(StopHarnessTimeout)},
		{"no calls", gateway.SessionRecord{}, sandbox.ExecResult{}, 1000, string(StopHarnessNoCalls)},
		{"call limit", two, sandbox.ExecResult{ExitCode: 1}, 3, string(StopHarnessLooped)},
		// A long stderr whose tail cut falls inside a multi-byte rune.
		{"crash, long stderr", two, sandbox.ExecResult{ExitCode: 2, Stderr: []byte(strings.Repeat("é", 300) + "x")}, 1000, string(StopHarnessCrash)},
	} {
		r := harnessResult(c.rec, c.res, c.limit)
		if string(r.StopReason) != c.want || r.StopReason.Failed() {
			t.Errorf("%s: stop %s (failed %v), want %s", c.name, r.StopReason, r.StopReason.Failed(), c.want)
		}
		if r.FinishedNaturally != (c.want == string(StopHarnessExit)) {
			t.Errorf("%s: finished naturally %v", c.name, r.FinishedNaturally)
		}
		if len(r.Events) != 1 || r.Events[0].Kind != "harness" {
			t.Fatalf("%s: events %+v", c.name, r.Events)
		}
		if c.res.ExitCode == 3 && !strings.Contains(r.Events[0].Detail, "Traceback: boom") {
			t.Errorf("%s: detail %q lacks stderr", c.name, r.Events[0].Detail)
		}
		if !utf8.ValidString(r.Events[0].Detail) {
			t.Errorf("%s: detail %q is not valid UTF-8", c.name, r.Events[0].Detail)
		}
		if len(c.rec.Branches) > 0 {
			// The reward reads the branch of the last answered call; the
			// main sequence is branch 0's.
			if r.TurnsUsed != 2 || len(r.Messages) != 1 || r.Messages[0].Content != "final" || len(r.Sequence.Tokens) != 2 {
				t.Errorf("%s: turns %d messages %+v", c.name, r.TurnsUsed, r.Messages)
			}
		}
	}
}

func TestCheckSession(t *testing.T) {
	ro := &Rollout{Session: &gateway.SessionRecord{Branches: []gateway.Branch{{Sequence: inference.Sequence{Tokens: []int32{1, 2}, Mask: []int8{1}, Logprobs: []float32{0, 0}}}}}}
	ro.Result.StopReason = StopHarnessExit
	if kind, err := checkSession(ro, sandbox.ExecResult{}); kind != FailInference || err == nil {
		t.Errorf("misaligned branch: %s %v", kind, err)
	}
	// A harness that failed after the engine did: infrastructure.
	ro = &Rollout{Session: &gateway.SessionRecord{Calls: []gateway.CallRecord{{Index: 0, Status: gateway.CallError, Kind: "upstream", Reason: "inference generate: " + inference.ErrInfra.Error() + ": 502"}}}}
	ro.Result.StopReason = StopHarnessCrash
	if kind, err := checkSession(ro, sandbox.ExecResult{ExitCode: 1}); kind != FailInference || err == nil {
		t.Errorf("engine failure: %s %v", kind, err)
	}
	// A harness that crashed on its own: data.
	ro.Session.Calls[0].Reason, ro.Session.Calls[0].Kind = "bad request: unknown role", "bad_request"
	if kind, err := checkSession(ro, sandbox.ExecResult{ExitCode: 1}); err != nil {
		t.Errorf("harness crash is data: %s %v", kind, err)
	}
}

// A harness rollout's sampled tokens and policy versions are its session's
// branches, all of them: branch 1 of a compacted session holds sampled
// ids (and, here, the group's oldest version) that branch 0 does not.
func TestHarnessBranchesCounted(t *testing.T) {
	branch := func(i int, mask []int8, versions []int64, unscored int) gateway.Branch {
		return gateway.Branch{Index: i, Parent: i - 1, Sequence: inference.Sequence{
			Tokens: make([]int32, len(mask)), Mask: mask, Logprobs: make([]float32, len(mask)),
			Versions: versions, Unscored: unscored}}
	}
	sess := &gateway.SessionRecord{ID: "s", Branches: []gateway.Branch{
		branch(0, []int8{0, 1, 1}, []int64{5, 5, 5}, 0),
		branch(1, []int8{0, 0, 1, 1, 1}, []int64{2, 2, 2, 3, 3}, 1),
	}}
	ro := Rollout{Status: StatusOK, Session: sess}
	ro.Result.Sequence = sess.Branches[0].Sequence // as harnessResult leaves it
	ro.Result.StopReason = StopHarnessExit
	g := &Group{Rollouts: []Rollout{ro}}

	v := Versions(g, 6)
	if v == nil || v.Min != 2 || v.Max != 5 || v.Lag != 4 {
		t.Fatalf("versions %+v, want min 2 (branch 1's) max 5 lag 4", v)
	}
	r := &Runner{}
	r.sum.StopReasons, r.sum.FailuresByKind = map[string]int{}, map[string]int{}
	r.count(g)
	// 2 + 3 trained ids, plus branch 1's unscored one.
	if s := r.Summary(); s.SampledTokens != 6 || s.UnscoredTokens != 1 {
		t.Fatalf("sampled %d unscored %d, want 6 and 1 (both branches)", s.SampledTokens, s.UnscoredTokens)
	}
	// The own loop's rollout: its one sequence.
	own := rolloutWith([]int64{1, 1, 1}, []int8{0, 1, 1})
	if seqs := own.Sequences(); len(seqs) != 1 || seqs[0] != &own.Result.Sequence {
		t.Fatalf("own loop: %d sequences", len(seqs))
	}
}
