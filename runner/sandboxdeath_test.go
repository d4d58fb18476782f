package runner

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/moby/moby/client"
	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/sandbox/host"
	"github.com/rollout-rl/rollout/sandbox/image"
)

// killEnv's reward kills its own container from outside (as the OOM
// killer or an operator would) and then reads a file from it.
type killEnv struct {
	image string
	cli   *client.Client
}

func (e *killEnv) Name() string            { return "kill" }
func (e *killEnv) Defaults() envs.Defaults { return envs.Defaults{GroupSize: 1, MaxTurns: 5} }
func (e *killEnv) Items(context.Context, string) ([]datasets.Item, error) {
	return []datasets.Item{{ID: "only", Data: map[string]any{}}}, nil
}
func (e *killEnv) Task(context.Context, datasets.Item) (envs.Task, error) {
	return envs.Task{Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "go"}},
		Toolsets: []string{"terminal"}, Sandbox: &sandbox.Spec{Image: e.image}}, nil
}
func (e *killEnv) Reward(ctx context.Context, _ datasets.Item, out envs.Outcome, sb envs.Sandbox) (rewards.Score, error) {
	id := out.Tools.Sandbox().ID()
	if _, err := e.cli.ContainerKill(ctx, id, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		return rewards.Score{}, errors.New("test setup: kill: " + err.Error())
	}
	if _, err := sb.ReadFile(ctx, "/etc/passwd"); err != nil {
		return rewards.Score{}, err
	}
	return rewards.Score{Value: 1}, nil
}

// A sandbox that dies while the reward runs is a sandbox failure, not a
// reward failure.
func TestSandboxDeathDuringRewardIsSandboxFailure(t *testing.T) {
	ctx := context.Background()
	ref, err := image.EnsureBusybox(ctx)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and Docker is not usable: %v", err)
		}
		t.Skipf("Docker not usable: %v", err)
	}
	d, err := docker.New(ctx, docker.Options{Options: host.Options{Instance: newID("runnertest"), ReapInterval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(ctx)
	cfg := baseConfig()
	cfg.GroupSize = 1
	cfg.Retries = -1
	sink := &memSink{}
	r, err := New(cfg, Deps{Logger: quiet, Env: &killEnv{image: ref, cli: d.Client()}, Policy: toolPolicy{}, Sandboxes: d, Sinks: []Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	ro := sink.groups[0].Rollouts[0]
	if ro.Failure == nil || ro.Failure.Kind != FailSandbox {
		t.Fatalf("rollout %s %+v, want a sandbox failure", ro.Status, ro.Failure)
	}
}
