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
	for _, name := range []string{"terminal-tasks", "swe-tests", "terminal-bench", "math-python", "toolcall-match", "task-suite", "web-research", "guess-number", "agentic-opd", "[eval-only]"} {
		if !strings.Contains(out, name) {
			t.Errorf("list lacks %q:\n%s", name, out)
		}
	}
	out, _, code = runRolloutCmd(t, "envs", "swe-tests")
	if code != 0 || !strings.Contains(out, "group_size: 4") || !strings.Contains(out, "test_timeout:") {
		t.Fatalf("describe: exit %d\n%s", code, out)
	}
	out, _, code = runRolloutCmd(t, "envs", "guess-number")
	if code != 0 || !strings.Contains(out, "turn_penalty: 0.05") || !strings.Contains(out, "group_size: 8") {
		t.Fatalf("describe guess-number: exit %d\n%s", code, out)
	}
	out, _, code = runRolloutCmd(t, "envs", "agentic-opd")
	if code != 0 || !strings.Contains(out, "test_timeout: 2m0s") || !strings.Contains(out, "terminal, file") {
		t.Fatalf("describe agentic-opd: exit %d\n%s", code, out)
	}
	if _, msg, code := runRolloutCmd(t, "envs", "nope"); code != 2 || !strings.Contains(msg, "known envs") {
		t.Fatalf("unknown env: exit %d %q", code, msg)
	}
}
