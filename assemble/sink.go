package assemble

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

// parquetSink writes each finished group as one unit of trajectory records
// and tells the runner which groups an earlier run already completed.
type parquetSink struct{ w *trajectory.Writer }

var (
	_ runner.Sink    = (*parquetSink)(nil)
	_ runner.Resumer = (*parquetSink)(nil)
	_ runner.Durable = (*parquetSink)(nil)
)

// DurableWrites implements runner.Durable: with the journal on, WriteGroup
// returns only once the group is fsynced, and it is safe for concurrent use.
func (s *parquetSink) DurableWrites() bool { return s.w.Journaled() }

// WriteGroup implements runner.Sink: it returns once the group is durable
// in the run directory (journal fsynced), unless the journal is off.
func (s *parquetSink) WriteGroup(ctx context.Context, run *runner.RunInfo, g *runner.Group) error {
	recs := make([]trajectory.Record, 0, len(g.Rollouts))
	for i := range g.Rollouts {
		rows, err := Records(run, g, &g.Rollouts[i])
		if err != nil {
			return err
		}
		recs = append(recs, rows...)
	}
	seq, err := s.w.WriteGroupSeq(ctx, recs)
	if err != nil {
		return err
	}
	g.Sequence = seq
	return nil
}

// CompletedGroups implements runner.Resumer: every group in the run
// directory is complete, because groups are written as units.
func (s *parquetSink) CompletedGroups(ctx context.Context) (map[string]bool, error) {
	done := map[string]bool{}
	run, err := trajectory.Open(s.w.Dir())
	if errors.Is(err, trajectory.ErrNoManifest) {
		return done, nil
	}
	if err != nil {
		return nil, err
	}
	err = run.Each(ctx, func(r *trajectory.Record) error {
		done[r.GroupID] = true
		return nil
	})
	return done, err
}

// Records converts one rollout of a finished group into its trajectory
// rows: one per branch of its gateway session (branch 0 first), else the
// one row of Record.
func Records(run *runner.RunInfo, g *runner.Group, ro *runner.Rollout) ([]trajectory.Record, error) {
	main, err := Record(run, g, ro)
	if err != nil {
		return nil, err
	}
	s := ro.Session
	if s == nil {
		return []trajectory.Record{main}, nil
	}
	main.SessionID = s.ID
	if main.SessionID == "" {
		main.SessionID = ro.ID
	}
	calls := make([]trajectory.SessionCall, len(s.Calls))
	for i, c := range s.Calls {
		calls[i] = trajectory.SessionCall{Index: c.Index, API: c.API, Branch: c.Branch, Status: c.Status, Reason: c.Reason, Kind: c.Kind,
			Requested: c.Requested, MaxTokens: c.MaxTokens, Granted: c.Granted, Stream: c.Stream, ToolChoice: c.ToolChoice, ReplyID: c.ReplyID,
			PromptTokens: c.PromptTokens, CompletionTokens: c.CompletionTokens, Started: c.Started.UTC(),
			DurationMS: float64(c.Duration.Microseconds()) / 1e3}
	}
	callsJSON, err := json.Marshal(calls)
	if err != nil {
		return nil, fmt.Errorf("group %s rollout %d: session calls: %w", g.ID, ro.Index, err)
	}
	if len(s.Branches) == 0 {
		// No call was answered (a harness that never called the model, or
		// whose calls all failed): one row, no tokens, its calls kept.
		if len(s.Calls) > 0 {
			main.Calls = string(callsJSON)
		}
		return []trajectory.Record{main}, nil
	}
	out := make([]trajectory.Record, len(s.Branches))
	for i := range s.Branches {
		b := &s.Branches[i]
		if b.Index != i {
			return nil, fmt.Errorf("group %s rollout %d: session %s: branch %d at position %d (branches must be in index order)", g.ID, ro.Index, s.ID, b.Index, i)
		}
		rec := main
		if r, ok := ro.BranchRewards[i]; ok && ro.Status == runner.StatusOK {
			// The caller scored this branch on its own (standalone gateway).
			rec.Reward, rec.Advantage = r, nil
			if a, ok := ro.BranchAdvantages[i]; ok {
				rec.Advantage = &a
			}
		}
		msgs, err := json.Marshal(b.Messages)
		if err != nil {
			return nil, fmt.Errorf("group %s rollout %d branch %d: messages: %w", g.ID, ro.Index, i, err)
		}
		rec.Messages = string(msgs)
		rec.Masks, rec.TokenVersions, rec.VersionCuts = nil, nil, nil
		rec.MinPolicyVersion, rec.MaxPolicyVersion, rec.PolicyLag = nil, nil, nil
		rec.DistillTokenIDs, rec.DistillLogprobs = nil, nil
		sequence(&rec, &b.Sequence, 0, 0)
		// The teacher scored each branch (distillation on a harness env).
		if i < len(ro.BranchDistill) && ro.Status == runner.StatusOK {
			if d := ro.BranchDistill[i]; len(d.TokenIDs) == len(rec.Tokens) && len(d.Logprobs) == len(rec.Tokens) && len(rec.Tokens) > 0 {
				rec.DistillTokenIDs, rec.DistillLogprobs = d.TokenIDs, d.Logprobs
			}
		}
		versions(&rec, g, ro, &b.Sequence)
		rec.Branch, rec.ParentBranch, rec.SplitCall, rec.SharedTokens = int32(i), int32(b.Parent), int32(b.SplitCall), int32(b.Shared)
		if i == 0 {
			rec.ParentBranch, rec.SplitCall, rec.SharedTokens = -1, -1, 0
			rec.Calls, rec.EchoRewritten, rec.EchoUnanchored = string(callsJSON), int32(s.Rewritten), int32(s.Unanchored)
		} else {
			// Session-level lists live on the main row only.
			rec.ToolErrors, rec.LoopEvents, rec.TurnRewards, rec.CallStatuses = nil, nil, nil, nil
		}
		rec.DeriveTrainingFields()
		out[i] = rec
	}
	return out, nil
}

