package server

import (
	"context"
	"errors"
	"fmt"
	"math"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/rollout-rl/rollout/assemble"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

// groupProto converts a finished group. The token columns come from the
// same conversion as the Parquet rows (assemble.Record), so a trainer reading the
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
		recs, err := assemble.Records(run, g, ro)
		if err != nil {
			return nil, err
		}
		out.Rollouts[i] = sessionProto(recs, ro.ID, ro.Attempts)
	}
	return out, nil
}

// sessionProto is the message of one rollout from its rows: branch 0's
// row, with the other branches' rows in branches.
func sessionProto(recs []trajectory.Record, rolloutID string, attempts int) *rolloutv1.Rollout {
	pr := RolloutProto(&recs[0], rolloutID, attempts)
	for k := range recs[1:] {
		pr.Branches = append(pr.Branches, RolloutProto(&recs[k+1], rolloutID, attempts))
	}
	return pr
}

// RolloutProto is the stream message of one rollout's trajectory record
// (tokens, loss mask, logprobs, scores and status exactly as in Parquet).
func RolloutProto(rec *trajectory.Record, rolloutID string, attempts int) *rolloutv1.Rollout {
	pr := &rolloutv1.Rollout{
		Index: rec.RolloutIndex, RolloutId: rolloutID, Status: rec.Status, Reward: rec.Reward,
		RewardComponents: rec.RewardComponents, Advantage: rec.Advantage, Tokens: rec.Tokens,
		Logprobs: rec.Logprobs, PromptTokens: rec.PromptTokens, CompletionTokens: rec.CompletionTokens,
		Turns: rec.Turns, FinishedNaturally: rec.FinishedNaturally, StopReason: rec.StopReason,
		MessagesJson: rec.Messages, DriftTokens: rec.DriftTokens, UnscoredTokens: rec.UnscoredTokens, Attempts: int32(attempts),
		SessionId: rec.SessionID, Branch: rec.Branch, ParentBranch: rec.ParentBranch, SplitCall: rec.SplitCall,
		SharedTokens: rec.SharedTokens, CallsJson: rec.Calls,
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
	pr.TurnRewards = rec.TurnRewards
	for _, c := range rec.CallStatuses {
		pr.CallStatuses = append(pr.CallStatuses, &rolloutv1.CallStatus{Turn: c.Turn, Index: c.Index, Name: c.Name, Status: c.Status, Reason: c.Reason, SpanStart: c.SpanStart, SpanEnd: c.SpanEnd})
	}
	if len(rec.RoutedExperts) > 0 {
		pr.RoutedExperts = make([]uint32, len(rec.RoutedExperts))
		for k, e := range rec.RoutedExperts {
			pr.RoutedExperts[k] = uint32(e)
		}
		pr.RoutedExpertsShape = rec.RoutedExpertsShape
	}
	if len(rec.DistillTokenIDs) > 0 {
		pr.Distill = make([]*rolloutv1.TeacherTopK, len(rec.DistillTokenIDs))
		for k, ids := range rec.DistillTokenIDs {
			tk := &rolloutv1.TeacherTopK{TokenIds: ids}
			if k < len(rec.DistillLogprobs) {
				tk.Logprobs = rec.DistillLogprobs[k]
			}
			pr.Distill[k] = tk
		}
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
		PolicyVersion: r0.PolicyVersion, Sequence: &seq}
	// A rollout's branches follow its main row (a group is written as one
	// unit, each rollout's rows together, branch 0 first).
	var sum float64
	ok := 0
	for i := range recs {
		rec := &recs[i]
		pr := RolloutProto(rec, fmt.Sprintf("%s#%d", rec.GroupID, rec.RolloutIndex), 0)
		if !rec.Main() && len(out.Rollouts) > 0 && out.Rollouts[len(out.Rollouts)-1].Index == rec.RolloutIndex {
			last := out.Rollouts[len(out.Rollouts)-1]
			last.Branches = append(last.Branches, pr)
			continue
		}
		out.Rollouts = append(out.Rollouts, pr)
		if rec.Status == trajectory.StatusOK {
			ok++
			sum += rec.Reward
		}
	}
	recs = trajectory.MainRows(recs)
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
	return replayGroupsWhere(ctx, dir, from, dropEqual, nil, fn)
}

// replayGroupsWhere is replayGroups over the stored groups keep accepts
// (nil: all).
func replayGroupsWhere(ctx context.Context, dir string, from int64, dropEqual bool, keep func([]trajectory.Record) bool, fn func(*rolloutv1.Group) error) error {
	run, err := trajectory.Open(dir)
	if errors.Is(err, trajectory.ErrNoManifest) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("replay groups of %s: %w", dir, err)
	}
	return run.EachGroup(ctx, func(seq int64, recs []trajectory.Record) error {
		if seq < from || keep != nil && !keep(recs) {
			return nil
		}
		return fn(storedGroupProto(recs, seq, dropEqual))
	})
}

