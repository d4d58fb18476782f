package kubernetes

import (
	"testing"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
)

// The backend under test is made on first use (needKube) and only with the
// lab; TestMain closes it.
func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandboxtest.Hooks{Teardown: closeTestKube})
}
