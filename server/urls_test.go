package server

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/internal/util/netpolicy"
)

// A job naming a loopback URL is refused before it starts, naming the key
// and the flag, unless the server's policy allows the address; a
// CollectGroups stream likewise.
func TestNetPolicy(t *testing.T) {
	s := newSim(t, "toolcall-match", -1)
	refuse, err := netpolicy.New(nil, "rollout serve --allow-net")
	if err != nil {
		t.Fatal(err)
	}
	h := startServer(t, Options{NetPolicy: refuse}, RunOptions{})
	ctx := bg(t)
	_, err = h.cli.StartJob(ctx, startReq(jobYAML(s.URL, "runs/refused", 1, 2), ""))
	wantCode(t, "a job whose endpoint is on loopback", err, codes.PermissionDenied, "inference.endpoints[0]")
	mcp := jobYAML("https://93.184.215.14", "runs/mcp", 1, 2) + "mcp_servers: [{name: local, url: 'http://localhost:8931/mcp'}]\n"
	_, err = h.cli.StartJob(ctx, startReq(mcp, ""))
	wantCode(t, "a job whose MCP server resolves to loopback", err, codes.PermissionDenied, "mcp_servers[0].url")
	if err != nil && !strings.Contains(err.Error(), "--allow-net") {
		t.Errorf("the refusal does not name the flag: %v", err)
	}
	stream, err := h.cli.CollectGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Start{Start: &rolloutv1.CollectStart{
		ConfigYaml: jobYAML(s.URL, "", 0, 2)}}}); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	wantCode(t, "a stream whose endpoint is on loopback", err, codes.PermissionDenied, "start.config_yaml: inference.endpoints[0]")

	allow, err := netpolicy.New([]string{"127.0.0.0/8"}, "rollout serve --allow-net")
	if err != nil {
		t.Fatal(err)
	}
	h2 := startServer(t, Options{NetPolicy: allow}, RunOptions{})
	job := h2.start(t, startReq(jobYAML(s.URL, "runs/allowed", 1, 2), ""))
	if res := h2.watch(ctx, job.Id, false, nil); res.err != nil || res.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("a job on an allowed address: %v (%v)", res.finished, res.err)
	}
}
