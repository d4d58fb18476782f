package demo

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/metrictest"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/sandbox/image"
	"github.com/rollout-rl/rollout/trajectory"
)

var quiet = slog.New(slog.DiscardHandler)

// childEnv makes the test binary act as a demo process (for the kill test).
const childEnv = "ROLLOUT_DEMO_CHILD_OUT"

func TestMain(m *testing.M) {
	if out := os.Getenv(childEnv); out != "" {
		// A child run: slow generations so the parent can kill it mid-run.
		_, err := Run(context.Background(), Options{SandboxInstance: testInstance(), Out: out, Specs: killSpecs(), Seed: 3, Logger: quiet,
			Latency: sim.Latency{TTFT: 150 * time.Millisecond}, RowsPerFile: 3})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func killSpecs() []Spec {
	return []Spec{{Env: "terminal-tasks", Groups: 8, GroupSize: 3, Image: "rollout-sandbox:busybox"}}
}

// needImages ensures the images these tests use, failing (never skipping)
// under CI when the engine is unreachable.
func needImages(t *testing.T, bookworm bool) {
	t.Helper()
	ctx := context.Background()
	cli, err := dockerclient.New(ctx)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Docker is required in CI: %v", err)
		}
		t.Skipf("no Docker engine: %v", err)
	}
	defer cli.Close()
	names := []string{"busybox"}
	if bookworm {
		names = append(names, "bookworm")
	}
	for _, n := range names {
		if _, err := image.Ensure(ctx, cli, n, image.Options{}); err != nil {
			t.Fatalf("image %s: %v", n, err)
		}
	}
}

type key struct {
	group string
	index int32
}

// readRun returns the records of a run directory, failing on duplicates.
func readRun(t *testing.T, dir string) []trajectory.Record {
	t.Helper()
	run, err := trajectory.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[key]bool{}
	for _, r := range recs {
		k := key{r.GroupID, r.RolloutIndex}
		if seen[k] {
			t.Fatalf("duplicate record for group %s rollout %d", r.GroupID, r.RolloutIndex)
		}
		seen[k] = true
	}
	return recs
}

func checkRecords(t *testing.T, recs []trajectory.Record, groups, size int) {
	t.Helper()
	if len(recs) != groups*size {
		t.Fatalf("%d records, want %d groups x %d", len(recs), groups, size)
	}
	perGroup := map[string]int{}
	for _, r := range recs {
		perGroup[r.GroupID]++
		if err := r.Validate(); err != nil {
			t.Error(err)
		}
		if r.Status == trajectory.StatusOK {
			if len(r.Tokens) == 0 || len(r.Logprobs) != len(r.Tokens) {
				t.Errorf("group %s rollout %d: %d tokens, %d logprobs", r.GroupID, r.RolloutIndex, len(r.Tokens), len(r.Logprobs))
			}
			if r.Reward < 0 || r.Reward > 1 || r.Advantage == nil {
				t.Errorf("group %s rollout %d: reward %v advantage %v", r.GroupID, r.RolloutIndex, r.Reward, r.Advantage)
			}
			if r.Env != "toolcall-match" && r.Env != "web-research" && r.Env != "guess-number" /* the envs without sandboxes */ && !strings.HasPrefix(r.Manifest.ImageDigest, "sha256:") {
				t.Errorf("group %s rollout %d: image digest %q is not a content id", r.GroupID, r.RolloutIndex, r.Manifest.ImageDigest)
			}
		} else if r.Failure == nil || r.Failure.Kind == "" {
			t.Errorf("group %s rollout %d: infra failure without a kind", r.GroupID, r.RolloutIndex)
		}
	}
	for g, n := range perGroup {
		if n != size {
			t.Errorf("group %s has %d records, want %d", g, n, size)
		}
	}
}

