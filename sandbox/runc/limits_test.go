package runc

import (
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
)

// The runc rows of docs/security.md's limits table (disk: TestRuncDiskLimit;
// read_only_root: TestRuncReadOnlyRoot).

func TestRuncLimitMemoryEnforced(t *testing.T) {
	sandboxtest.MemoryLimitEnforced(t, needRunc(t), sandbox.Spec{Image: sandboxtest.Image}, time.Minute)
}

func TestRuncLimitPIDsEnforced(t *testing.T) {
	sandboxtest.PIDsLimitEnforced(t, needRunc(t), sandbox.Spec{Image: sandboxtest.Image}, time.Minute)
}

func TestRuncLimitCPUsApplied(t *testing.T) {
	sandboxtest.CPULimitApplied(t, needRunc(t), sandbox.Spec{Image: sandboxtest.Image}, time.Minute)
}

// network other than none and runtime runsc are refused, naming the
// backend, before anything is made.
func TestRuncLimitRefusals(t *testing.T) {
	r := needRunc(t)
	sandboxtest.Refused(t, r, sandbox.Spec{Image: sandboxtest.Image, Network: sandbox.NetworkBridge}, "network", "runc backend")
	sandboxtest.Refused(t, r, sandbox.Spec{Image: sandboxtest.Image, Network: sandbox.NetworkOpen}, "network", "runc backend")
	sandboxtest.Refused(t, r, sandbox.Spec{Image: sandboxtest.Image, Runtime: sandbox.RuntimeRunsc}, "runtime", "runc backend")
}
