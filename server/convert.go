package server

import (
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
	pr.LossMask = make([]int32, len(rec.LossMask))
	for k, m := range rec.LossMask {
		pr.LossMask[k] = int32(m)
	}
	return pr
}
