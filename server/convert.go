package server

import (
	"context"
	"errors"
	"fmt"
	"math"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/internal/job"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

// groupProto converts a finished group. The token columns come from the
// same conversion as the Parquet rows (job.Record), so a trainer reading the
// stream and one reading the files see identical data.
func groupProto(run *runner.RunInfo, g *runner.Group) (*rolloutv1.Group, error) {
	out := &rolloutv1.Group{
		GroupId: g.ID, ItemId: g.Item.ID, Env: run.Env, Category: g.Task.Category, Dropped: g.Dropped,
		Mean: g.Mean, Std: g.Std, PolicyVersion: g.PolicyVersion, RequestId: g.RequestID,
		Rollouts: make([]*rolloutv1.Rollout, len(g.Rollouts)),
	}
	if out.PolicyVersion == nil {
		out.PolicyVersion = run.PolicyVersion
	}
	if g.Sequence >= 0 {
		seq := g.Sequence
		out.Sequence = &seq
	}
	out.Stale, out.Regenerated = g.Stale, int32(g.Regenerated)
	if v := g.Versions; v != nil {
		lo, hi, cur, lag := v.Min, v.Max, v.Current, v.Lag
		out.MinPolicyVersion, out.MaxPolicyVersion, out.CurrentPolicyVersion, out.PolicyLag = &lo, &hi, &cur, &lag
	}
	for i := range g.Rollouts {
		ro := &g.Rollouts[i]
		rec, err := job.Record(run, g, ro)
		if err != nil {
			return nil, err
		}
		out.Rollouts[i] = RolloutProto(&rec, ro.ID, ro.Attempts)
	}
	return out, nil
}

// RolloutProto is the stream message of one rollout's trajectory record
// (tokens, loss mask, logprobs, scores and status exactly as in Parquet).
func RolloutProto(rec *trajectory.Record, rolloutID string, attempts int) *rolloutv1.Rollout {
	pr := &rolloutv1.Rollout{
		Index: rec.RolloutIndex, RolloutId: rolloutID, Status: rec.Status, Reward: rec.Reward,
		RewardComponents: rec.RewardComponents, Advantage: rec.Advantage, Tokens: rec.Tokens,
		Logprobs: rec.Logprobs, PromptTokens: rec.PromptTokens, CompletionTokens: rec.CompletionTokens,
		Turns: rec.Turns, FinishedNaturally: rec.FinishedNaturally, StopReason: rec.StopReason,
		MessagesJson: rec.Messages, DriftTokens: rec.DriftTokens, Attempts: int32(attempts),
	}
	if rec.Failure != nil {
		pr.FailureKind, pr.FailureMessage = rec.Failure.Kind, rec.Failure.Message
	}
	pr.TokenVersions = rec.TokenVersions
	for _, c := range rec.VersionCuts {
		pr.VersionCuts = append(pr.VersionCuts, &rolloutv1.VersionCut{Turn: c.Turn, Position: c.Position, Kind: c.Kind, From: c.From, To: c.To})
	}
	pr.LossMask = make([]int32, len(rec.LossMask))
	for k, m := range rec.LossMask {
		pr.LossMask[k] = int32(m)
	}
	return pr
}

// storedGroupProto rebuilds the message of a group from its records in the
// run directory (a replay): mean, std and dropped are computed as the
// runner computes them; rollout ids and attempts are not stored, so the
// rollout id is "<group>#<index>" and attempts 0.
func storedGroupProto(recs []trajectory.Record, seq int64, dropEqual bool) *rolloutv1.Group {
	r0 := &recs[0]
	out := &rolloutv1.Group{GroupId: r0.GroupID, ItemId: r0.ItemID, Env: r0.Env, Category: r0.Category,
		PolicyVersion: r0.PolicyVersion, Sequence: &seq, Rollouts: make([]*rolloutv1.Rollout, len(recs))}
	var sum float64
	ok := 0
	for i := range recs {
		rec := &recs[i]
		out.Rollouts[i] = RolloutProto(rec, fmt.Sprintf("%s#%d", rec.GroupID, rec.RolloutIndex), 0)
		if rec.Status == trajectory.StatusOK {
			ok++
			sum += rec.Reward
		}
	}
	if ok == 0 {
		return out
	}
	out.Mean = sum / float64(ok)
	var ss float64
	equal := true
	for i := range recs {
		if recs[i].Status == trajectory.StatusOK {
			d := recs[i].Reward - out.Mean
			ss += d * d
			if math.Abs(d) > 1e-12 {
				equal = false
			}
		}
	}
	out.Std = math.Sqrt(ss / float64(ok))
	out.Dropped = dropEqual && equal
	return out
}

// replayGroups calls fn with the stored groups of the run directory dir
// whose sequence is at least from.
func replayGroups(ctx context.Context, dir string, from int64, dropEqual bool, fn func(*rolloutv1.Group) error) error {
	run, err := trajectory.Open(dir)
	if errors.Is(err, trajectory.ErrNoManifest) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("replay groups of %s: %w", dir, err)
	}
	return run.EachGroup(ctx, func(seq int64, recs []trajectory.Record) error {
		if seq < from {
			return nil
		}
		return fn(storedGroupProto(recs, seq, dropEqual))
	})
}
