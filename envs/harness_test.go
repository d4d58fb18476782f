package envs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/rewards"
)

const harnessYAML = `
name: harness-demo
prompt: "Fix the bug in {{.file}}."
sandbox:
  image: rollout-harness:sid
harness:
  command: "python3 /opt/agent.py {{.flags}}"
  apis: [openai, anthropic]
  prompt_via: file
  budget: "{{.budget}}"
  max_calls: 5
items:
  - {id: a, file: main.go, flags: --stream, budget: 90s}
  - {id: b, file: x.go, flags: "", budget: soon}
rewards:
  - {type: exit_code, command: "true"}
`

func TestYAMLHarness(t *testing.T) {
	p := filepath.Join(t.TempDir(), "h.yaml")
	if err := os.WriteFile(p, []byte(harnessYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	items, err := e.Items(context.Background(), "")
	if err != nil || len(items) != 2 {
		t.Fatalf("items %v, %v", items, err)
	}
	task, err := e.Task(context.Background(), items[0])
	if err != nil {
		t.Fatal(err)
	}
	h := task.Harness
	if h == nil || task.Sandbox == nil {
		t.Fatalf("task without harness or sandbox: %+v", task)
	}
	if h.Command != "python3 /opt/agent.py --stream" || h.Budget != 90*time.Second || h.Prompt != "Fix the bug in main.go." ||
		h.PromptVia != PromptFile || h.Port != DefaultHarnessPort || len(h.APIs) != 2 || h.MaxCalls != 5 {
		t.Fatalf("harness %+v", h)
	}
	// A bad budget in one item is that item's error, not the env's.
	if _, err := e.Task(context.Background(), items[1]); !errors.Is(err, datasets.ErrInvalid) || !strings.Contains(err.Error(), `harness.budget "soon"`) {
		t.Fatalf("bad budget: %v", err)
	}
}

func TestYAMLHarnessRefused(t *testing.T) {
	base := func() YAMLSpec {
		return YAMLSpec{Name: "h", Prompt: "p", Items: []map[string]any{{"id": "a"}},
			Sandbox: &YAMLSandbox{Image: "rollout-harness:sid"},
			Harness: &YAMLHarness{Command: "agent", APIs: []string{"openai"}}}
	}
	for _, c := range []struct {
		edit func(*YAMLSpec)
		want string
	}{
		{func(s *YAMLSpec) { s.Harness.Command = " " }, "harness.command is required"},
		{func(s *YAMLSpec) { s.Harness.APIs = nil }, "harness.apis: name at least one"},
		{func(s *YAMLSpec) { s.Harness.APIs = []string{"gemini"} }, `unknown API "gemini"`},
		{func(s *YAMLSpec) { s.Harness.PromptVia = "pipe" }, "harness.prompt_via"},
		{func(s *YAMLSpec) { s.Harness.Budget = "-1s" }, "budget must not be negative"},
		{func(s *YAMLSpec) { s.Harness.Budget = "later" }, "harness.budget"},
		{func(s *YAMLSpec) { s.Harness.Port = 70000 }, "harness.port 70000"},
		{func(s *YAMLSpec) { s.Harness.Env = map[string]string{"OPENAI_BASE_URL": "x"} }, "OPENAI_BASE_URL is set by rollout"},
		{func(s *YAMLSpec) { s.Sandbox = nil }, "a harness runs in the sandbox"},
		{func(s *YAMLSpec) { s.Toolsets = []string{"terminal"} }, "a harness brings its own tools"},
	} {
		s := base()
		s.Rewards = []rewards.Spec{{Type: "exit_code", Command: "true"}}
		c.edit(&s)
		if _, err := NewYAMLEnv(s, t.TempDir()); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want %q, got %v", c.want, err)
		}
	}
}
