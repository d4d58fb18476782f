package server

import (
	"testing"
	"time"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
)

// A draining cancel ends the job even when its in-flight generations never
// return (a hung server whose /health still answers): past the cancel
// grace they are cancelled, and the partial group is not written.
func TestCancelJobGraceBoundsTheDrain(t *testing.T) {
	s := newSim(t, "toolcall-match", 4) // two groups of two pass; the third hangs
	h := startServer(t, Options{CancelGrace: 200 * time.Millisecond}, RunOptions{})
	t.Cleanup(s.open)
	ctx := bg(t)
	j := h.start(t, startReq(jobYAML(s.URL, "runs/grace", 0, 2), ""))
	reached := make(chan struct{})
	watched := h.watchAsync(t, j.Id, true, progressAtLeast(2, reached))
	wait(t, "two groups", reached)
	s.waitBlocked(t, 2)
	if _, err := h.cli.CancelJob(ctx, &rolloutv1.CancelJobRequest{JobId: j.Id}); err != nil {
		t.Fatal(err)
	}
	// The gate stays shut: only the grace can end the job.
	res := wait(t, "the watch to end", watched)
	if res.err != nil {
		t.Fatalf("watch: %v", res.err)
	}
	if res.finished.GetState() != rolloutv1.JobState_JOB_STATE_CANCELLED || res.finished.Progress.GroupsDone != 2 {
		t.Fatalf("final job %v", res.finished)
	}
	if recs := readRun(t, j.OutputDir); len(recs) != 2 {
		t.Errorf("%d groups on disk, want the 2 finished ones", len(recs))
	}
}
