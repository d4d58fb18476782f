package server

import (
	"testing"

	"google.golang.org/grpc/codes"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
)

// BeginPolicyUpdate/EndPolicyUpdate address a StartJob job by its id and
// a CollectGroups stream by its stream_id, and refuse bad requests with
// the field named.
func TestPolicyUpdateRPCs(t *testing.T) {
	s := newSim(t, "toolcall-match", 0) // generations wait at the gate: the job stays running
	h := startServer(t, Options{}, RunOptions{})
	ctx := bg(t)
	j := h.start(t, startReq(jobYAML(s.URL, "runs/upd", 2, 2), "upd"))
	s.waitBlocked(t, 1)

	_, err := h.cli.BeginPolicyUpdate(ctx, &rolloutv1.BeginPolicyUpdateRequest{})
	wantCode(t, "empty id", err, codes.InvalidArgument, "job_id")
	_, err = h.cli.BeginPolicyUpdate(ctx, &rolloutv1.BeginPolicyUpdateRequest{JobId: "nope", Version: 1})
	wantCode(t, "unknown id", err, codes.NotFound, "nope")
	_, err = h.cli.BeginPolicyUpdate(ctx, &rolloutv1.BeginPolicyUpdateRequest{JobId: j.Id, Version: 1, Mode: "freeze"})
	wantCode(t, "bad mode", err, codes.InvalidArgument, "mode")
	_, err = h.cli.EndPolicyUpdate(ctx, &rolloutv1.EndPolicyUpdateRequest{JobId: j.Id, Version: 1})
	wantCode(t, "end without begin", err, codes.FailedPrecondition, "BeginUpdate")

	b, err := h.cli.BeginPolicyUpdate(ctx, &rolloutv1.BeginPolicyUpdateRequest{JobId: j.Id, Version: 1, Mode: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	if b.Fallback || b.CurrentVersion != 0 {
		t.Fatalf("begin: %v", b)
	}
	_, err = h.cli.BeginPolicyUpdate(ctx, &rolloutv1.BeginPolicyUpdateRequest{JobId: j.Id, Version: 1, Mode: "keep"})
	wantCode(t, "second begin", err, codes.FailedPrecondition, "already in progress")
	e, err := h.cli.EndPolicyUpdate(ctx, &rolloutv1.EndPolicyUpdateRequest{JobId: j.Id, Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	if e.Version != 1 {
		t.Fatalf("end: %v", e)
	}
	_, err = h.cli.BeginPolicyUpdate(ctx, &rolloutv1.BeginPolicyUpdateRequest{JobId: j.Id, Version: 0})
	wantCode(t, "version going back", err, codes.InvalidArgument, "older")

	// A stream_id may not name a running job.
	stream, err := h.cli.CollectGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Start{Start: &rolloutv1.CollectStart{
		ConfigYaml: jobYAML(s.URL, "", 0, 2), StreamId: j.Id}}}); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	wantCode(t, "stream_id taken", err, codes.AlreadyExists, "stream_id")

	s.open()
	if _, err := h.cli.CancelJob(ctx, &rolloutv1.CancelJobRequest{JobId: j.Id, CancelInFlight: true}); err != nil {
		t.Fatal(err)
	}
	h.watch(ctx, j.Id, false, nil)
}
