package kubernetes

import (
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
)

// The Kubernetes rows of docs/security.md's limits table, in both modes:
// memory and CPU are enforced (the pod's limits: the OOM killer and CFS
// quota of the container's cgroup), runtime runsc and network bridge are
// refused by the backend; sandbox.pids is refused by the run config's
// validation (runner.TestValidateLimitsPerBackend), an env's own pids
// by the runner (runner.TestEnvPIDsRefusedOnKubernetes) and any pids limit
// by the backend's Validate (TestKubernetesValidateSpec); read_only_root:
// TestKubernetesReadOnlyRoot.

func kubeLimitRows(t *testing.T, k *Kubernetes) {
	t.Run("memory", func(t *testing.T) {
		sandboxtest.MemoryLimitEnforced(t, k, sandbox.Spec{Image: labImage}, 2*time.Minute)
	})
	t.Run("cpus", func(t *testing.T) { sandboxtest.CPULimitApplied(t, k, sandbox.Spec{Image: labImage}, 2*time.Minute) })
	t.Run("refused", func(t *testing.T) {
		sandboxtest.Refused(t, k, sandbox.Spec{Image: labImage, Runtime: sandbox.RuntimeRunsc}, "runtime", "kubernetes backend", "runtime_class_name")
		sandboxtest.Refused(t, k, sandbox.Spec{Image: labImage, Network: sandbox.NetworkBridge}, "network", "kubernetes backend")
	})
}

func TestKubernetesLimits(t *testing.T) { kubeLimitRows(t, needKube(t)) }

func TestKubernetesAgentSandboxLimits(t *testing.T) { kubeLimitRows(t, needAgentSandbox(t, 0)) }
