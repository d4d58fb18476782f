package server

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/image"
)

// needDocker ensures the busybox sandbox image, skipping without an engine
// (failing under CI=true, where Docker is required).
func needDocker(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ref, err := image.EnsureBusybox(ctx)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Docker is required in CI: %v", err)
		}
		t.Skipf("no usable Docker engine: %v", err)
	}
	return ref
}

// TestDockerJob runs a sandboxed env through the server with the shared
// Docker backend `rollout serve` uses: tool calls and rewards run in
// containers, and closing the backend after the shutdown leaves none.
func TestDockerJob(t *testing.T) {
	ref := needDocker(t)
	shared, instance := newShared(t, "servertest")

	h := startServer(t, Options{Sandboxes: shared, Images: shared}, RunOptions{})
	runTerminalTasksJob(t, h, ref, 2, "", "", "runs/docker")

	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := shared.Close(ctx); err != nil {
		t.Fatalf("close the sandbox backend: %v", err)
	}
	checkNoContainers(t, instance, "after the shared backend closed")
}

// TestRuncJob runs the same job with sandbox.backend runc: the server's
// shared runc backend starts the sandboxes with runc directly, and closing
// it leaves no container state, layer or bundle of its instance.
func TestRuncJob(t *testing.T) {
	ref := needDocker(t)
	if os.Geteuid() != 0 {
		t.Skip("the runc backend needs root")
	}
	shared, instance := newShared(t, "servertest")
	h := startServer(t, Options{Sandboxes: shared, Images: shared}, RunOptions{})
	before := runcRuns(t)
	runTerminalTasksJob(t, h, ref, 2, ", backend: runc", "", "runs/runc")
	if n := runcRuns(t) - before; n < 4 {
		t.Errorf("%d containers started by runc for 4 rollouts", n)
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := shared.Close(ctx); err != nil {
		t.Fatalf("close the sandbox backends: %v", err)
	}
	prefix := "rollout-" + instance + "-r-"
	for _, dir := range []string{"/run/rollout-runc/runc", "/run/rollout-runc/bundles", "/var/lib/rollout/runc/layers"} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), prefix) {
				t.Errorf("%s/%s left after the shared backend closed", dir, e.Name())
			}
		}
	}
	checkNoContainers(t, instance, "after the shared backend closed")
}

// runcRuns counts the runc backend's container starts so far (the
// process's rollout_sandbox_daemon_seconds{op="runc_run"} samples).
func runcRuns(t *testing.T) uint64 {
	return histogramCount(t, "rollout_sandbox_daemon_seconds", "op", "runc_run")
}

// runTerminalTasksJob runs terminal-tasks on h against a simulator of its
// own, groups of 2 in sandboxes of image ref (sandboxKeys: more keys of the
// sandbox block, from ", "; extra: more config lines), and requires every
// rollout to succeed with its tool calls sandboxed.
func runTerminalTasksJob(t *testing.T, h *harness, ref string, groups int32, sandboxKeys, extra, dir string) {
	t.Helper()
	s := newSim(t, "terminal-tasks", -1)
	cfg := fmt.Sprintf(`env: terminal-tasks
groups: %d
group_size: 2
inference:
  backend: vllm
  endpoints: [%s]
  timeout: 2m
parser: hermes
sampling: {max_tokens: 1024}
sandbox: {image: %s%s}
output: {dir: %s}
%s
`, groups, s.URL, ref, sandboxKeys, dir, extra)
	j := h.start(t, startReq(cfg, ""))
	res := h.watch(bg(t), j.Id, true, nil)
	if res.err != nil || res.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("job: %v (%v)", res.finished, res.err)
	}
	if p := res.finished.Progress; p.GroupsDone != groups || p.RolloutsOk != 2*groups {
		t.Errorf("progress %v", p)
	}
	backend := sandbox.BackendDocker
	if strings.Contains(sandboxKeys, "backend: runc") {
		backend = sandbox.BackendRunc
	}
	checkSandboxedRun(t, j.OutputDir, int(groups), backend)
}

// checkNoContainers fails the test for every container of the instance.
func checkNoContainers(t *testing.T, instance, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := dockerclient.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", sandbox.LabelInstance+"="+instance)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Items {
		t.Errorf("container %s left behind %s (%s)", c.ID[:12], when, c.State)
	}
}

// TestDockerJobReuse runs a job with sandbox.reuse through the server's
// shared backend: its groups' sandboxes are started ahead from the shared
// warm pool, each is reset in place for the job's next rollouts, and when
// the job ends its sandboxes are gone although the backend stays up.
func TestDockerJobReuse(t *testing.T) {
	ref := needDocker(t)
	shared, instance := newShared(t, "servertest")

	h := startServer(t, Options{Sandboxes: shared, Images: shared}, RunOptions{})
	runTerminalTasksJob(t, h, ref, 6, ", read_only_root: true, reuse: true", "limits: {groups_in_flight: 1}", "runs/reuse")
	// One group of 2 at a time: the later groups run in the first group's
	// two containers, reset in place.
	if n, _ := shared.Resets(); n < 6 {
		t.Errorf("%v resets in place over 12 rollouts in groups of 2: reuse did not happen", n)
	}
	checkNoContainers(t, instance, "after the job ended")
}

// TestRuncJobReuse is TestDockerJobReuse on the shared runc backend.
func TestRuncJobReuse(t *testing.T) {
	ref := needDocker(t)
	if os.Geteuid() != 0 {
		t.Skip("the runc backend needs root")
	}
	shared, _ := newShared(t, "servertest")
	h := startServer(t, Options{Sandboxes: shared, Images: shared}, RunOptions{})
	runTerminalTasksJob(t, h, ref, 6, ", backend: runc, read_only_root: true, reuse: true", "limits: {groups_in_flight: 1}", "runs/runc-reuse")
	if n, _ := shared.Resets(); n < 6 {
		t.Errorf("%v resets in place over 12 rollouts in groups of 2: reuse did not happen", n)
	}
}
