package docker

import (
	"testing"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
)

var _ sandbox.Tunneler = (*dockerSandbox)(nil)

// A process in a sandbox without network reaches the host's HTTP server
// through the tunnel (sandbox.Tunneler), and nothing else.
func TestTunnel(t *testing.T) {
	sandboxtest.TunnelSuite(t, func(t *testing.T) sandbox.Sandbox { return newSandbox(t, sandbox.Spec{}) })
}

// A sandbox reset in place for its next holder keeps nothing of the
// previous holder's tunnel.
func TestTunnelResetInPlace(t *testing.T) { sandboxtest.TunnelResetInPlace(t, needDocker(t)) }

// BenchmarkTunnel: the tunnel vs a plain loopback TCP connection on the
// host (sandbox/README.md, "The tunnel").
func BenchmarkTunnel(b *testing.B) {
	s := newSandbox(b, sandbox.Spec{})
	sandboxtest.BenchTunnel(b, s)
}
