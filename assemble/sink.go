package assemble

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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
	recs := make([]trajectory.Record, len(g.Rollouts))
	for i := range g.Rollouts {
		rec, err := Record(run, g, &g.Rollouts[i])
		if err != nil {
			return err
		}
		recs[i] = rec
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

// Record converts one rollout of a finished group into its trajectory row.
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
		Tokens: seq.Tokens, LossMask: seq.Mask, Logprobs: seq.Logprobs,
		Reward: ro.Score.Value, RewardComponents: ro.Score.Components, Advantage: ro.Advantage,
		Turns: int32(res.TurnsUsed), FinishedNaturally: res.FinishedNaturally, StopReason: string(res.StopReason),
		Status: trajectory.StatusOK, DriftTokens: int32(seq.DriftTokens), UnscoredTokens: int32(seq.Unscored), CreatedAt: ro.Created,
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
	if n := len(seq.Tokens); n > 0 {
		rec.PromptTokens = int32(min(seq.PromptLen, n))
		rec.CompletionTokens = int32(n) - rec.PromptTokens
	} else {
		rec.PromptTokens = int32(res.Counters.PromptTokens)
		rec.CompletionTokens = int32(res.Counters.CompletionTokens)
	}
	if len(rec.Logprobs) != len(rec.Tokens) {
		// Logprobs are all-or-nothing per record: never misaligned.
		rec.Logprobs = nil
	} else if rec.Logprobs != nil {
		rec.Logprobs = append([]float32(nil), rec.Logprobs...)
	}
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
	versions(&rec, g, ro)
	rec.DeriveTrainingFields()
	return rec, nil
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
func versions(rec *trajectory.Record, g *runner.Group, ro *runner.Rollout) {
	seq := &ro.Result.Sequence
	rec.Stale = g.Stale
	if len(seq.Versions) != len(seq.Tokens) || len(seq.Tokens) == 0 || ro.Status != runner.StatusOK {
		return
	}
	rec.TokenVersions = append([]int64(nil), seq.Versions...)
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
