// Package builtin is the one list of the sandbox backends linked into
// rollout: importing it registers each of them with package sandbox
// (sandbox.Lookup). Only the composition root, cmd/rollout and the
// developer tools import it, so the packages below them never link a
// backend's client library.
package builtin

import (
	// Each backend registers itself in its init.
	_ "github.com/rollout-rl/rollout/sandbox/docker"
	_ "github.com/rollout-rl/rollout/sandbox/kubernetes"
	_ "github.com/rollout-rl/rollout/sandbox/runc"
)
