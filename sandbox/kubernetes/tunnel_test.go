package kubernetes

import "github.com/rollout-rl/rollout/sandbox"

// Pods run the same agent over their exec stream, so they tunnel through
// ChannelOps.Listen like Docker and runc sandboxes (not yet exercised in
// the lab: sandboxtest.TunnelSuite against a pod is still to run).
var _ sandbox.Tunneler = (*k8sSandbox)(nil)