// Token layouts (docs/api.md, "Token layout"). The full layout is what
// RolloutProto builds; a stream that asks for TOKEN_LAYOUT_COMPACT gets
// every rollout through CompactRollout, and clients turn either layout back
// into the full one with ExpandRollout.

// checkLayout refuses a token layout this server does not know.
func checkLayout(field string, l rolloutv1.TokenLayout) error {
	if _, ok := rolloutv1.TokenLayout_name[int32(l)]; !ok {
		return status.Errorf(codes.InvalidArgument, "%s: unknown token layout %d (this server knows full and compact)", field, int32(l))
	}
	return nil
}

// compactLayout reports whether a stream asked for the compact layout.
func compactLayout(l rolloutv1.TokenLayout) bool {
	return l == rolloutv1.TokenLayout_TOKEN_LAYOUT_COMPACT
}

// CompactGroup returns g with every rollout in the compact layout. g is not
// modified (it may be shared by several streams); the result shares its
// token ids and text.
func CompactGroup(g *rolloutv1.Group) *rolloutv1.Group {
	if g == nil {
		return nil
	}
	out := shallowClone(g)
	out.Rollouts = make([]*rolloutv1.Rollout, len(g.Rollouts))
	for i, r := range g.Rollouts {
		out.Rollouts[i] = CompactRollout(r)
	}
	return out
}

// CompactRollout returns r in the compact layout: loss_mask as the lengths
// of its alternating runs (loss_mask_runs) and, when every untrained
// position holds the 1.0 placeholder and at least one position is trained,
// only the trained positions' logprobs (trained_logprobs). A column that
// does not fit (a mask value other than 0 and 1, logprobs not aligned or
// with a real value at an untrained position) stays in the full layout, so
// nothing is lost. r is not modified.
func CompactRollout(r *rolloutv1.Rollout) *rolloutv1.Rollout {
	if r == nil || len(r.LossMask) == 0 {
		return r
	}
	runs, ok := maskRuns(r.LossMask)
	if !ok {
		return r
	}
	out := shallowClone(r)
	out.LossMask, out.LossMaskRuns = nil, runs
	if tl, ok := trainedLogprobs(r.LossMask, r.Logprobs); ok {
		out.Logprobs, out.TrainedLogprobs = nil, tl
	}
	if len(r.Branches) > 0 {
		out.Branches = make([]*rolloutv1.Rollout, len(r.Branches))
		for i, b := range r.Branches {
			out.Branches[i] = CompactRollout(b)
		}
	}
	return out
}

// maskRuns returns the lengths of the alternating runs of mask, starting
// with a run of 0s (possibly empty); false when a value is not 0 or 1.
func maskRuns(mask []int32) ([]int32, bool) {
	var runs []int32
	cur, n := int32(0), int32(0)
	for _, m := range mask {
		if m != 0 && m != 1 {
			return nil, false
		}
		if m != cur {
			runs = append(runs, n)
			cur, n = m, 0
		}
		n++
	}
	return append(runs, n), true
}

