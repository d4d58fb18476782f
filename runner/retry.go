package runner

import (
	"context"
	"math"
	rnd "math/rand/v2"
	"time"
)

func (r *Runner) runWithRetries(ctx context.Context, gr *groupRun, idx int) Rollout {
	log := gr.log
	var ro Rollout
	for attempt := 1; ; attempt++ {
		actx, span := r.startRollout(ctx, gr.item.Key(), idx, attempt)
		ro = r.attempt(actx, gr, idx)
		ro.Attempts = attempt
		endRollout(span, &ro)
		if ro.Status == StatusOK || attempt > max(r.cfg.Retries, 0) || ctx.Err() != nil || !retryable(ro.Failure.Kind) || ro.deterministic {
			return ro
		}
		log.Warn("rollout infra failure, retrying", "rollout", ro.ID, "kind", ro.Failure.Kind, "error", ro.Failure.Message, "attempt", attempt)
		select {
		case <-ctx.Done():
			return ro
		case <-time.After(backoff(attempt)):
		}
	}
}

// retryable: a failure that another attempt may not meet again. A
// rejected request (inference_rejected: the server refused what we sent,
// e.g. a 4xx, or a 5xx the inference package classes as caused by the
// request's content) is not: the same conversation would be refused again.
func retryable(kind string) bool {
	switch kind {
	case FailTask, FailCancelled, FailPanic, FailRejected:
		return false
	}
	return true
}

func backoff(attempt int) time.Duration {
	d := time.Duration(200*math.Pow(2, float64(attempt-1))) * time.Millisecond
	return min(d, 5*time.Second) + time.Duration(rnd.Int64N(int64(100*time.Millisecond)))
}
