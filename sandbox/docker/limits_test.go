package docker

import (
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
)

// The Docker rows of docs/security.md's limits table that a sandbox proves
// by exceeding them (disk: TestDiskLimitWritableRoot, TestDiskLimitReadOnlyRoot;
// network: TestNetworkEgressIsolation; runtime: TestRunsc).

func TestLimitMemoryEnforced(t *testing.T) {
	sandboxtest.MemoryLimitEnforced(t, needDocker(t), sandbox.Spec{Image: sandboxtest.Image}, time.Minute)
}

func TestLimitPIDsEnforced(t *testing.T) {
	sandboxtest.PIDsLimitEnforced(t, needDocker(t), sandbox.Spec{Image: sandboxtest.Image}, time.Minute)
}

func TestLimitCPUsApplied(t *testing.T) {
	sandboxtest.CPULimitApplied(t, needDocker(t), sandbox.Spec{Image: sandboxtest.Image}, time.Minute)
}

// The same rows under gVisor (runtime runsc): memory through the
// container's cgroup (the sentry's), pids through RLIMIT_NPROC in the
// sentry's kernel (the pids cgroup does not see gVisor's tasks), the CPU
// quota on the sentry's cgroup (read from the host: gVisor shows no
// cgroup files of the host's).
func TestRunscLimitMemoryEnforced(t *testing.T) {
	needRunsc(t)
	sandboxtest.MemoryLimitEnforced(t, needDocker(t), sandbox.Spec{Image: sandboxtest.Image, Runtime: sandbox.RuntimeRunsc}, time.Minute)
}

func TestRunscLimitPIDsEnforced(t *testing.T) {
	needRunsc(t)
	sandboxtest.PIDsLimitEnforced(t, needDocker(t), sandbox.Spec{Image: sandboxtest.Image, Runtime: sandbox.RuntimeRunsc}, time.Minute)
}
