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
	last := len(seq.Mask) - 1
	for seq.Mask[last] == 0 {
		last--
	}
	t0 := time.Now()
	defer func() { ro.Timings.Distill = time.Since(t0) }()
	ids, lps, err := r.deps.Distiller.Score(ctx, seq.Tokens[:last+1], func(p int) bool { return seq.Mask[p] == 1 })
	if err != nil {
		return fmt.Errorf("distill: %w", err)
	}
	for len(ids) < len(seq.Tokens) {
		ids, lps = append(ids, nil), append(lps, nil)
	}
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
