package runner

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
	"github.com/rollout-rl/rollout/tools/mcp"
)

// ErrConfig is wrapped by every invalid run configuration.
var ErrConfig = errors.New("invalid run config")

// Config is one run: the YAML file of `rollout run -c` / `rollout eval -c`,
// and the job config of the gRPC service. Every knob is documented in
// docs/config.md.
type Config struct {
	// Env is a registered env name or the path of a YAML env file.
	Env string `yaml:"env" json:"env"`
	// EnvConfig is the env's own configuration (strictly decoded by it).
	EnvConfig yaml.Node `yaml:"env_config,omitempty" json:"-"`
	// Split of the env's dataset ("train" for run, "eval" for eval).
	Split string `yaml:"split,omitempty" json:"split,omitempty"`
	// Dataset replaces the env's built-in dataset when its path is set.
	Dataset datasets.Config `yaml:"dataset,omitempty" json:"dataset,omitempty"`
	// Groups is the number of items (groups) to run; 0 = every item.
	Groups int `yaml:"groups,omitempty" json:"groups,omitempty"`
	// GroupSize is G, the rollouts per item; 0 = the env's default.
	GroupSize int `yaml:"group_size,omitempty" json:"group_size,omitempty"`
	// Seed drives item order, toolset sampling and simulator-visible seeds.
	Seed uint64 `yaml:"seed,omitempty" json:"seed,omitempty"`
	// Shuffle the items (with Seed).
	Shuffle bool `yaml:"shuffle,omitempty" json:"shuffle,omitempty"`

	Inference       inference.Config   `yaml:"inference" json:"inference"`
	Sampling        inference.Sampling `yaml:"sampling,omitempty" json:"sampling,omitempty"`
	Parser          string             `yaml:"parser,omitempty" json:"parser,omitempty"`
	ReasoningParser string             `yaml:"reasoning_parser,omitempty" json:"reasoning_parser,omitempty"`

	MaxTurns int `yaml:"max_turns,omitempty" json:"max_turns,omitempty"`
	// RolloutTimeout bounds one rollout's agent loop (default 20m).
	RolloutTimeout Duration `yaml:"rollout_timeout,omitempty" json:"rollout_timeout,omitempty"`
	// RewardTimeout bounds the reward (default 10m).
	RewardTimeout Duration `yaml:"reward_timeout,omitempty" json:"reward_timeout,omitempty"`
	// MaxConsecutiveInvalid ends an episode after that many invalid calls
	// in a row (default 5).
	MaxConsecutiveInvalid int `yaml:"max_consecutive_invalid,omitempty" json:"max_consecutive_invalid,omitempty"`
	// Loop holds the agent loop's knobs for model misbehaviour and the
	// text it may insert (docs/config.md, "The agent loop's knobs").
	Loop LoopConfig `yaml:"loop,omitempty" json:"loop,omitzero"`

	Toolsets Toolsets `yaml:"toolsets,omitempty" json:"toolsets,omitempty"`
	// MCPServers add the tools of MCP servers to every task
	// (docs/mcp.md): a command runs in the rollout's sandbox over stdio,
	// a url is a streamable-HTTP endpoint reached from the host.
	MCPServers []mcp.Server  `yaml:"mcp_servers,omitempty" json:"mcp_servers,omitempty"`
	Sandbox    SandboxConfig `yaml:"sandbox,omitempty" json:"sandbox,omitempty"`
	Limits     Limits        `yaml:"limits,omitempty" json:"limits,omitempty"`
	// Retries of an infra-failed rollout (0 = the default 2; -1 = none).
	Retries   int       `yaml:"retries,omitempty" json:"retries,omitempty"`
	Advantage Advantage `yaml:"advantage,omitempty" json:"advantage,omitempty"`
	Output    Output    `yaml:"output,omitempty" json:"output,omitempty"`
	Eval      EvalSpec  `yaml:"eval,omitempty" json:"eval,omitempty"`
	// PolicyVersion is stamped on records when a trainer supplies one.
	PolicyVersion *int64 `yaml:"policy_version,omitempty" json:"policy_version,omitempty"`
	// Async bounds the policy lag of collected groups (asynchronous RL;
	// docs/async-rl.md).
	Async AsyncConfig `yaml:"async,omitempty" json:"async,omitzero"`
	// AllowEvalOnly runs an eval-only env with `rollout run`.
	AllowEvalOnly bool `yaml:"allow_eval_only,omitempty" json:"allow_eval_only,omitempty"`
	// Atropos also sends the run's groups to an Atropos trainer (package
	// atropos; docs/atropos.md). The runner does not read it.
	Atropos Atropos `yaml:"atropos,omitempty" json:"atropos,omitempty"`
	// Distill is on-policy distillation (docs/distillation.md): a teacher
	// endpoint scores every trained token of each ok rollout with its
	// top-K logprobs (vLLM prompt_logprobs). Needs token ids.
	Distill *inference.TeacherConfig `yaml:"distill,omitempty" json:"distill,omitempty"`
	// MaxInfraFailedFraction is the exit policy of `rollout run`/`eval`
	// and of jobs: a run whose infra_failed rollouts exceed this fraction
	// of its rollouts fails after writing them (default 0.5; 1 fails only
	// a run without any ok rollout). The runner does not read it.
	MaxInfraFailedFraction *float64 `yaml:"max_infra_failed_fraction,omitempty" json:"max_infra_failed_fraction,omitempty"`
}

