package server

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
)

// A client past its quotas gets RESOURCE_EXHAUSTED with a message naming
// the quota; a slot frees when a job ends.
func TestQuotas(t *testing.T) {
	s := newSim(t, "toolcall-match", 0) // generations wait at the gate
	h := startServer(t, Options{Quotas: Quotas{Jobs: 1, Sandboxes: 8, Rows: 100}}, RunOptions{})
	ctx := bg(t)

	_, err := h.cli.StartJob(ctx, startReq(jobYAML(s.URL, "runs/rows", 30, 4), ""))
	wantCode(t, "120 rows with a quota of 100", err, codes.ResourceExhausted, "quota-rows")
	cfg := strings.Replace(jobYAML(s.URL, "runs/boxes", 1, 2), "limits: {groups_in_flight: 1}", "limits: {groups_in_flight: 1, sandboxes: 9}", 1)
	_, err = h.cli.StartJob(ctx, startReq(cfg, ""))
	wantCode(t, "9 sandboxes with a quota of 8", err, codes.ResourceExhausted, "quota-sandboxes")

	small := func(out string) string {
		return strings.Replace(jobYAML(s.URL, out, 1, 2), "limits: {groups_in_flight: 1}", "limits: {groups_in_flight: 1, sandboxes: 8}", 1)
	}
	first := h.start(t, startReq(small("runs/first"), ""))
	s.waitBlocked(t, 1)
	_, err = h.cli.StartJob(ctx, startReq(small("runs/second"), ""))
	wantCode(t, "a second job with a quota of 1", err, codes.ResourceExhausted, "quota-jobs")

	s.open()
	res := h.watch(ctx, first.Id, false, nil)
	if res.err != nil || res.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("first job: %v (%v)", res.finished, res.err)
	}
	waitFor(t, "the first job's quota released", func() bool {
		h.svc.quota.mu.Lock()
		defer h.svc.quota.mu.Unlock()
		return len(h.svc.quota.held) == 0
	})
	second := h.start(t, startReq(small("runs/second"), ""))
	if res := h.watch(ctx, second.Id, false, nil); res.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("second job after the first ended: %v (%v)", res.finished, res.err)
	}
}
