package docker

import (
	"context"
	"testing"
	"time"

	"github.com/moby/moby/client"

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

// Under gVisor the CPU quota sits on the sentry's cgroup, which the
// sandbox cannot see: read back from the engine.
func TestRunscLimitCPUsApplied(t *testing.T) {
	needRunsc(t)
	d := needDocker(t)
	s := newSandbox(t, sandbox.Spec{Runtime: sandbox.RuntimeRunsc, Limits: sandbox.Limits{CPUs: 0.5}})
	ins, err := d.Client().ContainerInspect(context.Background(), s.ID(), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if hc := ins.Container.HostConfig; hc.NanoCPUs != 5e8 || hc.Runtime != sandbox.RuntimeRunsc {
		t.Fatalf("runsc container: runtime %q, NanoCPUs %d, want runsc and 5e8", hc.Runtime, hc.NanoCPUs)
	}
}

// Under gVisor the disk bounds hold as under runc: the read-only root's
// tmpfs refuse writes past disk_mb, and the watchdog removes a sandbox
// that writes past it on a writable root.
func TestRunscLimitDisk(t *testing.T) {
	needRunsc(t)
	t.Run("read-only root", func(t *testing.T) { diskLimitReadOnlyRoot(t, sandbox.RuntimeRunsc) })
	t.Run("writable root", func(t *testing.T) { diskLimitWritableRoot(t, sandbox.RuntimeRunsc) })
}
