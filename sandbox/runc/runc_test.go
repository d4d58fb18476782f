package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
	"golang.org/x/sys/unix"
)

var (
	runcOnce sync.Once
	testRunc *Runc
	runcErr  error
)

// needRunc returns the package's runc backend, made on first use. It needs
// Docker (the image store), root and runc; CI=true turns a skip into a
// failure.
func needRunc(t testing.TB) *Runc {
	t.Helper()
	needImage(t)
	runcOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rollout-runc-test")
		if err != nil {
			runcErr = err
			return
		}
		testRunc, runcErr = New(context.Background(), Options{
			Options:  host.Options{Instance: "test-" + sandbox.RandomID(4), ReapInterval: -1},
			StateDir: filepath.Join("/run", "rollout-runc-test-"+sandbox.RandomID(4)),
			DataDir:  dir,
		})
	})
	if runcErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and the runc backend is not usable: %v", runcErr)
		}
		t.Skipf("runc backend not usable: %v", runcErr)
	}
	return testRunc
}

// closeTestRunc closes the package's runc backend (TestMain) and removes
// its directories.
func closeTestRunc(ctx context.Context) error {
	if testRunc == nil {
		return nil
	}
	err := testRunc.Close(ctx)
	for _, d := range []string{testRunc.opts.StateDir, testRunc.opts.DataDir} {
		if rerr := os.RemoveAll(d); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	return err
}

func newRuncSandbox(t testing.TB, spec sandbox.Spec) *runcSandbox {
	t.Helper()
	return sandboxtest.CreateOn(t, needRunc(t), spec, sandboxtest.Image, time.Minute).(*runcSandbox)
}

// The runc backend's sandbox passes the same exec table as Docker's.
func TestRuncExec(t *testing.T) {
	s := newRuncSandbox(t, sandbox.Spec{Env: map[string]string{"BASE": "b"}})
	sandboxtest.ExecTable(t, s)
}

// The container is what the Docker backend makes: the same limits,
// capabilities, seccomp and no network, read back from inside.
func TestRuncIsolation(t *testing.T) {
	s := newRuncSandbox(t, sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 256 << 20, PIDs: 64, CPUs: 0.5}})
	ctx := context.Background()
	run := func(cmd string) string {
		t.Helper()
		r, err := s.Exec(ctx, sandbox.ExecRequest{Command: cmd})
		if err != nil {
			t.Fatal(err)
		}
		return string(r.Stdout) + string(r.Stderr)
	}
	status := run("grep -E '^(Cap(Eff|Prm|Bnd)|NoNewPrivs|Seccomp):' /proc/self/status")
	for _, want := range []string{"CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !strings.Contains(status, want) {
			t.Errorf("command status lacks %q:\n%s", want, status)
		}
	}
	// No network: the namespace has its loopback device only.
	if dev := run("cat /proc/net/dev"); strings.Contains(dev, "eth") || !strings.Contains(dev, "lo:") {
		t.Errorf("network devices:\n%s", dev)
	}
	// Loopback is up and named, as in a Docker container without network.
	if lo := run("cat /sys/class/net/lo/flags; grep -c localhost /etc/hosts; cat /etc/hostname"); !strings.HasPrefix(lo, "0x9\n2\n") || !strings.Contains(lo, s.ID()[len(s.ID())-12:]) {
		t.Errorf("loopback, /etc/hosts, /etc/hostname:\n%s", lo)
	}
	// The agent's supervisor is pid 1; the agent its child.
	if comm := run("cat /proc/1/cmdline | tr '\\0' ' '"); !strings.Contains(comm, "-supervise") {
		t.Errorf("pid 1 is %q, want the agent's supervisor", comm)
	}
	// The limits in the container's cgroups (v1 paths; on a v2 host the
	// same values sit in memory.max, pids.max and cpu.max).
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		for file, want := range map[string]string{
			"memory/rollout-runc/" + s.ID() + "/memory.limit_in_bytes": fmt.Sprint(256 << 20),
			"pids/rollout-runc/" + s.ID() + "/pids.max":                "64",
			"cpu/rollout-runc/" + s.ID() + "/cpu.cfs_quota_us":         "50000",
		} {
			b, err := os.ReadFile("/sys/fs/cgroup/" + file)
			if err != nil || strings.TrimSpace(string(b)) != want {
				t.Errorf("%s = %q (%v), want %s", file, b, err, want)
			}
		}
	}
	// Masked and read-only kernel files.
	if out := run("cat /proc/kcore | head -c 1 | wc -c; echo x > /proc/sys/kernel/hostname || echo refused"); !strings.Contains(out, "0\n") || !strings.Contains(out, "refused") {
		t.Errorf("masked/readonly paths:\n%s", out)
	}
	if a := s.Applied(); a.MemoryBytes != 256<<20 || a.PIDs != 64 || a.Network != sandbox.NetworkNone || a.Runtime != sandbox.RuntimeRunc {
		t.Errorf("applied %+v", a)
	}
	if !strings.HasPrefix(s.ImageID(), "sha256:") {
		t.Errorf("image id %q", s.ImageID())
	}
}