// trainedLogprobs returns the logprobs at the trained positions when the
// untrained ones are all the placeholder and at least one is trained.
func trainedLogprobs(mask []int32, lps []float32) ([]float32, bool) {
	if len(lps) != len(mask) {
		return nil, false
	}
	placeholder := math.Float32bits(trajectory.LogprobPlaceholder)
	trained := 0
	for _, m := range mask {
		if m == 1 {
			trained++
		}
	}
	if trained == 0 {
		return nil, false
	}
	out := make([]float32, 0, trained)
	for i, m := range mask {
		if m == 1 {
			out = append(out, lps[i])
		} else if math.Float32bits(lps[i]) != placeholder {
			return nil, false
		}
	}
	return out, true
}

// ExpandRollout turns a rollout received in either layout into the full
// layout in place: loss_mask from loss_mask_runs and logprobs from
// trained_logprobs (1.0 on untrained positions). A rollout already in the
// full layout is left as it is. Inconsistent compact fields (runs that do
// not add up to the tokens, a trained_logprobs count that is not the
// number of trained positions, both layouts at once) are an error.
func ExpandRollout(r *rolloutv1.Rollout) error {
	for _, b := range r.Branches {
		if err := ExpandRollout(b); err != nil {
			return fmt.Errorf("rollout %d branch %d: %w", r.Index, b.Branch, err)
		}
	}
	if len(r.LossMaskRuns) > 0 {
		if len(r.LossMask) > 0 {
			return fmt.Errorf("rollout %d: both loss_mask and loss_mask_runs are set", r.Index)
		}
		var total int64
		for _, n := range r.LossMaskRuns {
			if n < 0 {
				return fmt.Errorf("rollout %d: negative run %d in loss_mask_runs", r.Index, n)
			}
			total += int64(n)
		}
		if total != int64(len(r.Tokens)) {
			return fmt.Errorf("rollout %d: loss_mask_runs cover %d positions, the rollout has %d tokens", r.Index, total, len(r.Tokens))
		}
		mask := make([]int32, total)
		pos := 0
		for i, n := range r.LossMaskRuns {
			if i%2 == 1 {
				for k := range int(n) {
					mask[pos+k] = 1
				}
			}
			pos += int(n)
		}
		r.LossMask, r.LossMaskRuns = mask, nil
	}
	if len(r.TrainedLogprobs) > 0 {
		if len(r.Logprobs) > 0 {
			return fmt.Errorf("rollout %d: both logprobs and trained_logprobs are set", r.Index)
		}
		trained := 0
		for _, m := range r.LossMask {
			if m == 1 {
				trained++
			}
		}
		if trained != len(r.TrainedLogprobs) {
			return fmt.Errorf("rollout %d: %d trained_logprobs for %d trained positions", r.Index, len(r.TrainedLogprobs), trained)
		}
		lps := make([]float32, len(r.LossMask))
		k := 0
		for i, m := range r.LossMask {
			if m == 1 {
				lps[i] = r.TrainedLogprobs[k]
				k++
			} else {
				lps[i] = trajectory.LogprobPlaceholder
			}
		}
		r.Logprobs, r.TrainedLogprobs = lps, nil
	}
	return nil
}

// ExpandGroup applies ExpandRollout to every rollout of g.
func ExpandGroup(g *rolloutv1.Group) error {
	for _, r := range g.GetRollouts() {
		if err := ExpandRollout(r); err != nil {
			return fmt.Errorf("group %s: %w", g.GroupId, err)
		}
	}
	return nil
}

// shallowClone copies m's populated fields into a new message of its type;
// repeated fields, maps and sub-messages are shared, not copied.
func shallowClone[M proto.Message](m M) M {
	src := m.ProtoReflect()
	dst := src.New()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dst.Set(fd, v)
		return true
	})
	return dst.Interface().(M)
}
