package runc

import (
	"testing"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
)

var _ sandbox.Tunneler = (*runcSandbox)(nil)

// The runc backend's sandboxes tunnel like Docker's.
func TestRuncTunnel(t *testing.T) {
	sandboxtest.TunnelSuite(t, func(t *testing.T) sandbox.Sandbox { return newRuncSandbox(t, sandbox.Spec{}) })
}

func TestRuncTunnelResetInPlace(t *testing.T) { sandboxtest.TunnelResetInPlace(t, needRunc(t)) }

func BenchmarkRuncTunnel(b *testing.B) {
	sandboxtest.BenchTunnel(b, newRuncSandbox(b, sandbox.Spec{}))
}