func TestDemoEndToEndAndResume(t *testing.T) {
	needImages(t, true)
	out := t.TempDir()
	specs := []Spec{{Env: "terminal-tasks", Groups: 3, GroupSize: 4, Image: "rollout-sandbox:busybox"}, {Env: "swe-tests", Groups: 2, GroupSize: 2}}
	res, err := Run(context.Background(), Options{SandboxInstance: testInstance(), Out: out, Specs: specs, Seed: 5, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	variance := false
	for i, r := range res {
		if r.Summary.InfraFailed != 0 {
			t.Errorf("%s: %d infra failures without faults: %+v", r.Env, r.Summary.InfraFailed, r.Summary.FailuresByKind)
		}
		recs := readRun(t, r.Dir)
		checkRecords(t, recs, specs[i].Groups, specs[i].GroupSize)
		byGroup := map[string]map[float64]bool{}
		for _, rec := range recs {
			if byGroup[rec.GroupID] == nil {
				byGroup[rec.GroupID] = map[float64]bool{}
			}
			byGroup[rec.GroupID][rec.Reward] = true
		}
		for _, rewards := range byGroup {
			if len(rewards) > 1 {
				variance = true
			}
		}
	}
	if !variance {
		t.Error("no group has reward variance: the simulator's wrong path never scored differently")
	}
	// Resume: nothing left to do, nothing duplicated.
	res, err = Run(context.Background(), Options{SandboxInstance: testInstance(), Out: out, Specs: specs, Seed: 5, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Summary.Groups != 0 || r.Summary.GroupsSkipped != specs[i].Groups {
			t.Errorf("%s resumed: %+v", r.Env, r.Summary)
		}
		checkRecords(t, readRun(t, r.Dir), specs[i].Groups, specs[i].GroupSize)
	}
	assertNoContainers(t)
}

// Kill the process mid-run and restart it: the run resumes and the final
// output has exactly one record per rollout.
func TestKillAndResume(t *testing.T) {
	needImages(t, false)
	out := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+out)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(out, "terminal-tasks")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if m, err := trajectory.ReadManifest(dir); err == nil && len(m.Files) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
			t.Fatal("the child wrote no part file in time")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
	before := len(readRun(t, dir))
	if before == 0 || before >= 8*3 {
		t.Fatalf("%d records before the restart: the kill did not land mid-run", before)
	}
	res, err := Run(context.Background(), Options{SandboxInstance: testInstance(), Out: out, Specs: killSpecs(), Seed: 3, Logger: quiet, RowsPerFile: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Summary.GroupsSkipped == 0 {
		t.Errorf("restart did not resume: %+v", res[0].Summary)
	}
	checkRecords(t, readRun(t, dir), 8, 3)
	// The killed process's containers are orphans; the next backend reaps
	// them (its start-up reap), and GC removes any left now.
	if _, err := docker.GC(context.Background(), sandbox.ReapOptions{}); err != nil {
		t.Fatal(err)
	}
	assertNoContainers(t)
}

// With 5% inference errors and sandboxes killed at random, every group
// completes or is flagged with a reason, retries happen, nothing is lost or
// duplicated, and no container leaks.
func TestFaults(t *testing.T) {
	needImages(t, false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cli, err := dockerclient.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	killed := 0
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(9, 9))
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(150+rng.IntN(250)) * time.Millisecond):
			}
			list, err := cli.ContainerList(ctx, client.ContainerListOptions{Filters: make(client.Filters).Add("label", sandbox.LabelManaged+"=true")})
			if err != nil {
				continue
			}
			// Only this package's sandboxes: other packages' tests share
			// the engine and must not see their containers killed.
			var ours []container.Summary
			for _, c := range list.Items {
				if isOurs(c.Labels) {
					ours = append(ours, c)
				}
			}
			if len(ours) == 0 {
				continue
			}
			c := ours[rng.IntN(len(ours))]
			if _, err := cli.ContainerKill(ctx, c.ID, client.ContainerKillOptions{Signal: "KILL"}); err == nil {
				mu.Lock()
				killed++
				mu.Unlock()
			}
		}
	})
	out := t.TempDir()
	specs := []Spec{{Env: "terminal-tasks", Groups: 6, GroupSize: 4, Image: "rollout-sandbox:busybox"}}
	res, err := Run(ctx, Options{SandboxInstance: testInstance(), Out: out, Specs: specs, Seed: 11, Logger: quiet, Retries: 3,
		Latency: sim.Latency{TTFT: 40 * time.Millisecond}, Faults: sim.Faults{ErrorRate: 0.05}})
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	s := res[0].Summary
	t.Logf("killed %d containers; summary %+v", killed, s)
	if killed == 0 {
		t.Fatal("the fault injector killed no sandbox")
	}
	if s.Retries == 0 {
		t.Error("no retries happened under faults")
	}
	recs := readRun(t, res[0].Dir)
	checkRecords(t, recs, 6, 4)
	assertNoContainers(t)
}

func assertNoContainers(t *testing.T) {
	t.Helper()
	cli, err := dockerclient.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", sandbox.LabelManaged+"=true")})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Items {
		// Other packages' tests may run concurrently on the same engine.
		if isOurs(c.Labels) {
			t.Errorf("leaked container %s (%v)", c.ID[:12], c.Labels)
		}
	}
}

// testInstancePrefix marks the sandbox backends of this package's runs (the
// instance label), so fault injection and leak checks never touch the
// containers of other packages' tests running at the same time.
const testInstancePrefix = "demotest-"

func testInstance() string {
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	return testInstancePrefix + hex.EncodeToString(b)
}

func isOurs(labels map[string]string) bool {
	return strings.HasPrefix(labels[sandbox.LabelInstance], testInstancePrefix)
}

