package runc

import (
	"testing"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
)

// The runc backend's sandboxes reset in place just as well.
func TestRuncReuseResetsEveryTrace(t *testing.T) { sandboxtest.ReuseResetsEveryTrace(t, needRunc(t)) }

// The runc backend's pool counts them the same way.
func TestRuncReuseHeldSandboxesServeDemand(t *testing.T) {
	sandboxtest.ReuseHeldSandboxesServeDemand(t, needRunc(t))
}
