package assemble_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/demo"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/image"
	"github.com/rollout-rl/rollout/trajectory"
)

func needDocker(t *testing.T) (string, *client.Client) {
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
	cli, err := dockerclient.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return ref, cli
}

func simURL(t *testing.T, env string) string {
	t.Helper()
	scripts, err := demo.EnvScripts(context.Background(), env, "train")
	if err != nil {
		t.Fatal(err)
	}
	h, err := sim.NewHandler(sim.Config{Family: "hermes", Seed: 7, SuccessProb: 0.7, Scripts: scripts})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// watchContainers counts the containers of a sandbox instance until stop
// and returns the peak.
func watchContainers(cli *client.Client, instance string, stop <-chan struct{}) <-chan int {
	out := make(chan int, 1)
	go func() {
		peak := 0
		for {
			res, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true,
				Filters: make(client.Filters).Add("label", sandbox.LabelInstance+"="+instance)})
			if err == nil {
				peak = max(peak, len(res.Items))
			}
			select {
			case <-stop:
				out <- peak
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return out
}

// limits.sandboxes: 2 with one group of 12 (the warm pool included): never
// more than 2 containers alive, and the group still completes, in waves.
func TestSandboxLimitHoldsWithWarmPool(t *testing.T) {
	ref, cli := needDocker(t)
	url := simURL(t, "terminal-tasks")
	cfg, err := runner.ParseConfig(fmt.Appendf(nil, `env: terminal-tasks
groups: 1
group_size: 12
inference: {backend: vllm, endpoints: [%s], timeout: 2m}
parser: hermes
sampling: {max_tokens: 1024}
sandbox: {image: %s}
limits: {sandboxes: 2}
output: {dir: %s}
`, url, ref, filepath.Join(t.TempDir(), "run")))
	if err != nil {
		t.Fatal(err)
	}
	instance := "jobtest-" + fmt.Sprint(time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	j, err := assemble.Open(ctx, cfg, assemble.Options{SandboxInstance: instance})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	peak := watchContainers(cli, instance, stop)
	sum, err := j.Run(ctx)
	close(stop)
	if err != nil {
		t.Fatal(err)
	}
	if p := <-peak; p > 2 {
		t.Errorf("peak containers %d with limits.sandboxes 2", p)
	} else {
		t.Logf("peak containers %d", p)
	}
	if sum.Rollouts != 12 || sum.RolloutsOK != 12 {
		t.Errorf("summary %+v, want 12 ok rollouts", sum)
	}
	// The manifest records the limits the containers got (the defaults
	// here), not the zeros of an unset config.
	run, err := trajectory.Open(cfg.Output.Dir)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		m := r.Manifest
		if m.CPUs != 1 || m.MemoryBytes != 2<<30 || m.PidsLimit != 512 || m.Network != "none" || m.Backend != "docker" {
			t.Fatalf("manifest %+v, want cpus 1, memory 2 GiB, pids 512, network none, backend docker", m)
		}
	}
}

// A missing image fails every rollout as a sandbox failure at once: a
// deterministic error is never retried.
func TestMissingImageNotRetried(t *testing.T) {
	needDocker(t)
	url := simURL(t, "terminal-tasks")
	cfg, err := runner.ParseConfig(fmt.Appendf(nil, `env: terminal-tasks
groups: 1
group_size: 2
inference: {backend: vllm, endpoints: [%s], timeout: 2m}
parser: hermes
sandbox: {image: rollout-sandbox:does-not-exist}
retries: 5
output: {dir: %s}
`, url, filepath.Join(t.TempDir(), "run")))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var mu sync.Mutex
	var kinds []string
	var attempts []int
	j, err := assemble.Open(ctx, cfg, assemble.Options{Progress: func(e runner.Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.Rollout != nil && e.Rollout.Failure != nil {
			kinds = append(kinds, e.Rollout.Failure.Kind)
			attempts = append(attempts, e.Rollout.Attempts)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	sum, _ := j.Run(ctx)
	if sum.Retries != 0 || sum.InfraFailed != 2 {
		t.Errorf("summary %+v, want 2 failed rollouts and no retry", sum)
	}
	for i := range kinds {
		if kinds[i] != runner.FailSandbox || attempts[i] != 1 {
			t.Errorf("rollout failed as %q after %d attempts, want sandbox after 1", kinds[i], attempts[i])
		}
	}
}

// A group_size past the maximum is a config error naming the field, before
// anything starts; so are negative sandbox limits.
func TestConfigMaxima(t *testing.T) {
	for _, c := range []struct{ yaml, field string }{
		{"group_size: 100000000", "group_size"},
		{"groups: 100000000", "groups"},
		{"sandbox: {memory_mb: -1}", "sandbox.memory_mb"},
		{"sandbox: {pids: -1}", "sandbox.pids"},
		{"sandbox: {cpus: -1}", "sandbox.cpus"},
		{"sandbox: {disk_mb: -1}", "sandbox.disk_mb"},
		{"sandbox: {network: everything}", "sandbox.network"},
		{"sandbox: {runtime: kata}", "sandbox.runtime"},
		{"limits: {sandboxes: -2}", "limits.sandboxes"},
	} {
		cfg, err := runner.ParseConfig([]byte("env: terminal-tasks\ninference: {backend: vllm, endpoints: [http://127.0.0.1:1]}\noutput: {dir: /nonexistent}\n" + c.yaml))
		if err != nil {
			t.Fatal(err)
		}
		_, err = assemble.Open(context.Background(), cfg, assemble.Options{})
		if err == nil || !strings.Contains(err.Error(), c.field+":") {
			t.Errorf("%s: %v, want a config error naming %s", c.yaml, err, c.field)
		}
	}
}

// The largest group the config allows, with 2 sandboxes: it runs in waves
// (never more than 2 containers), and cancelling the run (what SIGTERM does
// in `rollout run`) ends it with no container left behind.
func TestHugeGroupWavesAndCancel(t *testing.T) {
	ref, cli := needDocker(t)
	url := simURL(t, "terminal-tasks")
	cfg, err := runner.ParseConfig(fmt.Appendf(nil, `env: terminal-tasks
groups: 1
group_size: %d
inference: {backend: vllm, endpoints: [%s], timeout: 2m}
parser: hermes
sampling: {max_tokens: 512}
sandbox: {image: %s}
limits: {sandboxes: 2}
output: {dir: %s}
`, runner.MaxGroupSize, url, ref, filepath.Join(t.TempDir(), "run")))
	if err != nil {
		t.Fatal(err)
	}
	instance := "jobtest-" + fmt.Sprint(time.Now().UnixNano())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var finished atomic.Int64
	j, err := assemble.Open(ctx, cfg, assemble.Options{SandboxInstance: instance, Progress: func(e runner.Event) {
		if e.Rollout != nil && e.Rollout.Status == runner.StatusOK {
			finished.Add(1)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	peak := watchContainers(cli, instance, stop)
	done := make(chan error, 1)
	go func() {
		_, err := j.Run(ctx)
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Minute)
	for finished.Load() < 6 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if finished.Load() < 6 {
		t.Fatal("fewer than 6 rollouts finished in 5 minutes")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("run after cancel: %v", err)
		}
	case <-time.After(3 * time.Minute): // bounds a hang only
		t.Fatal("the run did not end within 3 minutes of its cancellation")
	}
	close(stop)
	if p := <-peak; p > 2 {
		t.Errorf("peak containers %d with limits.sandboxes 2", p)
	}
	res, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", sandbox.LabelInstance+"="+instance)})
	if err != nil || len(res.Items) != 0 {
		t.Errorf("containers left after the cancelled run: %d %v", len(res.Items), err)
	}
}
