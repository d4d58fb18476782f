package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/sandbox/image"
)

// sandboxCmd runs `rollout sandbox args...` in process.
func sandboxCmd(t *testing.T, args ...string) (stdout, stderr string, code int, err error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetArgs(append([]string{"sandbox"}, args...))
	root.SetOut(&out)
	root.SetErr(&errOut)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = root.ExecuteContext(ctx)
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		code = ee.code
	case err != nil:
		code = 1
	}
	return out.String(), errOut.String(), code, err
}

func TestSandboxRunAndGC(t *testing.T) {
	img, err := image.EnsureBusybox(context.Background())
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Docker image not available under CI: %v", err)
		}
		t.Skipf("Docker not usable: %v", err)
	}
	tests := []struct {
		name     string
		args     []string
		code     int
		stdout   string
		stderrIn string
	}{
		{name: "exit code", args: []string{"run", "--image", img, "--", "sh", "-c", "id -u; echo e >&2; exit 3"}, code: 3, stdout: "1000\n", stderrIn: "exit code 3"},
		{name: "shell and env", args: []string{"run", "--image", img, "-e", "A=b", "--shell", "--", "echo", "$A"}, stdout: "b\n"},
		{name: "timeout", args: []string{"run", "--image", img, "--timeout", "300ms", "--", "sleep", "100"}, code: 124, stderrIn: "timed out"},
		{name: "no network", args: []string{"run", "--image", img, "--", "ls", "/sys/class/net"}, stdout: "lo\n"},
		{name: "missing image", args: []string{"run", "--image", "rollout-no-such:x", "--", "true"}, code: 2},
		{name: "no command", args: []string{"run", "--image", img}, code: 2},
		{name: "bad env", args: []string{"run", "--image", img, "-e", "novalue", "--", "true"}, code: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code, err := sandboxCmd(t, tt.args...)
			if code != tt.code {
				t.Fatalf("code %d, want %d (err %v, stderr %q)", code, tt.code, err, errOut)
			}
			if tt.stdout != "" && out != tt.stdout {
				t.Errorf("stdout %q, want %q", out, tt.stdout)
			}
			if tt.stderrIn != "" && !strings.Contains(errOut, tt.stderrIn) {
				t.Errorf("stderr %q lacks %q", errOut, tt.stderrIn)
			}
		})
	}
	out, _, code, err := sandboxCmd(t, "gc")
	if code != 0 || !strings.Contains(out, "container(s) removed") {
		t.Fatalf("gc: %d %q %v", code, out, err)
	}
}