// What the backend does not build is refused, before anything is made; a
// user the image does not have is refused by the agent, and nothing is left.
func TestRuncRefuses(t *testing.T) {
	r := needRunc(t)
	ctx := context.Background()
	for _, spec := range []sandbox.Spec{
		{Image: sandboxtest.Image, Network: sandbox.NetworkBridge},
		{Image: sandboxtest.Image, Runtime: sandbox.RuntimeRunsc},
		{Image: ""},
		{Image: "rollout-no-such-image:x"},
		{Image: sandboxtest.Image, User: "nobody-here"}, // the agent's hello says so
	} {
		if _, err := r.Create(ctx, spec); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("spec %+v: err %v, want ErrInvalid", spec, err)
		}
	}
	if n := len(r.handles()); n != 0 {
		t.Errorf("%d sandboxes live after refused creates", n)
	}
	ents, _ := os.ReadDir(filepath.Join(r.opts.DataDir, "layers"))
	if len(ents) != 0 {
		t.Errorf("layers left after refused creates: %v", ents)
	}
}

// Close leaves nothing: no runc state, no mount, no directory, no process.
func TestRuncCloseRemovesEverything(t *testing.T) {
	r := needRunc(t)
	ctx := context.Background()
	sb, err := r.Create(ctx, sandbox.Spec{Image: sandboxtest.Image})
	if err != nil {
		t.Fatal(err)
	}
	s := sb.(*runcSandbox)
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Command: "sleep 1000 & setsid sleep 1000 & echo started"}); err != nil {
		t.Fatal(err)
	}
	pid := s.pid
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Close(cctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("second close: %v", err)
	}
	for _, p := range []string{filepath.Join(r.runcRoot(), s.ID()), s.paths.bundle, s.paths.layer} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after Close (%v)", p, err)
		}
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), s.ID()) {
		t.Errorf("mount of %s left after Close", s.ID())
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(st), ") Z ") {
		t.Errorf("container init %d still running: %s", pid, st)
	}
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("exec after close: %v", err)
	}
}

// A read-only root refuses writes outside the writable tmpfs /tmp and
// workdir, which the disk limit bounds.
func TestRuncReadOnlyRoot(t *testing.T) {
	s := newRuncSandbox(t, sandbox.Spec{Limits: sandbox.Limits{ReadOnlyRoot: true, DiskBytes: 2 << 20}})
	ctx := context.Background()
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "touch /etc/x 2>/dev/null && echo wrote-etc; echo ok > /tmp/a && cat /tmp/a; echo w > f && cat f; head -c 3000000 /dev/zero > big 2>/dev/null || echo full"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(r.Stdout); got != "ok\nw\nfull\n" {
		t.Errorf("read-only root: %q", got)
	}
}

// The disk watchdog removes a sandbox whose writable layer passes its
// limit, and later calls say why.
func TestRuncDiskLimit(t *testing.T) {
	s := newRuncSandbox(t, sandbox.Spec{Limits: sandbox.Limits{DiskBytes: 4 << 20}})
	ctx := context.Background()
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Command: "head -c 8000000 /dev/urandom > /workspace/big"}); err != nil && !errors.Is(err, sandbox.ErrClosed) && !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
			if !errors.Is(err, sandbox.ErrClosed) || !strings.Contains(err.Error(), "disk limit exceeded") {
				t.Fatalf("exec after the disk limit: %v", err)
			}
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("sandbox past its disk limit was not removed")
}

// A sandbox whose owner process died is stopped at once (the agent's stdin
// closes) and its remains are reaped by the next backend's start-up reap.
func TestRuncOwnerDeath(t *testing.T) {
	r := needRunc(t)
	if testing.Short() {
		t.Skip("short")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run", "^$")
	cmd.Env = append(os.Environ(), runcOwnerChildEnv+"="+sandboxtest.Image, "ROLLOUT_RUNC_STATE="+r.opts.StateDir, "ROLLOUT_RUNC_DATA="+r.opts.DataDir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("owner child: %v", err)
	}
	id := strings.TrimSpace(string(out))
	if !strings.HasPrefix(id, "rollout-") {
		t.Fatalf("owner child printed %q", out)
	}
	// The child is gone: its container's agent saw stdin close.
	if _, err := os.Stat(filepath.Join(r.runcRoot(), id)); err != nil {
		t.Fatalf("the dead owner's container state is missing before the reap: %v", err)
	}
	reaped, err := r.Reap(context.Background(), sandbox.ReapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, rp := range reaped {
		found = found || (rp.ID == id && rp.Reason == "orphan")
	}
	if !found {
		t.Fatalf("reaped %+v, want %s as orphan", reaped, id)
	}
	p := r.paths(id)
	for _, d := range []string{filepath.Join(r.runcRoot(), id), p.bundle, p.layer} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s left after the reap (%v)", d, err)
		}
	}
}

