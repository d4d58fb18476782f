package docker

import (
	"context"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

var (
	dockerErr  error // why Docker tests cannot run
	testDocker *Docker
)

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandboxtest.Hooks{
		Children: map[string]func() int{ownerChildEnv: ownerChild},
		Setup: func(ctx context.Context) error {
			dockerErr = setupDocker(ctx)
			return dockerErr
		},
		Teardown: func(ctx context.Context) error {
			if testDocker == nil {
				return nil
			}
			return testDocker.Close(ctx)
		},
	})
}

func setupDocker(ctx context.Context) error {
	if err := sandboxtest.EnsureImage(ctx); err != nil {
		return err
	}
	d, err := New(ctx, Options{Options: host.Options{Instance: "test-" + sandbox.RandomID(4), ReapInterval: -1}})
	if err != nil {
		return err
	}
	testDocker = d
	return nil
}

// needDocker skips (or fails under CI=true, already handled in TestMain)
// when the engine is unusable.
func needDocker(t testing.TB) *Docker {
	t.Helper()
	if dockerErr != nil {
		t.Skipf("Docker not usable (set CI=true to make this a failure): %v", dockerErr)
	}
	return testDocker
}

func newSandbox(t testing.TB, spec sandbox.Spec) sandbox.Sandbox {
	t.Helper()
	return sandboxtest.CreateOn(t, needDocker(t), spec, sandboxtest.Image, time.Minute)
}
