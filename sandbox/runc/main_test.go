package runc

import (
	"context"
	"testing"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
)

// imageErr is why the test image is missing: the local Docker engine is
// the runc backend's image store, so without it the tests skip.
var imageErr error

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandboxtest.Hooks{
		Children: map[string]func() int{
			runcOwnerChildEnv:     runcOwnerChild,
			runcSubreaperChildEnv: runcSubreaperChild,
		},
		Setup: func(ctx context.Context) error {
			imageErr = sandboxtest.EnsureImage(ctx)
			return imageErr
		},
		Teardown: closeTestRunc,
	})
}

// needImage skips (or fails under CI=true, already handled in TestMain)
// when the test image could not be made.
func needImage(t testing.TB) {
	t.Helper()
	if imageErr != nil {
		t.Skipf("Docker not usable (set CI=true to make this a failure): %v", imageErr)
	}
}
