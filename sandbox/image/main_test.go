package image

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newDocker returns a client for the real engine. With CI=true an
// unreachable engine fails the test; otherwise the test is skipped.
func newDocker(t *testing.T) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	cli, err := dockerclient.New(ctx)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and the Docker engine is unreachable: %v", err)
		}
		t.Skipf("Docker engine unreachable (set CI=true to fail instead): %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
