package runner

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/internal/util/tracing"
)

const tracer = tracing.Tracer("github.com/rollout-rl/rollout/runner")

// Span attributes of this package.
const (
	attrIndex       = attribute.Key("rollout.index")
	attrAttempt     = attribute.Key("rollout.attempt")
	attrStatus      = attribute.Key("rollout.status")
	attrFailure     = attribute.Key("rollout.failure_kind")
	attrReward      = attribute.Key("rollout.reward")
	attrTurns       = attribute.Key("rollout.turns")
	attrStopReason  = attribute.Key("rollout.stop_reason")
	attrGroupSize   = attribute.Key("rollout.group.size")
	attrGroupOK     = attribute.Key("rollout.group.ok")
	attrGroupMean   = attribute.Key("rollout.group.mean")
	attrGroupStd    = attribute.Key("rollout.group.std")
	attrDropped     = attribute.Key("rollout.group.dropped")
	attrPolicyVer   = attribute.Key("rollout.policy_version")
	attrImage       = attribute.Key("rollout.sandbox.image")
	attrRewardError = attribute.Key("rollout.reward.error")
)

// startGroup starts the span of one group (parent of its rollouts).
func (r *Runner) startGroup(ctx context.Context, it datasets.Item, size int) (context.Context, trace.Span) {
	ctx, span := tracer.Start(ctx, "runner.group")
	if span.IsRecording() {
		span.SetAttributes(tracing.RunID.String(r.info.RunID), tracing.Env.String(r.info.Env),
			tracing.GroupID.String(it.Key()), attrGroupSize.Int(size))
	}
	return ctx, span
}

func endGroup(span trace.Span, g *Group) {
	if span.IsRecording() {
		span.SetAttributes(attrGroupOK.Int(g.OK), attrGroupMean.Float64(g.Mean), attrGroupStd.Float64(g.Std), attrDropped.Bool(g.Dropped))
		if g.PolicyVersion != nil {
			span.SetAttributes(attrPolicyVer.Int64(*g.PolicyVersion))
		}
	}
	span.End()
}

// startRollout starts the span of one attempt of a rollout: the parent of
// its sandbox, turns and reward.
func (r *Runner) startRollout(ctx context.Context, groupID string, idx, attempt int) (context.Context, trace.Span) {
	ctx, span := tracer.Start(ctx, "runner.rollout")
	if span.IsRecording() {
		span.SetAttributes(tracing.RunID.String(r.info.RunID), tracing.Env.String(r.info.Env), tracing.GroupID.String(groupID),
			attrIndex.Int(idx), attrAttempt.Int(attempt))
		if r.cfg.Inference.Model != "" {
			span.SetAttributes(tracing.Model.String(r.cfg.Inference.Model))
		}
	}
	return ctx, span
}

// endRollout records the attempt's outcome: an infra failure fails the
// span with its kind and message; an ok rollout carries its reward.
func endRollout(span trace.Span, ro *Rollout) {
	if span.IsRecording() {
		span.SetAttributes(tracing.Rollout.String(ro.ID), attrStatus.String(ro.Status), attrTurns.Int(ro.Result.TurnsUsed))
		if ro.Result.StopReason != "" {
			span.SetAttributes(attrStopReason.String(string(ro.Result.StopReason)))
		}
		if ro.Failure != nil {
			span.SetAttributes(attrFailure.String(ro.Failure.Kind))
			tracing.FailMsg(span, ro.Failure.Kind+": "+ro.Failure.Message)
		} else {
			span.SetAttributes(attrReward.Float64(ro.Score.Value))
		}
	}
	span.End()
}

// startSandbox starts the span of opening a rollout's sandbox: image
// build, waiting for a sandbox slot, and the backend's Create.
func startSandbox(ctx context.Context) (context.Context, trace.Span) {
	return tracer.Start(ctx, "runner.sandbox")
}

func endSandbox(span trace.Span, ro *Rollout, err error) {
	if span.IsRecording() {
		if ro.Image != "" {
			span.SetAttributes(attrImage.String(ro.Image))
		}
		tracing.Fail(span, err)
	}
	span.End()
}

// startReward starts the span of the env's reward.
func startReward(ctx context.Context) (context.Context, trace.Span) {
	return tracer.Start(ctx, "runner.reward")
}

func endReward(span trace.Span, value float64, err error) {
	if span.IsRecording() {
		if err != nil {
			span.SetAttributes(attrRewardError.String(tracing.Cut(err.Error())))
			tracing.Fail(span, err)
		} else {
			span.SetAttributes(attrReward.Float64(value))
		}
	}
	span.End()
}
