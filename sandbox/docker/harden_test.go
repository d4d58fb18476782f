package docker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

// ownBackend is a Docker backend of its own (own instance label, own
// MaxContainers) for tests that count containers.
func ownBackend(t *testing.T, opts Options) *Docker {
	t.Helper()
	needDocker(t)
	opts.Instance = "test-" + sandbox.RandomID(4)
	opts.ReapInterval = -1
	d, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return d
}

// peakContainers polls the engine for containers carrying the backend's
// instance label until stop, returning the largest count seen.
func peakContainers(t *testing.T, d *Docker, stop <-chan struct{}) <-chan int {
	out := make(chan int, 1)
	go func() {
		peak := 0
		for {
			peak = max(peak, countContainers(context.Background(), d.cli, d.opts.Instance))
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

// A group of 12 announced to a pool over a backend of 2 containers: never
// more than 2 containers exist, the warm ones included, and every acquire
// is served (waves).
func TestPoolHoldsMaxContainers(t *testing.T) {
	d := ownBackend(t, Options{Options: host.Options{MaxContainers: 2}})
	p := sandbox.NewPool(d, sandbox.PoolOptions{MaxIdle: 48})
	defer p.Close(context.Background())
	spec := sandbox.Spec{Image: sandboxtest.Image}
	stop := make(chan struct{})
	peak := peakContainers(t, d, stop)
	if err := p.Expect(spec, 12); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var maxSlots, served atomic.Int64
	for i := range 12 {
		wg.Go(func() {
			sb, err := p.Acquire(ctx, spec)
			if err != nil {
				t.Errorf("acquire %d: %v", i, err)
				return
			}
			if n := int64(d.slots.InUse()); n > maxSlots.Load() {
				maxSlots.Store(n)
			}
			r, err := sb.Exec(ctx, sandbox.ExecRequest{Command: "echo ok"})
			if err != nil || strings.TrimSpace(string(r.Stdout)) != "ok" {
				t.Errorf("exec %d: %q %v", i, r.Stdout, err)
			}
			served.Add(1)
			if err := sb.Close(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	close(stop)
	if got := <-peak; got > 2 {
		t.Errorf("peak containers %d, want <= 2", got)
	}
	if maxSlots.Load() > 2 {
		t.Errorf("peak slots %d, want <= 2", maxSlots.Load())
	}
	if served.Load() != 12 {
		t.Errorf("served %d of 12", served.Load())
	}
}

// Idle warm sandboxes of one spec never block an acquire of another when
// every slot is taken: one is removed to make room.
func TestPoolEvictsIdleForOtherSpec(t *testing.T) {
	d := ownBackend(t, Options{Options: host.Options{MaxContainers: 2}})
	p := sandbox.NewPool(d, sandbox.PoolOptions{})
	defer p.Close(context.Background())
	a := sandbox.Spec{Image: sandboxtest.Image, Env: map[string]string{"SPEC": "a"}}
	if err := p.Warm(a, 2); err != nil {
		t.Fatal(err)
	}
	eventually(t, "2 warm sandboxes", func() bool { return p.Ready(a) == 2 })
	if err := p.Warm(a, 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := sandbox.Spec{Image: sandboxtest.Image, Env: map[string]string{"SPEC": "b"}}
	sb, err := p.Acquire(ctx, b)
	if err != nil {
		t.Fatalf("acquire another spec with every slot warm: %v", err)
	}
	defer sb.Close(ctx)
	r, err := sb.Exec(ctx, sandbox.ExecRequest{Command: "echo $SPEC"})
	if err != nil || string(r.Stdout) != "b\n" {
		t.Fatalf("exec: %q %v", r.Stdout, err)
	}
	if n := d.slots.InUse(); n > 2 {
		t.Errorf("%d slots in use, want <= 2", n)
	}
}

// The limits recorded for a sandbox are the container's, read back from
// the engine: defaults included, never zeros.
func TestAppliedLimits(t *testing.T) {
	s := newSandbox(t, sandbox.Spec{Limits: sandbox.Limits{PIDs: 100, CPUs: 0.5}})
	a := s.(sandbox.LimitsReporter).Applied()
	want := sandbox.Applied{MemoryBytes: sandbox.DefaultLimits.MemoryBytes, CPUs: 0.5, PIDs: 100, DiskBytes: sandbox.DefaultLimits.DiskBytes,
		Network: sandbox.NetworkNone, Runtime: sandbox.RuntimeRunc, Backend: sandbox.BackendDocker}
	if a != want {
		t.Errorf("applied %+v, want %+v", a, want)
	}
}

// Writing past the disk limit on the writable root: the watchdog removes
// the sandbox and says why.
func TestDiskLimitWritableRoot(t *testing.T) { diskLimitWritableRoot(t, "") }

// With a read-only root every writable mount is a tmpfs of the disk size:
// the kernel refuses writes past it, the sandbox lives on.
func TestDiskLimitReadOnlyRoot(t *testing.T) { diskLimitReadOnlyRoot(t, "") }

// diskLimitWritableRoot proves the watchdog's disk bound under runtime
// ("" is the engine's default): small writes pass, a write past the limit
// closes the sandbox with "disk limit exceeded".
func diskLimitWritableRoot(t *testing.T, runtime string) {
	t.Helper()
	d := ownBackend(t, Options{Options: host.Options{DiskCheckInterval: 200 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := d.Create(ctx, sandbox.Spec{Image: sandboxtest.Image, Runtime: runtime, Limits: sandbox.Limits{DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if s.(*dockerSandbox).upperDir == "" {
		t.Fatal("no upper dir known: the watchdog cannot measure this engine's storage")
	}
	// Small writes are fine.
	if r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "dd if=/dev/zero of=/workspace/small bs=1M count=8 2>&1"}); err != nil || r.ExitCode != 0 {
		t.Fatalf("runtime %q: small write: %v %q", runtime, err, r.Stdout)
	}
	_, err = s.Exec(ctx, sandbox.ExecRequest{Command: "dd if=/dev/zero of=/workspace/big bs=1M count=4000; sleep 60", Timeout: 2 * time.Minute})
	if err == nil {
		_, err = s.Exec(ctx, sandbox.ExecRequest{Command: "true"})
	}
	if !errors.Is(err, sandbox.ErrClosed) || !strings.Contains(err.Error(), "disk limit exceeded") {
		t.Fatalf("runtime %q: after writing 4000 MiB with a 64 MiB limit: %v, want ErrClosed with \"disk limit exceeded\"", runtime, err)
	}
}

// diskLimitReadOnlyRoot proves the tmpfs disk bound of a read-only root
// under runtime ("" is the engine's default).
func diskLimitReadOnlyRoot(t *testing.T, runtime string) {
	t.Helper()
	s := newSandbox(t, sandbox.Spec{Runtime: runtime, Limits: sandbox.Limits{ReadOnlyRoot: true, DiskBytes: 32 << 20}})
	ctx := context.Background()
	for _, dir := range []string{"/workspace", "/tmp"} {
		r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "dd if=/dev/zero of=" + dir + "/big bs=1M count=100 2>&1", MergeOutput: true})
		if err != nil {
			t.Fatal(err)
		}
		if r.ExitCode == 0 || !strings.Contains(string(r.Stdout), "No space left") {
			t.Errorf("runtime %q, %s: dd of 100 MiB into 32 MiB: exit %d %q", runtime, dir, r.ExitCode, r.Stdout)
		}
	}
	if r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "touch /etc/x"}); err != nil || r.ExitCode == 0 {
		t.Errorf("runtime %q: root is writable: %v %d", runtime, err, r.ExitCode)
	}
}

// An egress-only sandbox reaches neither the host (a listener on every
// host address, tried through the egress gateway and docker0's address)
// nor another sandbox; an open one reaches the host (the control).
func TestNetworkEgressIsolation(t *testing.T) {
	d := ownBackend(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("host-service\n"))
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	peer, err := d.Create(ctx, sandbox.Spec{Image: sandboxtest.Image, Network: sandbox.NetworkBridge})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close(ctx)
	if _, err := peer.Start(ctx, sandbox.ExecRequest{Command: "while true; do echo peer-service | nc -l -p 8080; done"}); err != nil {
		t.Fatal(err)
	}
	s, err := d.Create(ctx, sandbox.Spec{Image: sandboxtest.Image, Network: sandbox.NetworkBridge})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if a := s.(sandbox.LimitsReporter).Applied(); a.Network != sandbox.NetworkBridge {
		t.Errorf("applied network %q", a.Network)
	}
	gw, _ := netInfo(t, d, s.ID(), EgressNetwork)
	_, peerIP := netInfo(t, d, peer.ID(), EgressNetwork)
	open, err := d.Create(ctx, sandbox.Spec{Image: sandboxtest.Image, Network: sandbox.NetworkOpen})
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(ctx)
	dockerGW, _ := netInfo(t, d, open.ID(), "bridge")

	connect := func(sb sandbox.Sandbox, ip string, port int) string {
		r, err := sb.Exec(ctx, sandbox.ExecRequest{Command: fmt.Sprintf("echo | nc -w 3 %s %d", ip, port), Timeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(r.Stdout))
	}
	// The control: the open network reaches the host's listener, and the
	// peer listens (from itself).
	if got := connect(open, dockerGW, port); got != "host-service" {
		t.Fatalf("control: an open sandbox got %q from the host listener at %s:%d (the test cannot tell isolation from a broken listener)", got, dockerGW, port)
	}
	if got := connect(peer, "127.0.0.1", 8080); got != "peer-service" {
		t.Fatalf("control: the peer's own listener answered %q", got)
	}
	for _, target := range []struct{ what, ip string }{{"the egress gateway (host)", gw}, {"docker0's gateway (host)", dockerGW}} {
		if got := connect(s, target.ip, port); got != "" {
			t.Errorf("egress-only sandbox reached %s %s:%d: %q", target.what, target.ip, port, got)
		}
	}
	if got := connect(s, peerIP, 8080); got != "" {
		t.Errorf("egress-only sandbox reached another sandbox %s:8080: %q", peerIP, got)
	}
}

// netInfo returns the gateway and the address of a container on network.
func netInfo(t *testing.T, d *Docker, id, network string) (gw, ip string) {
	t.Helper()
	res, err := d.cli.ContainerInspect(context.Background(), id, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ep := res.Container.NetworkSettings.Networks[network]
	if ep == nil {
		t.Fatalf("container %s is not on network %s", id[:12], network)
	}
	return ep.Gateway.String(), ep.IPAddress.String()
}

// needRunsc skips unless the engine has the runsc runtime (CI runs
// scripts/ensure-runsc.sh first; ROLLOUT_REQUIRE_RUNSC=1, set by make test, or CI=true makes it a failure).
func needRunsc(t *testing.T) {
	t.Helper()
	d := needDocker(t)
	info, err := d.cli.Info(context.Background(), client.InfoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := info.Info.Runtimes[sandbox.RuntimeRunsc]; !ok {
		// make test runs scripts/ensure-runsc.sh first and sets
		// ROLLOUT_REQUIRE_RUNSC=1; CI always runs it: there a missing
		// runtime is the script's failure, never a skip.
		if os.Getenv("ROLLOUT_REQUIRE_RUNSC") == "1" || os.Getenv("CI") == "true" {
			t.Fatal("the engine has no runsc runtime although scripts/ensure-runsc.sh should have registered it (ROLLOUT_REQUIRE_RUNSC=1 or CI=true)")
		}
		t.Skip("the engine has no runsc runtime: scripts/ensure-runsc.sh (run by make test) installs Debian's runsc and registers it")
	}
}

// Under gVisor the exec channel and every kind of call work: commands,
// the shell session, files both ways, background processes, kill-all,
// and the limits read back.
func TestRunsc(t *testing.T) {
	needRunsc(t)
	s := newSandbox(t, sandbox.Spec{Runtime: sandbox.RuntimeRunsc, Limits: sandbox.Limits{PIDs: 64}})
	ctx := context.Background()
	if a := s.(sandbox.LimitsReporter).Applied(); a.Runtime != sandbox.RuntimeRunsc || a.PIDs != 64+runscPIDsHeadroom {
		t.Errorf("applied %+v", a)
	}
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "dmesg | head -1; id -u"})
	if err != nil || !strings.Contains(string(r.Stdout), "gVisor") || !strings.HasSuffix(string(r.Stdout), "1000\n") {
		t.Fatalf("exec under runsc: %q %v", r.Stdout, err)
	}
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Command: "cd /tmp && export X=7", Shell: true}); err != nil {
		t.Fatal(err)
	}
	r, err = s.Exec(ctx, sandbox.ExecRequest{Command: "echo $(pwd) $X", Shell: true})
	if err != nil || string(r.Stdout) != "/tmp 7\n" {
		t.Fatalf("shell session: %q %q exit %d %v", r.Stdout, r.Stderr, r.ExitCode, err)
	}
	data := []byte("binary\x00\xffdata")
	if err := s.WriteFile(ctx, "/workspace/f.bin", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ReadFile(ctx, "/workspace/f.bin"); err != nil || string(got) != string(data) {
		t.Fatalf("read back %q %v", got, err)
	}
	p, err := s.Start(ctx, sandbox.ExecRequest{Command: "sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	r, err = s.Exec(ctx, sandbox.ExecRequest{Command: "sleep 0.1", Timeout: 5 * time.Second})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("timed exec: %+v %v", r, err)
	}
	r, err = s.Exec(ctx, sandbox.ExecRequest{Command: "sleep 30", Timeout: 200 * time.Millisecond})
	if err != nil || !r.TimedOut {
		t.Fatalf("timeout under runsc: %+v %v", r, err)
	}
	if n, err := s.(sandbox.Quiescer).KillAll(ctx); err != nil || n < 1 {
		t.Fatalf("kill all: %d %v", n, err)
	}
	if info, err := s.Poll(ctx, p.ID); err != nil || info.Running {
		t.Fatalf("background process after kill-all: %+v %v", info, err)
	}
}

// runsc with a network is refused as invalid, before anything starts.
func TestRunscNetworkRefused(t *testing.T) {
	d := needDocker(t)
	_, err := d.Create(context.Background(), sandbox.Spec{Image: sandboxtest.Image, Runtime: sandbox.RuntimeRunsc, Network: sandbox.NetworkBridge})
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "not implemented") {
		t.Fatalf("runsc + bridge: %v", err)
	}
}