// Record converts one rollout of a finished group into its trajectory row
// (the own agent loop's record; a gateway session's rows: Records).
func Record(run *runner.RunInfo, g *runner.Group, ro *runner.Rollout) (trajectory.Record, error) {
	res := &ro.Result
	msgs, err := json.Marshal(res.Messages)
	if err != nil {
		return trajectory.Record{}, fmt.Errorf("group %s rollout %d: messages: %w", g.ID, ro.Index, err)
	}
	tools, err := json.Marshal(ro.Tools)
	if err != nil {
		return trajectory.Record{}, fmt.Errorf("group %s rollout %d: tools: %w", g.ID, ro.Index, err)
	}
	seq := res.Sequence
	policy := run.PolicyVersion
	if g.PolicyVersion != nil {
		policy = g.PolicyVersion
	}
	rec := trajectory.Record{
		RunID: run.RunID, Env: run.Env, Category: g.Task.Category, ItemID: g.Item.ID, GroupID: g.ID,
		RolloutIndex: int32(ro.Index), Model: run.Model, PolicyVersion: policy,
		SamplingParams: run.SamplingJSON, Messages: string(msgs), Tools: string(tools),
		Reward: ro.Score.Value, RewardComponents: ro.Score.Components, Advantage: ro.Advantage,
		Turns: int32(res.TurnsUsed), FinishedNaturally: res.FinishedNaturally, StopReason: string(res.StopReason),
		Status: trajectory.StatusOK, CreatedAt: ro.Created,
		SessionID: ro.ID, ParentBranch: -1, SplitCall: -1,
		Timings: trajectory.Timings{
			GenerationMS: ro.Timings.Generation.Milliseconds(), ToolsMS: ro.Timings.Tools.Milliseconds(),
			SandboxStartMS: ro.Timings.SandboxStart.Milliseconds(), RewardMS: ro.Timings.Reward.Milliseconds(),
			TotalMS: ro.Timings.Total.Milliseconds(),
		},
		Manifest: trajectory.Manifest{
			ImageDigest: imageDigest(ro), CPUs: ro.Limits.CPUs, MemoryBytes: ro.Limits.MemoryBytes, PidsLimit: ro.Limits.PIDs,
			Network: ro.Network, RolloutTimeoutMS: run.RolloutTimeout.Milliseconds(), ToolTimeoutMS: run.ToolTimeout.Milliseconds(),
			Parser: run.Parser, ServiceVersion: run.ServiceVersion, ConfigHash: run.ConfigHash,
			DiskBytes: ro.Limits.DiskBytes, Runtime: ro.Runtime, Backend: ro.Backend,
		},
	}
	sequence(&rec, &seq, res.Counters.PromptTokens, res.Counters.CompletionTokens)
	if rec.RewardComponents == nil {
		rec.RewardComponents = map[string]float64{}
	}
	if ro.Status != runner.StatusOK {
		rec.Status = trajectory.StatusInfraFailed
		rec.Failure = &trajectory.Failure{Kind: ro.Failure.Kind, Message: ro.Failure.Message}
		rec.Reward, rec.Advantage = 0, nil
	}
	for _, te := range res.ToolErrors {
		rec.ToolErrors = append(rec.ToolErrors, trajectory.ToolError{Turn: int32(te.Turn), CallID: te.CallID, Tool: te.Tool, Kind: te.Kind, Message: te.Error})
	}
	for _, e := range res.Events {
		rec.LoopEvents = append(rec.LoopEvents, trajectory.LoopEvent{Turn: int32(e.Turn), Kind: e.Kind, Message: int32(e.Message), CallID: e.CallID, Original: e.Original, Detail: e.Detail})
	}
	for _, cs := range res.CallStatuses {
		rec.CallStatuses = append(rec.CallStatuses, trajectory.CallStatus{Turn: int32(cs.Turn), Index: int32(cs.Index), Name: cs.Name, Status: cs.Status, Reason: cs.Reason, SpanStart: int32(cs.SpanStart), SpanEnd: int32(cs.SpanEnd)})
	}
	if len(ro.DistillTokenIDs) == len(rec.Tokens) && len(rec.Tokens) > 0 && ro.Status == runner.StatusOK {
		rec.DistillTokenIDs, rec.DistillLogprobs = ro.DistillTokenIDs, ro.DistillLogprobs
	}
	if len(res.TurnRewards) > 0 {
		rec.TurnRewards = append([]float64(nil), res.TurnRewards...)
	}
	versions(&rec, g, ro, &seq)
	rec.DeriveTrainingFields()
	return rec, nil
}

