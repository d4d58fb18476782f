package server

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	openai "github.com/sashabaranov/go-openai"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/gateway"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

// seq is a token sequence of n prompt ids then k sampled ones, ids from
// base; version v on every position.
func seq(base int32, n, k int, v int64) inference.Sequence {
	s := inference.Sequence{PromptLen: n}
	for i := range n + k {
		s.Tokens = append(s.Tokens, base+int32(i))
		if i < n {
			s.Mask = append(s.Mask, 0)
			s.Logprobs = append(s.Logprobs, trajectory.LogprobPlaceholder)
		} else {
			s.Mask = append(s.Mask, 1)
			s.Logprobs = append(s.Logprobs, -float32(i)/16)
		}
		s.Versions = append(s.Versions, v)
	}
	return s
}

func msgs(texts ...string) []openai.ChatCompletionMessage {
	var out []openai.ChatCompletionMessage
	for i, t := range texts {
		role := openai.ChatMessageRoleUser
		if i%2 == 1 {
			role = openai.ChatMessageRoleAssistant
		}
		out = append(out, openai.ChatCompletionMessage{Role: role, Content: t})
	}
	return out
}

// branchedGroup is a group of two rollouts: rollout 0 a gateway session
// with three branches (1 compacted from 0, 2 a sub-agent call split from
// 0), rollout 1 the own agent loop's single sequence.
func branchedGroup() (*runner.RunInfo, *runner.Group) {
	run := &runner.RunInfo{RunID: "run-b", Env: "harness", Model: "m", SamplingJSON: `{"temperature":1}`}
	adv0, adv1 := 0.5, -0.5
	start := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	session := &gateway.SessionRecord{
		ID: "sess-1",
		Branches: []gateway.Branch{
			{Index: 0, Parent: -1, SplitCall: -1, Calls: []int{0, 1}, Messages: msgs("do it", "ok"), Sequence: seq(100, 4, 3, 7)},
			{Index: 1, Parent: 0, SplitCall: 2, Shared: 2, Calls: []int{2}, Messages: msgs("summary", "done"), Sequence: seq(200, 3, 2, 7)},
			{Index: 2, Parent: 0, SplitCall: 3, Shared: 4, Calls: []int{3}, Messages: msgs("sub task", "sub answer"), Sequence: seq(300, 5, 4, 8)},
		},
		Calls: []gateway.CallRecord{
			{Index: 0, API: "openai-chat", Branch: 0, Status: gateway.CallOK, Requested: map[string]any{"temperature": 0.2}, Stream: true, Started: start, Duration: 1500 * time.Microsecond},
			{Index: 1, API: "openai-chat", Branch: 0, Status: gateway.CallOK, Started: start.Add(time.Second)},
			{Index: 2, API: "anthropic-messages", Branch: 1, Status: gateway.CallOK, MaxTokens: 9000, Granted: 512, Started: start.Add(2 * time.Second)},
			{Index: 3, API: "openai-responses", Branch: 2, Status: gateway.CallOK, Started: start.Add(3 * time.Second)},
			{Index: 4, API: "openai-chat", Branch: -1, Status: gateway.CallResent, Reason: "identical request re-sent", Started: start.Add(4 * time.Second)},
		},
		Rewritten: 2, Unanchored: 1,
	}
	g := &runner.Group{
		ID: "grp-1", Item: datasets.Item{ID: "item-1"}, Task: envs.Task{Category: "c"}, OK: 2, Mean: 0.5, Std: 0.5, Sequence: -1,
		Rollouts: []runner.Rollout{
			{ID: "ro-a", Index: 0, Attempts: 1, Status: runner.StatusOK, Score: rewards.Score{Value: 1}, Advantage: &adv0, Created: start,
				Result:  agentloop.Result{StopReason: "finished", FinishedNaturally: true, TurnsUsed: 4},
				Session: session},
			{ID: "ro-b", Index: 1, Attempts: 1, Status: runner.StatusOK, Score: rewards.Score{Value: 0}, Advantage: &adv1, Created: start,
				Result: agentloop.Result{StopReason: "finished", FinishedNaturally: true, TurnsUsed: 1,
					Messages: msgs("do it", "no"), Sequence: seq(400, 4, 2, 7)}},
		},
	}
	return run, g
}

