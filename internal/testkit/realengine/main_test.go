package realengine

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) {
		if binDir != "" {
			os.RemoveAll(binDir)
		}
	}))
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// rolloutBin builds the rollout binary and the sandbox agent once per test
// binary and returns the path of rollout. The suite runs the real binary,
// as a user would. Both builds use `make build`'s compile flags, so that
// the Go build cache makes them links when it ran first: a rollout build
// with other flags (it once had -trimpath) recompiles every dependency,
// which on a slow 2-core machine under the rest of the test run took longer
// than the timeout below.
func rolloutBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "realengine-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binDir = dir
		ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
		defer cancel()
		for _, b := range []struct {
			out, pkg string
			flags    []string
			env      []string
		}{
			{"rollout", "github.com/rollout-rl/rollout/cmd/rollout", nil, nil},
			{"rollout-agent", "github.com/rollout-rl/rollout/sandbox/agent/cmd/rollout-agent", []string{"-trimpath"}, []string{"CGO_ENABLED=0"}},
		} {
			args := append(append([]string{"build"}, b.flags...), "-o", filepath.Join(dir, b.out), b.pkg)
			cmd := exec.CommandContext(ctx, "go", args...)
			cmd.Env = append(os.Environ(), b.env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "rollout")
}

// runRollout runs the binary and returns its stdout, stderr and exit code.
func runRollout(t *testing.T, ctx context.Context, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, rolloutBin(t), args...)
	cmd.WaitDelay = 10 * time.Second
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("rollout %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errOut.String(), code
}
