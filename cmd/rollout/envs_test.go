package main

import (
	"strings"
	"testing"
)

func TestEnvsListAndDescribe(t *testing.T) {
	out, _, code := runRolloutCmd(t, "envs")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, name := range []string{"terminal-tasks", "swe-tests", "terminal-bench", "math-python", "toolcall-match", "task-suite", "web-research", "[eval-only]"} {
		if !strings.Contains(out, name) {
			t.Errorf("list lacks %q:\n%s", name, out)
		}
	}
	out, _, code = runRolloutCmd(t, "envs", "swe-tests")
	if code != 0 || !strings.Contains(out, "group_size: 4") || !strings.Contains(out, "test_timeout:") {
		t.Fatalf("describe: exit %d\n%s", code, out)
	}
	if _, msg, code := runRolloutCmd(t, "envs", "nope"); code != 2 || !strings.Contains(msg, "known envs") {
		t.Fatalf("unknown env: exit %d %q", code, msg)
	}
}
