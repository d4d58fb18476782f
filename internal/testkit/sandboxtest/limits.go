package sandboxtest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
)

// The rows of docs/security.md's limits table that a sandbox proves from
// inside: each exceeds its limit and checks that the sandbox was stopped
// or held back, never that it merely carries a setting. base is the spec
// the row's limit is set on (its image a busybox layout such as Image, a
// runtime); every sandbox is closed when the test ends.

// MemoryLimitEnforced: a process that touches more memory than
// Limits.MemoryBytes is OOM-killed (exit 137), while the same command
// under the limit succeeds (so the kill is the limit's, not the command's).
func MemoryLimitEnforced(t *testing.T, b sandbox.Backend, base sandbox.Spec, timeout time.Duration) {
	t.Helper()
	base.Limits.MemoryBytes = 64 << 20
	s := CreateOn(t, b, base, Image, timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// dd allocates one block of bs bytes and fills it from /dev/zero: every
	// page of it is touched.
	small, err := s.Exec(ctx, sandbox.ExecRequest{Command: "dd if=/dev/zero of=/dev/null bs=8M count=1 2>/dev/null && echo ok"})
	if err != nil {
		t.Fatalf("8 MiB under a 64 MiB limit: %v", err)
	}
	if small.ExitCode != 0 || strings.TrimSpace(string(small.Stdout)) != "ok" {
		t.Fatalf("8 MiB under a 64 MiB limit: exit %d, stdout %q, stderr %q", small.ExitCode, small.Stdout, small.Stderr)
	}
	big, err := s.Exec(ctx, sandbox.ExecRequest{Command: "dd if=/dev/zero of=/dev/null bs=256M count=1 2>/dev/null && echo ok"})
	switch {
	case err != nil:
		// The OOM killer may take the sandbox's own machinery: the sandbox
		// was stopped, which the limit allows; it must say so as a sandbox
		// error, not as a result.
		if !errors.Is(err, sandbox.ErrUnavailable) && !errors.Is(err, sandbox.ErrClosed) {
			t.Fatalf("256 MiB over a 64 MiB limit: error %v is neither ErrUnavailable nor ErrClosed", err)
		}
	case big.ExitCode == 0 || strings.Contains(string(big.Stdout), "ok"):
		t.Fatalf("256 MiB over a 64 MiB limit succeeded: exit %d, stdout %q", big.ExitCode, big.Stdout)
	case big.ExitCode != 137:
		t.Fatalf("256 MiB over a 64 MiB limit: exit %d (stderr %q), want 137 (SIGKILL by the OOM killer)", big.ExitCode, big.Stderr)
	}
}

// PIDsLimitEnforced: a loop that forks background processes until it
// cannot gets EAGAIN ("can't fork") by the time Limits.PIDs processes exist,
// and the sandbox serves commands again once they are gone.
func PIDsLimitEnforced(t *testing.T, b sandbox.Backend, base sandbox.Spec, timeout time.Duration) {
	t.Helper()
	const limit = 64
	base.Limits.PIDs = limit
	s := CreateOn(t, b, base, Image, timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// Only builtins between the forks: the count is written with a
	// redirection (no fork), so it survives the shell's exit at the first
	// failed fork.
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: `i=0; while [ $i -lt 1000 ]; do sleep 600 </dev/null >/dev/null 2>&1 & i=$((i+1)); echo $i >/tmp/forked; done; echo all-forked`})
	if err != nil {
		t.Fatalf("fork loop: %v", err)
	}
	if r.ExitCode == 0 || strings.Contains(string(r.Stdout), "all-forked") {
		t.Fatalf("1000 forks under pids %d: exit %d, stdout %q: the limit did not hold", limit, r.ExitCode, r.Stdout)
	}
	if !strings.Contains(string(r.Stderr), "can't fork") && !strings.Contains(string(r.Stderr), "Resource temporarily unavailable") {
		t.Errorf("fork loop's stderr %q does not say the fork failed", r.Stderr)
	}
	data, err := s.ReadFile(ctx, "/tmp/forked")
	if err != nil {
		t.Fatalf("read the fork count: %v", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	// The pids cgroup counts the sandbox's own machinery too (fewer than
	// limit forks succeed); RLIMIT_NPROC, gVisor's bound, counts the
	// sandbox user's processes only.
	if err != nil || n <= 0 || n > limit {
		t.Fatalf("forked %q processes, want between 1 and %d", data, limit)
	}
	q, ok := s.(sandbox.Quiescer)
	if !ok {
		return // Close (the test's cleanup) ends them
	}
	if _, err := q.KillAll(ctx); err != nil {
		t.Fatalf("kill the forked processes: %v", err)
	}
	again, err := s.Exec(ctx, sandbox.ExecRequest{Command: "echo alive"})
	if err != nil || strings.TrimSpace(string(again.Stdout)) != "alive" {
		t.Fatalf("after the fork loop's processes were killed: %v, %q", err, again.Stdout)
	}
}

// CPULimitApplied: the CPU quota of the sandbox's cgroup, read from inside
// (cgroup v2 cpu.max or v1 cpu.cfs_quota_us/cpu.cfs_period_us), is
// Limits.CPUs. The kernel's CFS throttling then holds the sandbox to it; a
// test of the throttling itself would have to measure time, which tests
// here never assert on.
func CPULimitApplied(t *testing.T, b sandbox.Backend, base sandbox.Spec, timeout time.Duration) {
	t.Helper()
	const cpus = 0.5
	base.Limits.CPUs = cpus
	s := CreateOn(t, b, base, Image, timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: `if [ -r /sys/fs/cgroup/cpu.max ]; then cat /sys/fs/cgroup/cpu.max; else echo "$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"; fi`})
	if err != nil {
		t.Fatalf("read the cpu quota: %v", err)
	}
	f := strings.Fields(string(r.Stdout))
	if r.ExitCode != 0 || len(f) != 2 {
		t.Fatalf("cpu quota: exit %d, stdout %q, stderr %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	quota, qerr := strconv.ParseFloat(f[0], 64)
	period, perr := strconv.ParseFloat(f[1], 64)
	if qerr != nil || perr != nil || period <= 0 {
		t.Fatalf("cpu quota %q: no quota set (want %v CPUs)", r.Stdout, cpus)
	}
	if got := quota / period; got < cpus*0.99 || got > cpus*1.01 {
		t.Fatalf("cpu quota %s: %.3f CPUs, want %v", strings.TrimSpace(string(r.Stdout)), got, cpus)
	}
}

// Refused asserts that creating spec on b fails with ErrInvalid and a
// message naming want (the key and the backend), before any sandbox exists.
func Refused(t *testing.T, b sandbox.Backend, spec sandbox.Spec, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := b.Create(ctx, spec)
	if err == nil {
		_ = s.Close(context.Background())
		t.Fatalf("spec %+v was accepted, want it refused", spec)
	}
	if !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("spec %+v: %v, want ErrInvalid", spec, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("refusal %q does not name %q", err, w)
		}
	}
}
