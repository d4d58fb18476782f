package runner

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/inference"
)

// distill asks the teacher for its top-K logprobs at every trained
// position of the rollout's sequence (the student's exact ids), then, with
// a Hinter, replaces the turns it found a hint for with their scores under
// the hint-enhanced context and records each hint as a loop event.
func (r *Runner) distill(ctx context.Context, ro *Rollout, first int, kwargs map[string]any) error {
	seq := ro.Result.Sequence
	if len(seq.Tokens) == 0 || !slices.Contains(seq.Mask, 1) {
		return nil
	}
	t0 := time.Now()
	defer func() { ro.Timings.Distill = time.Since(t0) }()
	d, err := teach(ctx, r.deps.Distiller, seq)
	if err != nil {
		return fmt.Errorf("distill: %w", err)
	}
	ids, lps := d.TokenIDs, d.Logprobs
	if r.deps.Hinter != nil {
		hinted, st, err := r.deps.Hinter.HintTurns(ctx, inference.HintInput{
			Messages: ro.Result.Messages, First: first, Tools: ro.Tools, ChatTemplateKwargs: kwargs, Sequence: seq,
		})
		if err != nil {
			return fmt.Errorf("distill hints: %w", err)
		}
		if st.Unreadable > 0 {
			level := slog.LevelDebug
			if r.hintWarned.CompareAndSwap(false, true) {
				level = slog.LevelWarn
			}
			r.log.Log(ctx, level, "hint judge replies without a verdict (\\boxed{1} or \\boxed{-1}) count for no hint; rollout_distill_hint_votes_total{verdict=\"unreadable\"} counts them",
				"rollout", ro.ID, "unreadable", st.Unreadable, "turns_judged", st.Judged)
		}
		for _, h := range hinted {
			for j := range h.IDs {
				if h.IDs[j] != nil {
					ids[h.Start+j], lps[h.Start+j] = h.IDs[j], h.Logprobs[j]
				}
			}
			ro.Result.Events = append(ro.Result.Events, agentloop.Event{
				Turn: h.Turn + 1, Kind: agentloop.EventDistillHint, Message: h.Message,
				Detail: h.Hint, Original: fmt.Sprintf("%d of %d votes", h.Positive, h.Votes),
			})
		}
		slices.SortStableFunc(ro.Result.Events, func(a, b agentloop.Event) int { return a.Turn - b.Turn })
	}
	ro.DistillTokenIDs, ro.DistillLogprobs = ids, lps
	return nil
}

// teach asks the teacher d for its top-K at every trained position of seq
// (the student's exact ids, up to the last trained one) and pads the
// answer to the sequence's length. A sequence with nothing trained gets
// nothing.
func teach(ctx context.Context, d Distiller, seq inference.Sequence) (Distilled, error) {
	last := len(seq.Mask) - 1
	for last >= 0 && seq.Mask[last] == 0 {
		last--
	}
	if last < 0 || last >= len(seq.Tokens) {
		return Distilled{}, nil
	}
	ids, lps, err := d.Score(ctx, seq.Tokens[:last+1], func(p int) bool { return seq.Mask[p] == 1 })
	if err != nil {
		return Distilled{}, err
	}
	for len(ids) < len(seq.Tokens) {
		ids, lps = append(ids, nil), append(lps, nil)
	}
	return Distilled{TokenIDs: ids, Logprobs: lps}, nil
}

// DistillBranches scores every branch of a gateway session's rollout with
// the teacher d, as the own loop's sequence is scored (harness envs and
// the standalone gateway; hints judge the own loop's turns and are not
// asked for here). It sets ro.BranchDistill, and branch 0's scores as the
// rollout's own.
func DistillBranches(ctx context.Context, d Distiller, ro *Rollout) error {
	if ro.Session == nil {
		return nil
	}
	t0 := time.Now()
	defer func() { ro.Timings.Distill = time.Since(t0) }()
	out := make([]Distilled, len(ro.Session.Branches))
	for i, b := range ro.Session.Branches {
		dd, err := teach(ctx, d, b.Sequence)
		if err != nil {
			return fmt.Errorf("distill: session branch %d: %w", b.Index, err)
		}
		out[i] = dd
	}
	ro.BranchDistill = out
	if len(out) > 0 {
		ro.DistillTokenIDs, ro.DistillLogprobs = out[0].TokenIDs, out[0].Logprobs
	}
	return nil
}