// LoopConfig configures what the agent loop does when the model misbehaves,
// and the Hermes loop behaviours that insert or repair text. The defaults
// are RL-safe: nothing is inserted into or rewritten in the conversation the
// policy sees (inserted text is context the policy did not produce, so it
// shifts the on-policy distribution), and a generation cut at max_tokens
// ends the episode with stop reason "length". Whatever is inserted or
// repaired is recorded in the record's loop_events.
type LoopConfig struct {
	// OnTruncation: "stop" (default) ends the episode with stop reason
	// "length" when a generation hits max_tokens, executing none of its
	// calls; "tool_error" answers a cut call with a tool error and goes on.
	OnTruncation string `yaml:"on_truncation,omitempty" json:"on_truncation,omitempty"`
	// BudgetWarnings adds a warning to the last tool result at 70 % and
	// 90 % of max_turns.
	BudgetWarnings bool `yaml:"budget_warnings,omitempty" json:"budget_warnings,omitempty"`
	// GraceTurn allows one more generation after max_turns, after a user
	// message asking for the final answer; its calls are not executed.
	GraceTurn bool `yaml:"grace_turn,omitempty" json:"grace_turn,omitempty"`
	// EmptyReplyNudges answers up to that many empty replies with a user
	// message asking the model to go on (0 = off: an empty reply finishes).
	EmptyReplyNudges int `yaml:"empty_reply_nudges,omitempty" json:"empty_reply_nudges,omitempty"`
	// RepairToolNames executes a call to a near-miss tool name (case,
	// '-'/'_'/' ', a unique prefix) as the tool it means.
	RepairToolNames bool `yaml:"repair_tool_names,omitempty" json:"repair_tool_names,omitempty"`
	// MaxCallsPerTurn answers calls past the first N of a turn with a tool
	// error (0 = no limit).
	MaxCallsPerTurn int `yaml:"max_calls_per_turn,omitempty" json:"max_calls_per_turn,omitempty"`
}