// sequence fills rec's token columns from seq; prompt and completion are
// the counters used when seq has no ids (chat mode).
func sequence(rec *trajectory.Record, seq *inference.Sequence, prompt, completion int) {
	rec.Tokens, rec.LossMask, rec.Logprobs = seq.Tokens, seq.Mask, seq.Logprobs
	rec.DriftTokens, rec.UnscoredTokens = int32(seq.DriftTokens), int32(seq.Unscored)
	if n := len(seq.Tokens); n > 0 {
		rec.PromptTokens = int32(min(seq.PromptLen, n))
		rec.CompletionTokens = int32(n) - rec.PromptTokens
	} else {
		rec.PromptTokens = int32(prompt)
		rec.CompletionTokens = int32(completion)
	}
	if len(rec.Logprobs) != len(rec.Tokens) {
		// Logprobs are all-or-nothing per record: never misaligned.
		rec.Logprobs = nil
	} else if rec.Logprobs != nil {
		rec.Logprobs = append([]float32(nil), rec.Logprobs...)
	}
}

// imageDigest is the image's content-addressed id when the backend told
// it (a tag can be rebuilt; the id cannot), else the reference used.
func imageDigest(ro *runner.Rollout) string {
	if ro.ImageID != "" {
		return ro.ImageID
	}
	return ro.Image
}

// versions fills the asynchronous-RL columns: per-token versions, the
// rollout's min/max version over its sampled tokens, its lag against the
// version current when the group completed, and the cuts.
func versions(rec *trajectory.Record, g *runner.Group, ro *runner.Rollout, seq *inference.Sequence) {
	rec.Stale = g.Stale
	if len(seq.Versions) != len(seq.Tokens) || len(seq.Tokens) == 0 || ro.Status != runner.StatusOK {
		return
	}
	rec.TokenVersions = append([]int64(nil), seq.Versions...)
	if r := seq.Routing; r != nil && r.Positions <= len(seq.Tokens) {
		rec.RoutedExperts = append([]uint16(nil), r.Experts...)
		rec.RoutedExpertsShape = []int32{int32(r.Positions), int32(r.Layers), int32(r.TopK)}
	}
	var lo, hi int64
	seen := false
	for i, v := range seq.Versions {
		if i < len(seq.Mask) && seq.Mask[i] == 0 {
			continue
		}
		if !seen {
			lo, hi, seen = v, v, true
		}
		lo, hi = min(lo, v), max(hi, v)
	}
	for _, c := range seq.Cuts {
		rec.VersionCuts = append(rec.VersionCuts, trajectory.VersionCut{Turn: int32(c.Turn), Position: int32(c.Position), Kind: c.Kind, From: c.From, To: c.To})
		hi = max(hi, c.To)
	}
	if !seen {
		return
	}
	rec.MinPolicyVersion, rec.MaxPolicyVersion = &lo, &hi
	if g.Versions != nil {
		lag := max(g.Versions.Current, hi) - lo
		rec.PolicyLag = &lag
	}
}
