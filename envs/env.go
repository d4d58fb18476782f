// Package envs defines what an environment is — how a dataset item becomes
// a task (messages, tools, sandbox) and how a finished rollout is scored —
// plus the registry, YAML-defined envs and the built-in environments with
// their small datasets. It schedules nothing: the runner drives envs.
package envs

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/toolcontext"
	"github.com/rollout-rl/rollout/tools"
	"github.com/rollout-rl/rollout/tools/mcp"
)

// Sandbox is what an env's reward needs of the rollout's sandbox (the same
// sandbox the agent used). sandbox.Sandbox satisfies it.
type Sandbox interface {
	rewards.Box
	WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error
	Upload(ctx context.Context, dir string, tarStream io.Reader) error
}

// Env turns dataset items into tasks and scores finished rollouts.
// Implementations are safe for concurrent use.
type Env interface {
	Name() string
	Defaults() Defaults
	// Items returns the env's own dataset for a split ("train", "eval");
	// a run config may bind another dataset instead.
	Items(ctx context.Context, split string) ([]datasets.Item, error)
	Task(ctx context.Context, item datasets.Item) (Task, error)
	// Reward scores a finished rollout. sb is nil when the task has no
	// sandbox. Errors mean "could not score" (an infra failure), never a
	// wrong answer.
	Reward(ctx context.Context, item datasets.Item, out Outcome, sb Sandbox) (rewards.Score, error)
}

// Defaults are an env's preferred run settings; the run config overrides
// them.
type Defaults struct {
	Description string   `json:"description" yaml:"description"`
	GroupSize   int      `json:"group_size" yaml:"group_size"`
	MaxTurns    int      `json:"max_turns" yaml:"max_turns"`
	Toolsets    []string `json:"toolsets" yaml:"toolsets"`
	Image       string   `json:"image,omitempty" yaml:"image,omitempty"`
	// EvalOnly envs are refused by `rollout run` unless forced.
	EvalOnly bool `json:"eval_only,omitempty" yaml:"eval_only,omitempty"`
	// Splits the built-in dataset offers.
	Splits []string `json:"splits" yaml:"splits"`
}

// Task is one rollout's starting point.
type Task struct {
	Messages []openai.ChatCompletionMessage
	Toolsets []string
	// Tools are env-defined tools, executed like the built-ins.
	Tools []tools.Tool
	// CallOnly are tool schemas offered to the model but never executed:
	// the episode ends after the first generation (call matching). A task
	// with CallOnly has neither Toolsets nor Tools.
	CallOnly []openai.Tool
	// Sandbox is nil when the task runs without one.
	Sandbox *sandbox.Spec
	// Build, when set, is a task image to build FROM a local base image;
	// the runner builds it (cached) and sets Sandbox.Image.
	Build *ImageBuild
	// MCPServers add MCP servers' tools to this task (beside the run
	// config's mcp_servers); command servers run in the task's sandbox.
	MCPServers []mcp.Server
	// MaxTurns overrides the run's max_turns when > 0.
	MaxTurns int
	// Harness, when set, runs an outside agent harness in the sandbox
	// against a gateway session instead of the own agent loop (Messages
	// are then what the harness is told, for reports; Toolsets, Tools and
	// CallOnly are not offered: the harness brings its own tools).
	Harness  *Harness
	Answer   string // reference answer, for reports
	Category string // for per-category metrics
}

// ImageBuild is a Docker build context: a directory on disk or a tar.
type ImageBuild struct {
	Dir        string
	ContextTar []byte
	Dockerfile string // path inside the context, default "Dockerfile"
}

// Outcome is what the env sees of a finished episode.
type Outcome struct {
	Messages          []openai.ChatCompletionMessage
	Final             string // last assistant content
	Turns             int
	FinishedNaturally bool
	StopReason        string
	// TurnRewards are the responder's intermediate rewards, one per turn
	// (0 where it gave none); nil for an env without a Responder or when
	// it gave none. The env decides whether the final reward uses them.
	TurnRewards []float64
	// Tools is the rollout's ToolContext (Hermes' ctx in compute_reward):
	// the same sandbox, shell session (cwd, exported variables), todo
	// store and tool set the agent used, with the agent's background
	// processes already stopped. Nil when the task has no sandbox. The
	// runner tears the sandbox down after Reward returns.
	Tools *toolcontext.ToolContext
	// Session is the rollout's env-server session when the env is
	// Sessioned (nil otherwise); the runner closes it after Reward.
	Session Session
}

// EvalMetricser is implemented by envs with evaluation metrics of their
// own beyond pass@k and mean reward (e.g. a per-component success rate);
// they join the env's block of the eval report's metrics.json. Rollouts
// that failed for infrastructure reasons are not passed.
type EvalMetricser interface {
	EvalMetrics(rollouts []ScoredRollout) map[string]float64
}

// ScoredRollout is what EvalMetrics sees of one finished rollout.
type ScoredRollout struct {
	ItemID     string
	Category   string
	Reward     float64
	Components map[string]float64
	Turns      int
}

// Solver is implemented by envs whose items carry reference solutions the
// simulator can follow (the demo and the tests). The JSON object has the
// shape of the simulator's script: {"steps": [...], "wrong": [...]}.
type Solver interface {
	Solution(item datasets.Item) (json.RawMessage, bool)
}