// The other built-in envs end to end, each with its real verifier:
// math-python (python tool, numeric answer), toolcall-match (single turn, no
// sandbox) and terminal-bench (task images built FROM the bookworm base,
// hidden tests uploaded after the loop, reward.txt; eval-only, so it runs
// as an evaluation with a report). The simulated policy always follows the
// reference solution, so every rollout must score 1.
func TestOtherEnvsEndToEnd(t *testing.T) {
	needImages(t, true)
	out := t.TempDir()
	specs := []Spec{
		{Env: "math-python", Groups: 2, GroupSize: 2},
		{Env: "toolcall-match", Groups: 2, GroupSize: 2},
		{Env: "terminal-bench", Groups: 2, GroupSize: 2},
	}
	res, err := Run(context.Background(), Options{SandboxInstance: testInstance(), Out: out, Specs: specs, Seed: 4,
		SuccessProb: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		recs := readRun(t, r.Dir)
		checkRecords(t, recs, specs[i].Groups, specs[i].GroupSize)
		for _, rec := range recs {
			if rec.Status != trajectory.StatusOK || rec.Reward != 1 {
				t.Errorf("%s group %s rollout %d: status %s reward %v failure %+v components %v", r.Env, rec.GroupID, rec.RolloutIndex,
					rec.Status, rec.Reward, rec.Failure, rec.RewardComponents)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(res[2].Dir, "eval", "metrics.json")); err != nil {
		t.Errorf("terminal-bench ran as an evaluation but wrote no report: %v", err)
	}
	assertNoContainers(t)
}

// Sandboxes reset in place give every rollout what a fresh one would: the
// same run (same seed) with and without reuse scores every rollout alike,
// and with reuse most rollouts got a reset container.
func TestReuseMatchesFreshSandboxes(t *testing.T) {
	needImages(t, false)
	specs := []Spec{{Env: "terminal-tasks", Groups: 8, GroupSize: 2, Image: "rollout-sandbox:busybox"}}
	before := resetsDone(t)
	fresh := groupRewards(t, Options{SandboxInstance: testInstance(), Specs: specs})
	reused := groupRewards(t, Options{SandboxInstance: testInstance(), Specs: specs, Reuse: true})
	n := resetsDone(t) - before
	t.Logf("%v resets in place, %v failed", n, resetCount(t, "failed"))
	if n < 8 {
		t.Errorf("%v resets in place over 16 rollouts, 2 groups of 2 at a time: reuse did not happen", n)
	}
	for g, want := range fresh {
		if got := reused[g]; !slices.Equal(got, want) {
			t.Errorf("group %s: rewards %v with reuse, %v with fresh sandboxes", g, got, want)
		}
	}
	assertNoContainers(t)
}

// TestRuncMatchesDocker runs the same groups on the Docker and the runc
// backends: every group earns the same rewards, and the runc backend leaves
// no container state behind.
func TestRuncMatchesDocker(t *testing.T) {
	needImages(t, false)
	if os.Geteuid() != 0 {
		t.Skip("the runc backend needs root")
	}
	specs := []Spec{{Env: "terminal-tasks", Groups: 8, GroupSize: 2, Image: "rollout-sandbox:busybox"}}
	docker := groupRewards(t, Options{SandboxInstance: testInstance(), Specs: specs})
	inst := testInstance()
	runc := groupRewards(t, Options{SandboxInstance: inst, Specs: specs, SandboxBackend: sandbox.BackendRunc})
	ents, _ := os.ReadDir("/run/rollout-runc/runc")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "rollout-"+inst+"-") {
			t.Errorf("runc container %s left after the run", e.Name())
		}
	}
	for g, want := range docker {
		if got := runc[g]; !slices.Equal(got, want) {
			t.Errorf("group %s: rewards %v on runc, %v on Docker", g, got, want)
		}
	}
	assertNoContainers(t)
}

// groupRewards runs o (seed 11, two groups at a time, in a temporary
// directory) and returns each group's rewards, sorted: the simulator picks
// which rollout of a group takes the right path by arrival order, so runs
// are compared per group. Every rollout must be ok.
func groupRewards(t *testing.T, o Options) map[string][]float64 {
	t.Helper()
	o.Out, o.Seed, o.Logger, o.GroupsInFlight = t.TempDir(), 11, quiet, 2
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Summary.InfraFailed != 0 {
		t.Fatalf("reuse=%v backend=%q: %d infra failures: %+v", o.Reuse, o.SandboxBackend, res[0].Summary.InfraFailed, res[0].Summary.FailuresByKind)
	}
	recs := readRun(t, res[0].Dir)
	checkRecords(t, recs, o.Specs[0].Groups, o.Specs[0].GroupSize)
	out := map[string][]float64{}
	for _, r := range recs {
		out[r.GroupID] = append(out[r.GroupID], r.Reward)
	}
	for _, v := range out {
		slices.Sort(v)
	}
	return out
}

// resetsDone reads rollout_sandbox_resets_total{result="ok"}.
func resetsDone(t *testing.T) float64 { return resetCount(t, "ok") }

// resetCount reads rollout_sandbox_resets_total{result}.
func resetCount(t *testing.T, result string) float64 {
	t.Helper()
	return metrictest.Find(t, "rollout_sandbox_resets_total", "result", result).GetCounter().GetValue()
}