// runcOwnerChildEnv makes the test binary a runc sandbox's owner that dies
// without closing it; the value is the image.
const runcOwnerChildEnv = "ROLLOUT_RUNC_OWNER_CHILD"

// childRunc is the runc backend a test's child process makes in the
// parent's state and data directories (passed in the environment).
func childRunc(ctx context.Context) (*Runc, error) {
	return New(ctx, Options{
		Options:  host.Options{Instance: "child-" + sandbox.RandomID(4), ReapInterval: -1},
		StateDir: os.Getenv("ROLLOUT_RUNC_STATE"),
		DataDir:  os.Getenv("ROLLOUT_RUNC_DATA"),
	})
}

// runcOwnerChild creates a sandbox in the package's runc state and exits
// without closing it (TestRuncOwnerDeath).
func runcOwnerChild() int {
	ctx := context.Background()
	r, err := childRunc(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s, err := r.Create(ctx, sandbox.Spec{Image: os.Getenv(runcOwnerChildEnv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(s.ID())
	return 0
}

// Where the owner is a subreaper (or pid 1 of its container), the
// container's init becomes its child when runc exits; Close reaps it, so
// no zombie is left per sandbox.
func TestRuncReapsItsOrphanedInit(t *testing.T) {
	r := needRunc(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run", "^$")
	cmd.Env = append(os.Environ(), runcSubreaperChildEnv+"="+sandboxtest.Image, "ROLLOUT_RUNC_STATE="+r.opts.StateDir, "ROLLOUT_RUNC_DATA="+r.opts.DataDir)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("subreaper child: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != "adopted 1, zombies 0" {
		t.Fatalf("subreaper child: %q, want the init adopted and no zombie left", got)
	}
}

// runcSubreaperChildEnv makes the test binary a subreaper that creates and
// closes one runc sandbox, then prints how many children it adopted while
// the sandbox ran and how many zombies it has left.
const runcSubreaperChildEnv = "ROLLOUT_RUNC_SUBREAPER_CHILD"

func runcSubreaperChild() int {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	r, err := childRunc(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer r.Close(ctx)
	s, err := r.Create(ctx, sandbox.Spec{Image: os.Getenv(runcSubreaperChildEnv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	adopted := len(children())
	if err := s.Close(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	zombies := 0
	for _, st := range children() {
		if st == "Z" {
			zombies++
		}
	}
	fmt.Printf("adopted %d, zombies %d\n", adopted, zombies)
	return 0
}

// children lists the states of this process's children.
func children() []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
		f := strings.Fields(rest)
		if len(f) > 1 && f[1] == fmt.Sprint(os.Getpid()) {
			out = append(out, f[0])
		}
	}
	return out
}

// Unpacked images the engine no longer has are pruned; those it has, and
// those a sandbox's overlay uses, are kept.
func TestRuncPruneImages(t *testing.T) {
	s := newRuncSandbox(t, sandbox.Spec{})
	r := s.r
	gone := filepath.Join(r.images.dir, strings.Repeat("0", 63)+"1")
	if err := os.MkdirAll(filepath.Join(gone, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	pruned, err := r.images.prune(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pruned) != 1 || pruned[0] != "sha256:"+filepath.Base(gone) {
		t.Errorf("pruned %v, want only the image the engine does not have", pruned)
	}
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("%s left: %v", gone, err)
	}
	if _, err := os.Stat(filepath.Join(r.images.dir, strings.TrimPrefix(s.ImageID(), "sha256:"))); err != nil {
		t.Errorf("the running sandbox's image was removed: %v", err)
	}
}

// A pool fills from the runc backend like from Docker's.
func TestRuncPool(t *testing.T) {
	r := needRunc(t)
	ctx := context.Background()
	p := sandbox.NewPool(r, sandbox.PoolOptions{MaxIdle: 2})
	defer p.Close(ctx)
	if err := p.Warm(sandbox.Spec{Image: sandboxtest.Image}, 2); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		s, err := p.Create(ctx, sandbox.Spec{Image: sandboxtest.Image})
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"echo", "hi"}})
		if err != nil || string(res.Stdout) != "hi\n" {
			t.Fatalf("exec in pooled runc sandbox: %q %v", res.Stdout, err)
		}
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
