package kubernetes

import (
	"testing"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
)

// Pods run the same agent over their exec stream, so they tunnel through
// ChannelOps.Listen like Docker and runc sandboxes.
var _ sandbox.Tunneler = (*k8sSandbox)(nil)

// On the lab (its bridge CNI gives network "none" pods an interface, so
// the suite does not check for lo alone).
func TestKubernetesTunnel(t *testing.T) {
	k := needKube(t)
	sandboxtest.TunnelSuitePods(t, func(t *testing.T) sandbox.Sandbox { return newKubeSandbox(t, k, sandbox.Spec{}) })
}
