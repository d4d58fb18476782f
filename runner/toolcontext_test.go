package runner

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/sandbox/host"
	"github.com/rollout-rl/rollout/sandbox/image"
)

// toolPolicy plays a fixed episode: it changes directory and exports a
// variable, leaves a background process running, then answers.
type toolPolicy struct{}

func (toolPolicy) Start(context.Context, inference.EpisodeSpec) (inference.Episode, error) {
	return &toolEpisode{}, nil
}

type toolEpisode struct{ turn atomic.Int32 }

func (e *toolEpisode) Generate(context.Context, []openai.ChatCompletionMessage) (inference.Turn, error) {
	call := func(args string) inference.Turn {
		return inference.Turn{Parsed: true, FinishReason: "tool_calls", ToolCalls: []openai.ToolCall{{
			ID: "call_1", Type: openai.ToolTypeFunction,
			Function: openai.FunctionCall{Name: "terminal", Arguments: args}}}}
	}
	switch e.turn.Add(1) {
	case 1:
		return call(`{"command":"mkdir -p /tmp/w && cd /tmp/w && export SECRET=42"}`), nil
	case 2:
		return call(`{"command":"sleep 1000","background":true}`), nil
	case 3:
		// A writer detached into its own session (out of reach of the
		// command's process group), launched through a script so that the
		// terminal tool's detach check does not see it, that would rewrite
		// what the reward reads.
		return call(`{"command":"echo 'setsid sh -c \"while true; do echo forged > /tmp/w/report; sleep 0.05; done\" </dev/null >/dev/null 2>&1 &' > /tmp/w/d.sh && sh /tmp/w/d.sh"}`), nil
	}
	return inference.Turn{Parsed: true, Content: "done", FinishReason: "stop"}, nil
}

func (e *toolEpisode) Finish(context.Context, []openai.ChatCompletionMessage) (inference.Sequence, error) {
	return inference.Sequence{}, nil
}

// tcEnv's reward reads the agent's shell state through the ToolContext.
type tcEnv struct {
	image string
	saw   chan string
}

func (e *tcEnv) Name() string            { return "toolcontext" }
func (e *tcEnv) Defaults() envs.Defaults { return envs.Defaults{GroupSize: 1, MaxTurns: 5} }
func (e *tcEnv) Items(context.Context, string) ([]datasets.Item, error) {
	return []datasets.Item{{ID: "only", Data: map[string]any{}}}, nil
}
func (e *tcEnv) Task(context.Context, datasets.Item) (envs.Task, error) {
	return envs.Task{Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "go"}},
		Toolsets: []string{"terminal"}, Sandbox: &sandbox.Spec{Image: e.image}}, nil
}
func (e *tcEnv) Reward(ctx context.Context, _ datasets.Item, out envs.Outcome, _ envs.Sandbox) (rewards.Score, error) {
	if out.Tools == nil {
		return rewards.Score{}, errors.New("no ToolContext")
	}
	r, err := out.Tools.Terminal(ctx, `echo "$(pwd) $SECRET"`, 0)
	if err != nil {
		return rewards.Score{}, err
	}
	ps, err := out.Tools.Sandbox().Processes(ctx)
	if err != nil {
		return rewards.Score{}, err
	}
	running := 0
	for _, p := range ps {
		if p.Running {
			running++
		}
	}
	e.saw <- strings.TrimSpace(r.Output)
	tamper, err := out.Tools.Terminal(ctx, `rm -f /tmp/w/report; sleep 0.5; cat /tmp/w/report 2>/dev/null || echo clean`, 0)
	if err != nil {
		return rewards.Score{}, err
	}
	e.saw <- strings.TrimSpace(tamper.Output)
	if running != 0 {
		return rewards.Score{}, errors.New("the agent's background process still runs during the reward")
	}
	return rewards.Score{Value: 1}, nil
}

// The reward gets the rollout's ToolContext: the same shell session as the
// agent (cwd and exported variables), with every process the agent left
// (tracked background jobs and detached ones) stopped first.
func TestRewardGetsTheAgentsToolContext(t *testing.T) {
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
	env := &tcEnv{image: ref, saw: make(chan string, 4)}
	cfg := baseConfig()
	cfg.GroupSize = 1
	sink := &memSink{}
	r, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: toolPolicy{}, Sandboxes: d, Sinks: []Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := r.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sum.RolloutsOK != 1 {
		t.Fatalf("summary %+v; failure %+v", sum, sink.groups[0].Rollouts[0].Failure)
	}
	if got := <-env.saw; got != "/tmp/w 42" {
		t.Errorf("the reward's terminal saw %q, want the agent's cwd and variable %q", got, "/tmp/w 42")
	}
	if got := <-env.saw; got != "clean" {
		t.Errorf("a process the agent detached still ran during the reward: report %q", got)
	}
}
