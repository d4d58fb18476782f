package docker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

// ownerChildEnv makes the test binary act as a sandbox owner: it creates
// one sandbox and one warm-pool sandbox, prints their ids and blocks until
// it is killed.
const ownerChildEnv = "ROLLOUT_SANDBOX_OWNER_CHILD"

func ownerChild() int {
	ctx := context.Background()
	img := os.Getenv(ownerChildEnv)
	d, err := New(ctx, Options{Options: host.Options{Instance: os.Getenv("ROLLOUT_SANDBOX_OWNER_INSTANCE"), ReapInterval: -1}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "owner child:", err)
		return 1
	}
	spec := sandbox.Spec{Image: img}
	s, err := d.Create(ctx, spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "owner child:", err)
		return 1
	}
	pool := sandbox.NewPool(d, sandbox.PoolOptions{MaxIdle: 2})
	if err := pool.Expect(spec, 1); err != nil {
		fmt.Fprintln(os.Stderr, "owner child:", err)
		return 1
	}
	fmt.Println("sandbox", s.ID())
	for {
		if n := countContainers(ctx, d.cli, d.opts.Instance); n >= 2 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Println("ready")
	select {}
}

func countContainers(ctx context.Context, cli *client.Client, instance string) int {
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", sandbox.LabelInstance+"="+instance)})
	if err != nil {
		return -1
	}
	return len(res.Items)
}

// TestOwnerBoundSandboxes kills (SIGKILL) a process owning a sandbox and a
// warm-pool sandbox: both containers must vanish within seconds without any
// reaper, while a sandbox of this (live) process is left alone.
func TestOwnerBoundSandboxes(t *testing.T) {
	d := needDocker(t)
	witness := newSandbox(t, sandbox.Spec{})
	instance := "test-owner-" + sandbox.RandomID(4)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), ownerChildEnv+"="+sandboxtest.Image, "ROLLOUT_SANDBOX_OWNER_INSTANCE="+instance)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		// Belt and braces: never leave the child's containers behind.
		if _, err := d.Reap(context.Background(), sandbox.ReapOptions{}); err != nil {
			t.Log(err)
		}
	}()
	sc := bufio.NewScanner(out)
	ready := false
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "ready" {
			ready = true
			break
		}
	}
	if !ready {
		t.Fatal("owner child did not get ready")
	}
	ctx := context.Background()
	if n := countContainers(ctx, d.cli, instance); n != 2 {
		t.Fatalf("owner child has %d containers, want 2", n)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed := time.Now()
	left := -1
	for time.Since(killed) < 10*time.Second {
		if left = countContainers(ctx, d.cli, instance); left == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if left != 0 {
		t.Fatalf("%d containers of the killed owner still exist 10 s after SIGKILL", left)
	}
	t.Logf("the killed owner's containers were gone %s after SIGKILL", time.Since(killed).Round(10*time.Millisecond))
	// Its socket-channel directory goes with them (the watchdog).
	if d.sockRoot != "" {
		dir := filepath.Join(d.sockRoot, instance)
		for time.Since(killed) < 10*time.Second {
			if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("socket directory %s of the killed owner still exists: %v", dir, err)
		}
	}
	// The live process's sandbox is untouched.
	if _, err := witness.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatalf("witness sandbox of the live owner: %v", err)
	}
}

// TestAliveOwnerLabels: a container labelled with a live process
// (this one) on this boot is never reaped; one labelled with another boot
// id is.
func TestAliveOwnerLabels(t *testing.T) {
	pid := fmt.Sprint(os.Getpid())
	start := host.PidStart(os.Getpid())
	if !host.Alive(pid, start, host.BootID()) {
		t.Error("this process is not alive by its own labels")
	}
	if !host.Alive(pid, start, "") {
		t.Error("a label set without boot id must fall back to pid and start time")
	}
	if host.BootID() != "" && host.Alive(pid, start, "00000000-0000-0000-0000-000000000000") {
		t.Error("a process of another boot counts as alive")
	}
	if host.Alive(pid, start+"0", host.BootID()) {
		t.Error("a recycled pid (other start time) counts as alive")
	}
}
