package job

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/runner"
)

// A run directory resumes only under a config that defines the same groups.
func TestSameRun(t *testing.T) {
	base := runner.Config{Env: "terminal-tasks", GroupSize: 4, Seed: 3,
		Inference: inference.Config{Backend: "vllm", Endpoints: []string{"http://127.0.0.1:1"}}}
	prior, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	same := base
	same.Limits.RolloutsInFlight = 7 // concurrency may change
	same.Inference.Endpoints = []string{"http://127.0.0.1:2"}
	if err := sameRun(prior, same); err != nil {
		t.Fatalf("same groups refused: %v", err)
	}
	other := base
	other.GroupSize = 8
	if err := sameRun(prior, other); err == nil || !strings.Contains(err.Error(), "group_size 4") {
		t.Fatalf("changed group size: %v", err)
	}
	other = base
	other.Env = "swe-tests"
	if err := sameRun(prior, other); err == nil || !strings.Contains(err.Error(), "env") {
		t.Fatalf("changed env: %v", err)
	}
	if err := sameRun(nil, other); err != nil {
		t.Fatalf("no prior config: %v", err)
	}
	if err := sameRun(json.RawMessage(`{"group_size":"x"}`), base); err == nil || errors.Is(err, runner.ErrConfig) {
		t.Fatalf("unreadable prior config: %v", err)
	}
}
