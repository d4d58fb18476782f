package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
)

// runRolloutCmd runs `rollout args...` in process and returns stdout,
// stderr-or-error text and the exit code execute would use.
func runRolloutCmd(t *testing.T, args ...string) (stdout, msg string, code int) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errOut)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := root.ExecuteContext(ctx)
	if err != nil {
		code = 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		} else if isUsageError(err) {
			code = 2
		}
		msg = err.Error()
	}
	return out.String(), errOut.String() + msg, code
}

const deadDockerHost = "unix:///nonexistent/rollout-test-docker.sock"

func TestVersionCmd(t *testing.T) {
	t.Run("engine unreachable is not an error", func(t *testing.T) {
		t.Setenv("DOCKER_HOST", deadDockerHost)
		out, msg, code := runRolloutCmd(t, "version")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, msg)
		}
		want := regexp.MustCompile(`^rollout \S+\ncommit: \S+\ngo: go1\.\S+\ndocker: unreachable \(` + regexp.QuoteMeta(deadDockerHost) + `\)\n$`)
		if !want.MatchString(out) {
			t.Errorf("output:\n%s\nwant to match %s", out, want)
		}
	})
	t.Run("bad flag", func(t *testing.T) {
		_, msg, code := runRolloutCmd(t, "version", "--nope")
		if code != 2 || !strings.Contains(msg, "unknown flag") {
			t.Errorf("exit %d, %q; want 2 with usage", code, msg)
		}
	})
	t.Run("engine reachable", func(t *testing.T) {
		requireDockerForCLI(t)
		out, msg, code := runRolloutCmd(t, "version")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, msg)
		}
		if !regexp.MustCompile(`(?m)^docker: engine \S+, API 1\.\d+ \(client uses 1\.\d+\)$`).MatchString(out) {
			t.Errorf("no Docker API line in:\n%s", out)
		}
	})
}

func TestDoctorCmd(t *testing.T) {
	t.Run("engine unreachable", func(t *testing.T) {
		t.Setenv("DOCKER_HOST", deadDockerHost)
		out, _, code := runRolloutCmd(t, "doctor", "--skip-agent")
		if code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 1 {
			t.Fatalf("want exactly one line, got:\n%s", out)
		}
		for _, want := range []string{"FAIL", deadDockerHost, "start the Docker daemon", "DOCKER_HOST"} {
			if !strings.Contains(lines[0], want) {
				t.Errorf("line %q lacks %q", lines[0], want)
			}
		}
		if strings.Contains(out, "goroutine") || strings.Contains(out, ".go:") {
			t.Errorf("looks like a stack trace:\n%s", out)
		}
	})
	t.Run("bad flag", func(t *testing.T) {
		_, _, code := runRolloutCmd(t, "doctor", "--bogus")
		if code != 2 {
			t.Errorf("exit %d, want 2", code)
		}
	})
	t.Run("real engine", func(t *testing.T) {
		requireDockerForCLI(t)
		out, _, code := runRolloutCmd(t, "doctor", "--skip-agent")
		line := regexp.MustCompile(`^(ok|info|warn|FAIL) +\S.*?: .+$`)
		failed := false
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if !line.MatchString(l) {
				t.Errorf("malformed line %q", l)
			}
			failed = failed || strings.HasPrefix(l, "FAIL")
		}
		for _, want := range []string{"ok    docker engine:", "storage driver:", "disk:", "image rollout-sandbox:bookworm:", "image rollout-sandbox:busybox:"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		// The exit code follows the report: 1 exactly when a line failed.
		if (code == 1) != failed || (code != 0 && code != 1) {
			t.Errorf("exit %d with failed=%v:\n%s", code, failed, out)
		}
	})
}

// requireDockerForCLI skips without an engine, or fails under CI=true.
func requireDockerForCLI(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := dockerclient.New(ctx)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and the Docker engine is unreachable: %v", err)
		}
		t.Skipf("Docker engine unreachable (set CI=true to fail instead): %v", err)
	}
	cli.Close()
}

func TestSandboxImageBuildCmd(t *testing.T) {
	t.Run("unknown name", func(t *testing.T) {
		_, msg, code := runRolloutCmd(t, "sandbox", "image", "build", "--name", "nope")
		if code != 2 || !strings.Contains(msg, `unknown image recipe: "nope" (known: bookworm, busybox, harness, llamacpp)`) {
			t.Errorf("exit %d, %q; want 2 naming the known recipes", code, msg)
		}
	})
	t.Run("engine unreachable", func(t *testing.T) {
		t.Setenv("DOCKER_HOST", deadDockerHost)
		_, msg, code := runRolloutCmd(t, "sandbox", "image", "build", "--name", "busybox")
		if code != 1 || !strings.Contains(msg, deadDockerHost) || strings.Count(strings.TrimSpace(msg), "\n") != 0 {
			t.Errorf("exit %d, %q; want 1 with one line naming the socket", code, msg)
		}
	})
	t.Run("busybox", func(t *testing.T) {
		requireDockerForCLI(t)
		out, msg, code := runRolloutCmd(t, "sandbox", "image", "build", "--name", "busybox")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, msg)
		}
		if !regexp.MustCompile(`rollout-sandbox:busybox: (built \(\w[\w ]*\) in \S+, id [0-9a-f]{12}|up to date \(recipe [0-9a-f]{12}\), checked in \S+)\n`).MatchString(out) {
			t.Errorf("unexpected output:\n%s", out)
		}
		// A second run is a no-op.
		out, _, _ = runRolloutCmd(t, "sandbox", "image", "build", "--name", "busybox")
		if !strings.Contains(out, "rollout-sandbox:busybox: up to date") {
			t.Errorf("second run rebuilt:\n%s", out)
		}
	})
}
