package docker

import (
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
)

// The Docker rows of docs/security.md's limits table that a sandbox proves
// by exceeding them (disk: TestDiskLimitWritableRoot, TestDiskLimitReadOnlyRoot;
// network: TestNetworkEgressIsolation; runtime: TestRunsc).

func TestLimitMemoryEnforced(t *testing.T) {
	sandboxtest.MemoryLimitEnforced(t, needDocker(t), sandboxtest.Image, time.Minute)
}

func TestLimitPIDsEnforced(t *testing.T) {
	sandboxtest.PIDsLimitEnforced(t, needDocker(t), sandboxtest.Image, time.Minute)
}

func TestLimitCPUsApplied(t *testing.T) {
	sandboxtest.CPULimitApplied(t, needDocker(t), sandboxtest.Image, time.Minute)
}