// A rollout with three branches travels through every layer: rows,
// Parquet, the reader, inspect, the exports, the eval report and gRPC (live
// and replayed), each branch a token sequence of its own.
func TestBranchesRoundTrip(t *testing.T) {
	run, g := branchedGroup()
	ctx := context.Background()

	// Rows.
	var recs []trajectory.Record
	for i := range g.Rollouts {
		rows, err := assemble.Records(run, g, &g.Rollouts[i])
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rows...)
	}
	if len(recs) != 4 {
		t.Fatalf("%d rows, want 3 branches + 1", len(recs))
	}
	type key struct {
		Index, Branch, Parent, Split, Shared int32
		Session                              string
		Tokens                               int
	}
	var keys []key
	for _, r := range recs {
		keys = append(keys, key{r.RolloutIndex, r.Branch, r.ParentBranch, r.SplitCall, r.SharedTokens, r.SessionID, len(r.Tokens)})
		if r.RolloutIndex == 0 && (r.Reward != 1 || *r.Advantage != 0.5 || r.Status != trajectory.StatusOK) {
			t.Errorf("branch %d does not share the session's reward/advantage/status: %v %v %s", r.Branch, r.Reward, *r.Advantage, r.Status)
		}
	}
	want := []key{{0, 0, -1, -1, 0, "sess-1", 7}, {0, 1, 0, 2, 2, "sess-1", 5}, {0, 2, 0, 3, 4, "sess-1", 9}, {1, 0, -1, -1, 0, "ro-b", 6}}
	if d := cmp.Diff(want, keys); d != "" {
		t.Fatalf("rows (-want +got):\n%s", d)
	}
	var calls []trajectory.SessionCall
	if err := json.Unmarshal([]byte(recs[0].Calls), &calls); err != nil || len(calls) != 5 || calls[4].Status != gateway.CallResent || calls[2].Granted != 512 || calls[0].DurationMS != 1.5 {
		t.Fatalf("calls column %s: %v", recs[0].Calls, err)
	}
	if recs[1].Calls != "" || recs[0].EchoRewritten != 2 || recs[0].EchoUnanchored != 1 || recs[1].EchoRewritten != 0 {
		t.Fatal("session columns not on branch 0 only")
	}
	if !strings.Contains(recs[2].Messages, "sub answer") || recs[2].MinPolicyVersion == nil || *recs[2].MinPolicyVersion != 8 {
		t.Fatalf("branch 2's own messages and versions: %s %v", recs[2].Messages, recs[2].MinPolicyVersion)
	}

	// Parquet and back.
	dir := t.TempDir()
	w, err := trajectory.NewWriter(ctx, dir, trajectory.WriterOptions{RunID: run.RunID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteGroupSeq(ctx, recs); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tr, err := trajectory.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	back, err := tr.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(recs, back, cmpopts.EquateEmpty(), cmpopts.IgnoreFields(trajectory.Record{}, "SchemaVersion", "CreatedAt")); d != "" {
		t.Fatalf("Parquet round trip (-want +got):\n%s", d)
	}

	// inspect counts rollouts, not rows.
	sum := trajectory.Summarize(tr, back)
	if sum.Rows != 2 || sum.OK != 2 || sum.Sequences != 4 || sum.Branched != 1 || sum.Tokens != 27 {
		t.Fatalf("summary: rollouts %d ok %d sequences %d branched %d tokens %d", sum.Rows, sum.OK, sum.Sequences, sum.Branched, sum.Tokens)
	}
	var out bytes.Buffer
	if err := trajectory.WriteSummary(&out, dir, sum); err != nil || !strings.Contains(out.String(), "4 sequences; 1 rollouts with more than one branch") {
		t.Fatalf("summary text %q: %v", out.String(), err)
	}

	// Conversation exports: the main branch.
	out.Reset()
	st, err := trajectory.WriteSFT(&out, back, trajectory.FormatMessages, trajectory.Filter{})
	if err != nil || st.Written != 2 || strings.Contains(out.String(), "sub answer") {
		t.Fatalf("SFT: %+v %v\n%s", st, err, out.String())
	}
	// Token exports: every branch is a sequence of the group.
	groups, _, err := trajectory.AtroposGroups(back, trajectory.AtroposOptions{GroupSize: 2})
	if err != nil || len(groups) != 1 {
		t.Fatalf("atropos: %d groups, %v", len(groups), err)
	}
	if sd := groups[0]; len(sd.Tokens) != 4 || sd.Tokens[2][0] != 300 || sd.Scores[1] != 1 || sd.Scores[3] != 0 || sd.GroupOverrides["group_size"] != 4 {
		t.Fatalf("atropos group: %d sequences, scores %v, overrides %v", len(sd.Tokens), sd.Scores, sd.GroupOverrides)
	}
	// Eval: a session counts once.
	rep := trajectory.ComputeEval(back, trajectory.EvalOptions{})
	if n := rep.Results["all"]["n_samples"]; n != 2 {
		t.Fatalf("eval counts %v samples, want 2", n)
	}

	// gRPC: live conversion and replay agree; every branch is delivered.
	live, err := groupProto(run, g)
	if err != nil {
		t.Fatal(err)
	}
	if len(live.Rollouts) != 2 || len(live.Rollouts[0].Branches) != 2 || len(live.Rollouts[1].Branches) != 0 {
		t.Fatalf("live: %d rollouts, branches %d/%d", len(live.Rollouts), len(live.Rollouts[0].GetBranches()), len(live.Rollouts[1].GetBranches()))
	}
	b2 := live.Rollouts[0].Branches[1]
	if b2.Branch != 2 || b2.ParentBranch != 0 || b2.SplitCall != 3 || b2.SharedTokens != 4 || len(b2.Tokens) != 9 || b2.SessionId != "sess-1" || b2.CallsJson != "" {
		t.Fatalf("branch 2 message: %v", b2)
	}
	if live.Rollouts[0].CallsJson == "" || live.Rollouts[0].Branch != 0 || live.Rollouts[0].ParentBranch != -1 {
		t.Fatalf("main message: %v", live.Rollouts[0])
	}
	replayed := storedGroupProto(back, 0, false)
	if len(replayed.Rollouts) != 2 || len(replayed.Rollouts[0].Branches) != 2 || replayed.Mean != 0.5 {
		t.Fatalf("replay: %d rollouts, %d branches, mean %v", len(replayed.Rollouts), len(replayed.Rollouts[0].GetBranches()), replayed.Mean)
	}
	ignore := protocmp.IgnoreFields(&rolloutv1.Rollout{}, "rollout_id", "attempts")
	if d := cmp.Diff(live.Rollouts, replayed.Rollouts, protocmp.Transform(), ignore); d != "" {
		t.Fatalf("live vs replayed (-live +replayed):\n%s", d)
	}
	// The compact layout compacts and expands the branches too.
	compact := CompactGroup(live)
	if c := compact.Rollouts[0].Branches[0]; len(c.LossMask) != 0 || len(c.LossMaskRuns) == 0 {
		t.Fatalf("branch not compacted: %v", c)
	}
	exp := proto.Clone(compact).(*rolloutv1.Group)
	if err := ExpandGroup(exp); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(live, exp, protocmp.Transform()); d != "" {
		t.Fatalf("compact → expand (-want +got):\n%s", d)
	}
}

// A rollout without a session writes exactly the row it wrote before
// branches existed, with the new columns at their defaults.
func TestNoBranchRowUnchanged(t *testing.T) {
	run, g := branchedGroup()
	ro := &g.Rollouts[1]
	rows, err := assemble.Records(run, g, ro)
	if err != nil || len(rows) != 1 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	got := rows[0]
	if got.SessionID != "ro-b" || got.Branch != 0 || got.ParentBranch != -1 || got.SplitCall != -1 || got.SharedTokens != 0 ||
		got.Calls != "" || got.EchoRewritten != 0 || got.EchoUnanchored != 0 {
		t.Fatalf("new columns not at their defaults: %+v", got)
	}
	// Everything else is the single-row conversion's.
	one, err := assemble.Record(run, g, ro)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(one, got); d != "" {
		t.Fatalf("row differs from Record (-want +got):\n%s", d)
	}
	if len(got.Tokens) != 6 || got.PromptTokens != 4 || got.CompletionTokens != 2 || got.Masks[5] != 405 {
		t.Fatalf("token columns: %v %d %d %v", got.Tokens, got.PromptTokens, got.CompletionTokens, got.Masks)
	}
}
