package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// `rollout sandbox image push` refuses a bad --registry as a usage error
// (exit 2) before contacting the engine.
func TestSandboxImagePushUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"rollout-sandbox:busybox"}, "registry: empty"},
		{[]string{"--registry", "http://127.0.0.1:5000", "rollout-sandbox:busybox"}, "without a scheme"},
		{[]string{"--registry", "127.0.0.1:5000/path", "rollout-sandbox:busybox"}, "without a scheme or path"},
		{[]string{"--registry", "127.0.0.1:5000"}, "requires at least 1 arg"},
	} {
		root := newRootCmd()
		var out, errOut bytes.Buffer
		root.SetArgs(append([]string{"sandbox", "image", "push"}, tc.args...))
		root.SetOut(&out)
		root.SetErr(&errOut)
		err := root.ExecuteContext(context.Background())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error containing %q", tc.args, err, tc.want)
			continue
		}
		var ee *exitError
		if strings.Contains(tc.want, "registry") || strings.Contains(tc.want, "scheme") {
			if !errors.As(err, &ee) || ee.code != 2 {
				t.Errorf("%v: %v is not a usage error (exit 2)", tc.args, err)
			}
		}
	}
}
