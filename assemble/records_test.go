package assemble

import (
	"encoding/json"
	"testing"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/runner"
)

// A harness session whose only call failed (a context overflow, say) has
// no branch: one row, no tokens, its calls and session id kept.
func TestRecordsSessionWithoutBranches(t *testing.T) {
	run := &runner.RunInfo{RunID: "r", Env: "harness", Model: "m"}
	g := &runner.Group{ID: "g", Item: datasets.Item{ID: "i"}}
	ro := &runner.Rollout{ID: "ro-1", Status: runner.StatusOK, Session: &gateway.SessionRecord{ID: "s1",
		Calls: []gateway.CallRecord{{Index: 0, API: "openai-chat", Branch: -1, Status: gateway.CallError, Reason: "context length exceeded"}}}}
	ro.Result.StopReason = runner.StopHarnessCrash
	rows, err := Records(run, g, ro)
	if err != nil || len(rows) != 1 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	r := rows[0]
	var calls []map[string]any
	if err := json.Unmarshal([]byte(r.Calls), &calls); err != nil || len(calls) != 1 || calls[0]["status"] != "error" {
		t.Fatalf("calls %q: %v", r.Calls, err)
	}
	if r.SessionID != "s1" || len(r.Tokens) != 0 || r.StopReason != "harness_crash" || r.Branch != 0 || r.ParentBranch != -1 {
		t.Fatalf("row %+v", r)
	}
	// A session that made no call at all leaves the calls column empty.
	ro.Session.Calls = nil
	if rows, err = Records(run, g, ro); err != nil || rows[0].Calls != "" {
		t.Fatalf("no calls: %q, %v", rows[0].Calls, err)
	}
}

// A standalone gateway's caller may score one branch on its own: the
// group's statistics use the sessions' rewards, the overridden branch's
// row carries its reward and its advantage under the group's mean and
// std, the other rows the session's.
func TestRecordsBranchRewards(t *testing.T) {
	run := &runner.RunInfo{RunID: "r", Env: "gateway", Model: "m"}
	seq := inference.Sequence{Tokens: []int32{1, 2, 3}, Mask: []int8{0, 1, 1}, Logprobs: []float32{1, -0.5, -0.5}, PromptLen: 1}
	sess := func(id string) *gateway.SessionRecord {
		return &gateway.SessionRecord{ID: id, Branches: []gateway.Branch{{Index: 0, Parent: -1, Sequence: seq}, {Index: 1, Parent: 0, SplitCall: 1, Sequence: seq}}}
	}
	g := &runner.Group{ID: "g", Item: datasets.Item{ID: "i"}, Rollouts: []runner.Rollout{
		{ID: "a", Index: 0, Status: runner.StatusOK, Score: rewards.Score{Value: 1}, Session: sess("s1"), BranchRewards: map[int]float64{1: 0}},
		{ID: "b", Index: 1, Status: runner.StatusOK, Score: rewards.Score{Value: 0}, Session: sess("s2")},
	}}
	runner.AssembleGroup(g, runner.Advantage{Mode: runner.AdvantageMean})
	if g.Mean != 0.5 {
		t.Fatalf("mean %v, want 0.5 (the sessions' rewards)", g.Mean)
	}
	rows, err := Records(run, g, &g.Rollouts[0])
	if err != nil || len(rows) != 2 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	if rows[0].Reward != 1 || *rows[0].Advantage != 0.5 || rows[1].Reward != 0 || *rows[1].Advantage != -0.5 {
		t.Fatalf("branch 0 reward %v advantage %v; branch 1 reward %v advantage %v", rows[0].Reward, *rows[0].Advantage, rows[1].Reward, *rows[1].Advantage)
	}
}

// With distillation, each branch row carries the teacher's scores of its
// own sequence; a failed rollout's rows carry none.
func TestRecordsBranchDistill(t *testing.T) {
	run := &runner.RunInfo{RunID: "r", Env: "harness", Model: "m"}
	seq0 := inference.Sequence{Tokens: []int32{1, 2, 3}, Mask: []int8{0, 1, 1}, Logprobs: []float32{0, -0.5, -0.5}, PromptLen: 1}
	seq1 := inference.Sequence{Tokens: []int32{1, 2, 4, 5}, Mask: []int8{0, 0, 1, 1}, Logprobs: []float32{0, 0, -1, -1}, PromptLen: 2}
	d := func(n int, id int32) runner.Distilled {
		out := runner.Distilled{TokenIDs: make([][]int32, n), Logprobs: make([][]float32, n)}
		out.TokenIDs[n-1], out.Logprobs[n-1] = []int32{id, 7}, []float32{-0.1, -2}
		return out
	}
	g := &runner.Group{ID: "g", Item: datasets.Item{ID: "i"}}
	ro := &runner.Rollout{ID: "a", Status: runner.StatusOK, Session: &gateway.SessionRecord{ID: "s",
		Branches: []gateway.Branch{{Index: 0, Parent: -1, Sequence: seq0}, {Index: 1, Parent: -1, Sequence: seq1}}},
		BranchDistill: []runner.Distilled{d(3, 3), d(4, 5)}}
	rows, err := Records(run, g, ro)
	if err != nil || len(rows) != 2 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	for i, want := range []int32{3, 5} {
		r := rows[i]
		if len(r.DistillTokenIDs) != len(r.Tokens) || len(r.DistillLogprobs) != len(r.Tokens) || r.DistillTokenIDs[len(r.Tokens)-1][0] != want {
			t.Fatalf("branch %d: distill %v for %d tokens", i, r.DistillTokenIDs, len(r.Tokens))
		}
	}
	ro.Status, ro.Failure = runner.StatusInfraFailed, &runner.Failure{Kind: runner.FailInference, Message: "x"}
	if rows, err = Records(run, g, ro); err != nil || rows[0].DistillTokenIDs != nil || rows[1].DistillTokenIDs != nil {
		t.Fatalf("failed rollout: distill kept (%v)", err)
	}
}
