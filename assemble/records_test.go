package assemble

import (
	"encoding/json"
	"testing"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/gateway"
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