// Toolsets selects the tools of a run. Enabled empty = the env's toolsets.
// Distribution names a Hermes toolset distribution sampled once per group.
type Toolsets struct {
	Enabled      []string `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	Disabled     []string `yaml:"disabled,omitempty" json:"disabled,omitempty"`
	Distribution string   `yaml:"distribution,omitempty" json:"distribution,omitempty"`
}

// SandboxConfig overrides the env's sandbox settings for every rollout.
type SandboxConfig struct {
	Image    string  `yaml:"image,omitempty" json:"image,omitempty"`
	Network  string  `yaml:"network,omitempty" json:"network,omitempty"`
	MemoryMB int64   `yaml:"memory_mb,omitempty" json:"memory_mb,omitempty"`
	CPUs     float64 `yaml:"cpus,omitempty" json:"cpus,omitempty"`
	PIDs     int64   `yaml:"pids,omitempty" json:"pids,omitempty"`
	// DiskMB bounds what a sandbox may write (default 1024; see
	// sandbox.Limits.DiskBytes).
	DiskMB int64 `yaml:"disk_mb,omitempty" json:"disk_mb,omitempty"`
	// ReadOnlyRoot gives every sandbox a read-only root with tmpfs /tmp
	// and workdir of disk_mb each.
	ReadOnlyRoot bool `yaml:"read_only_root,omitempty" json:"read_only_root,omitempty"`
	// Runtime is the engine's OCI runtime: runc (default) or runsc
	// (gVisor; scripts/ensure-runsc.sh registers it).
	Runtime string `yaml:"runtime,omitempty" json:"runtime,omitempty"`
	// WarmPool caps the sandboxes started ahead of use: when a group
	// starts, its G sandboxes are all started at once through a warm pool
	// (0 = 4×G; negative = no pool, each rollout creates its own).
	WarmPool int `yaml:"warm_pool,omitempty" json:"warm_pool,omitempty"`
	// Reuse resets a finished rollout's sandbox in place and hands the same
	// container to the next rollout of the same spec, instead of removing
	// it and creating another: every process killed, the tmpfs mounts,
	// /dev/shm, /dev/mqueue and SysV IPC emptied, the spec's files placed
	// again. Needs read_only_root (nothing else is writable) and the
	// Docker backend with runc, or the runc backend (docs/security.md,
	// "Reuse").
	Reuse bool `yaml:"reuse,omitempty" json:"reuse,omitempty"`
	// Backend is "docker" (default: the local engine), "kubernetes" (pods
	// on a cluster, configured by Kubernetes; docs/kubernetes.md) or "runc"
	// (containers started by runc directly, no engine daemon in the path:
	// ~4x faster starts; one host, as root, network none; sandbox/README.md).
	Backend    string            `yaml:"backend,omitempty" json:"backend,omitempty"`
	Kubernetes *k8sconfig.Config `yaml:"kubernetes,omitempty" json:"kubernetes,omitempty"`
}

// Limits bound the run's concurrency. Zero values take defaults sized for
// one machine.
type Limits struct {
	RolloutsInFlight int `yaml:"rollouts_in_flight,omitempty" json:"rollouts_in_flight,omitempty"` // default 32
	GroupsInFlight   int `yaml:"groups_in_flight,omitempty" json:"groups_in_flight,omitempty"`     // default 8
	Sandboxes        int `yaml:"sandboxes,omitempty" json:"sandboxes,omitempty"`                   // default 32
}

// Advantage modes.
const (
	AdvantageGRPO = "grpo" // (r - mean) / (std + eps)
	AdvantageMean = "mean" // r - mean
	AdvantageNone = "none" // no advantages
)

// Advantage configures group assembly.
type Advantage struct {
	Mode string `yaml:"mode,omitempty" json:"mode,omitempty"`
	// DropEqual marks groups whose scores are all equal as dropped: they
	// are recorded (with advantage 0) and counted, but trainer-facing
	// streams skip them. Off by default (binary rewards need equal groups).
	DropEqual bool `yaml:"drop_equal,omitempty" json:"drop_equal,omitempty"`
}

// Output configures where trajectories go.
type Output struct {
	// Dir is the run directory; re-running with the same Dir resumes.
	Dir string `yaml:"dir,omitempty" json:"dir,omitempty"`
	// MaxRowsPerFile rotates Parquet part files (default 10,000).
	MaxRowsPerFile int64 `yaml:"max_rows_per_file,omitempty" json:"max_rows_per_file,omitempty"`
}

// EvalSpec configures `rollout eval`.
type EvalSpec struct {
	// K is the k of pass@k (default: group size).
	K int `yaml:"k,omitempty" json:"k,omitempty"`
	// PassThreshold is the reward at or above which a rollout passes
	// (default 1.0).
	PassThreshold float64 `yaml:"pass_threshold,omitempty" json:"pass_threshold,omitempty"`
}

// Duration is a time.Duration written as "90s" in YAML and JSON.
type Duration time.Duration

// UnmarshalYAML accepts Go duration strings.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (e.g. 90s, 10m)", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as text.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// MarshalJSON writes the duration as text.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads duration text.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// LoadConfig reads a run config strictly: unknown keys are errors with
// their line numbers.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("run config: %w", err)
	}
	cfg, err := ParseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes YAML run config text strictly.
func ParseConfig(text []byte) (Config, error) {
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(text))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	return cfg, nil
}

// withDefaults fills unset knobs.
func (c Config) withDefaults() Config {
	if c.RolloutTimeout == 0 {
		c.RolloutTimeout = Duration(20 * time.Minute)
	}
	if c.RewardTimeout == 0 {
		c.RewardTimeout = Duration(10 * time.Minute)
	}
	if c.Limits.RolloutsInFlight == 0 {
		c.Limits.RolloutsInFlight = 32
	}
	if c.Limits.GroupsInFlight == 0 {
		c.Limits.GroupsInFlight = 8
	}
	if c.Limits.Sandboxes == 0 {
		c.Limits.Sandboxes = 32
	}
	if c.Retries == 0 {
		c.Retries = 2
	}
	if c.Advantage.Mode == "" {
		c.Advantage.Mode = AdvantageGRPO
	}
	if c.Eval.PassThreshold == 0 {
		c.Eval.PassThreshold = 1
	}
	return c
}

// Validate reports the first invalid field by its YAML path.
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Env == "":
		return bad("env", "required (a registered env name or a YAML env file)")
	case len(c.Inference.Endpoints) == 0:
		return bad("inference.endpoints", "at least one endpoint URL is required")
	case c.Distill != nil && (c.Distill.Endpoint == "" || c.Distill.Model == ""):
		return bad("distill", "endpoint and model are required")
	case c.Distill != nil && c.Distill.TopK < 0:
		return bad("distill.top_k", "must not be negative (0 = 20)")
	case c.Distill != nil && (c.Inference.Backend == "" || c.Inference.Backend == inference.BackendChat && !c.Inference.ChatTokenIDs):
		return bad("distill", "the teacher scores the student's token ids: use a tokens-mode backend, or chat with inference.chat_token_ids")
	case c.Groups < 0:
		return bad("groups", "must not be negative")
	case c.GroupSize < 0:
		return bad("group_size", "must not be negative")
	case c.MaxTurns < 0:
		return bad("max_turns", "must not be negative")
	case mcp.Validate(c.MCPServers) != nil:
		return fmt.Errorf("%w: %w", ErrConfig, mcp.Validate(c.MCPServers))
	case c.Retries < -1:
		return bad("retries", "must be -1 (no retries), 0 (the default, 2) or positive")
	case c.Loop.OnTruncation != "" && c.Loop.OnTruncation != agentloop.TruncationStop && c.Loop.OnTruncation != agentloop.TruncationToolError:
		return bad("loop.on_truncation", "%q, want %s or %s", c.Loop.OnTruncation, agentloop.TruncationStop, agentloop.TruncationToolError)
	case c.Loop.EmptyReplyNudges < 0:
		return bad("loop.empty_reply_nudges", "must not be negative")
	case c.Loop.MaxCallsPerTurn < 0:
		return bad("loop.max_calls_per_turn", "must not be negative (0 = no limit)")
	case c.GroupSize > MaxGroupSize:
		return bad("group_size", "%d exceeds the maximum %d (a group's rollouts are held in memory together)", c.GroupSize, MaxGroupSize)
	case c.Groups > MaxGroups:
		return bad("groups", "%d exceeds the maximum %d (split the run)", c.Groups, MaxGroups)
	}
	for _, l := range []struct {
		field string
		v     int
	}{
		{"limits.rollouts_in_flight", c.Limits.RolloutsInFlight},
		{"limits.groups_in_flight", c.Limits.GroupsInFlight},
		{"limits.sandboxes", c.Limits.Sandboxes},
	} {
		if l.v < 0 {
			return bad(l.field, "must not be negative")
		}
		if l.v > MaxConcurrency {
			return bad(l.field, "%d exceeds the maximum %d", l.v, MaxConcurrency)
		}
	}
	if err := c.Sandbox.validate(bad); err != nil {
		return err
	}
	switch c.Sandbox.Backend {
	case "", sandbox.BackendDocker:
		if c.Sandbox.Kubernetes != nil {
			return bad("sandbox.kubernetes", "set, but sandbox.backend is not %q", sandbox.BackendKubernetes)
		}
	case sandbox.BackendRunc:
		if c.Sandbox.Kubernetes != nil {
			return bad("sandbox.kubernetes", "set, but sandbox.backend is not %q", sandbox.BackendKubernetes)
		}
	case sandbox.BackendKubernetes:
		k := k8sconfig.Config{}
		if c.Sandbox.Kubernetes != nil {
			k = *c.Sandbox.Kubernetes
		}
		if err := k.Validate(); err != nil {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
	default:
		return bad("sandbox.backend", "%q, want %s, %s or %s", c.Sandbox.Backend, sandbox.BackendDocker, sandbox.BackendKubernetes, sandbox.BackendRunc)
	}
	switch c.Advantage.Mode {
	case "", AdvantageGRPO, AdvantageMean, AdvantageNone:
	default:
		return bad("advantage.mode", "%q, want grpo, mean or none", c.Advantage.Mode)
	}
	for _, u := range c.Inference.Endpoints {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return bad("inference.endpoints", "%q is not an http(s) URL", u)
		}
	}
	if err := c.validateRanges(bad); err != nil {
		return err
	}
	return nil
}

// Maxima of the run config: values past them are config errors, not a
// way to exhaust the host.
const (
	MaxGroupSize   = 4096
	MaxGroups      = 10_000_000
	MaxConcurrency = 4096 // limits.rollouts_in_flight, groups_in_flight, sandboxes
)

// kubernetesPIDsUnenforced says why a pids limit is refused on the
// kubernetes backend, both the run config's (validate) and an env's own
// (Runner.sandboxSpec).
const kubernetesPIDsUnenforced = "not enforced by the kubernetes backend (a pod spec has no pids limit; the kubelet's podPidsLimit bounds every pod of a node)"

func (s SandboxConfig) validate(bad func(field, format string, args ...any) error) error {
	switch {
	case s.MemoryMB < 0:
		return bad("sandbox.memory_mb", "must not be negative (0 = the env's or the default 2048)")
	case s.MemoryMB > 0 && s.MemoryMB < 8:
		return bad("sandbox.memory_mb", "%d is below the minimum 8", s.MemoryMB)
	case s.MemoryMB > 1<<30:
		return bad("sandbox.memory_mb", "%d is not a plausible memory size", s.MemoryMB)
	case s.CPUs < 0 || s.CPUs != s.CPUs:
		return bad("sandbox.cpus", "must not be negative (0 = the env's or the default 1)")
	case s.CPUs > 1024:
		return bad("sandbox.cpus", "%v exceeds the maximum 1024", s.CPUs)
	case s.PIDs < 0:
		return bad("sandbox.pids", "must not be negative (0 = the env's or the default 512)")
	case s.PIDs > 0 && s.PIDs < 16:
		return bad("sandbox.pids", "%d is below the minimum 16 (the agent and a shell need a few)", s.PIDs)
	case s.DiskMB < 0:
		return bad("sandbox.disk_mb", "must not be negative (0 = the env's or the default 1024)")
	case s.DiskMB > 1<<30:
		return bad("sandbox.disk_mb", "%d is not a plausible disk size", s.DiskMB)
	}
	switch s.Network {
	case "", sandbox.NetworkNone, sandbox.NetworkBridge, sandbox.NetworkOpen:
	default:
		return bad("sandbox.network", "%q, want none, bridge (egress only) or open (unrestricted: reaches the host and other containers)", s.Network)
	}
	switch s.Runtime {
	case "", sandbox.RuntimeRunc, sandbox.RuntimeRunsc:
	default:
		return bad("sandbox.runtime", "%q, want runc or runsc (gVisor)", s.Runtime)
	}
	if s.Backend == sandbox.BackendRunc {
		switch {
		case s.Network != "" && s.Network != sandbox.NetworkNone:
			return bad("sandbox.network", "%q: not implemented for the runc backend (its sandboxes have no network; use the docker backend)", s.Network)
		case s.Runtime == sandbox.RuntimeRunsc:
			return bad("sandbox.runtime", "runsc: not implemented for the runc backend (use the docker backend with runsc registered)")
		}
	}
	if s.Backend == sandbox.BackendKubernetes {
		// What a pod cannot be held to is refused, never dropped
		// (docs/security.md, "Limits on every backend").
		switch {
		case s.PIDs > 0:
			return bad("sandbox.pids", "%d: %s: set podPidsLimit on the sandbox nodes and remove sandbox.pids", s.PIDs, kubernetesPIDsUnenforced)
		case s.Runtime == sandbox.RuntimeRunsc:
			return bad("sandbox.runtime", "runsc: not implemented for the kubernetes backend (choose the pods' runtime with sandbox.kubernetes.runtime_class_name, e.g. a RuntimeClass whose handler is runsc)")
		case s.Network == sandbox.NetworkBridge:
			return bad("sandbox.network", "bridge (egress only): not implemented for the kubernetes backend (its pods are either denied all traffic by a NetworkPolicy, network none, or unrestricted, network open)")
		}
	}
	if s.Reuse {
		switch {
		case !s.ReadOnlyRoot:
			return bad("sandbox.reuse", "needs sandbox.read_only_root: true (only a read-only root can be reset in place)")
		case s.Runtime == sandbox.RuntimeRunsc:
			return bad("sandbox.reuse", "not implemented for runtime runsc")
		case s.Backend == sandbox.BackendKubernetes:
			return bad("sandbox.reuse", "not implemented for the kubernetes backend")
		case s.WarmPool < 0:
			return bad("sandbox.reuse", "needs the warm pool (sandbox.warm_pool >= 0): reused sandboxes wait there")
		}
	}
	return nil
}

// Hash is a stable digest of the effective config, for the reproducibility
// manifest.
func (c Config) Hash() string {
	b, _ := json.Marshal(c)
	var env []byte
	if c.EnvConfig.Kind != 0 {
		env, _ = yaml.Marshal(&c.EnvConfig)
	}
	h := sha256.New()
	h.Write(b)
	h.Write(env)
	return hex.EncodeToString(h.Sum(nil))[:16]
}
