// Package runner schedules GRPO groups of rollouts: for each dataset item,
// G rollouts run concurrently, each in its own sandbox with a fresh rollout
// id. It owns global limits and back-pressure (intake pauses; in-flight
// rollouts are never cancelled), retries, the failure taxonomy, group
// assembly (scores, advantages, equal-score flags) and resume. It formats
// no output: finished groups go to Sinks.
package runner

import (
	"context"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
)

// Rollout statuses.
const (
	StatusOK          = "ok"
	StatusInfraFailed = "infra_failed"
)

// Failure kinds: the taxonomy of infrastructure failures. A rollout with
// one of these is never scored as a model outcome.
const (
	FailImageBuild   = "image_build"        // the task image could not be built
	FailSandbox      = "sandbox"            // create, start or the sandbox died
	FailInference    = "inference"          // endpoint unreachable, 5xx, malformed response
	FailRejected     = "inference_rejected" // the endpoint refused the request (4xx)
	FailReward       = "reward"             // the reward could not be computed
	FailRewardTimout = "reward_timeout"     // the reward exceeded reward_timeout
	FailPanic        = "panic"              // a bug: a panic was recovered
	FailCancelled    = "cancelled"          // the run was cancelled mid-rollout
	FailTask         = "task"               // the env could not build the task (bad item)
	FailDistill      = "distill"            // the distillation teacher could not score the rollout
	FailEnvFeedback  = "env_feedback"       // the env's responder could not answer a turn (e.g. its user simulator's endpoint)
	// FailExpired: a standalone gateway session that got no reward: it
	// went idle past its expiry, or was open or unscored when the gateway
	// stopped (the message says which).
	FailExpired = "session_expired"
)

// Failure describes why a rollout is infra_failed.
type Failure struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// Timings of one rollout.
type Timings struct {
	SandboxStart time.Duration
	Generation   time.Duration
	Tools        time.Duration
	Reward       time.Duration
	Distill      time.Duration // the teacher's scoring (distillation)
	Total        time.Duration
}

// Rollout is one finished rollout (the last attempt).
type Rollout struct {
	ID       string // unique per attempt
	Index    int    // 0..G-1 within the group
	Attempts int
	Status   string
	Failure  *Failure
	Result   agentloop.Result
	Score    rewards.Score
	// Advantage is nil for failed rollouts and with advantage mode none.
	Advantage *float64
	Tools     []openai.Tool
	Timings   Timings
	Image     string
	ImageID   string // content-addressed id of Image, when the backend knows it
	// Limits, Network and Runtime are those the sandbox's container was
	// created with (read back from the engine), else those asked for.
	Limits  sandbox.Limits
	Network string
	Runtime string
	Backend string // the sandbox backend that made the sandbox (docker, runc, kubernetes)
	Created time.Time
	// DistillTokenIDs and DistillLogprobs are the teacher's top-K per
	// token of Result.Sequence (nil on untrained positions); nil without
	// distillation.
	DistillTokenIDs [][]int32
	DistillLogprobs [][]float32
	// BranchDistill is the teacher's top-K for each branch of Session, by
	// branch index, as DistillTokenIDs/DistillLogprobs are for
	// Result.Sequence; nil without distillation.
	BranchDistill []Distilled
	// Session is what a gateway session left (harness envs): its calls and
	// its branches, each a trainable token sequence; nil for the own agent
	// loop, whose record is Result. With a session, the records are its
	// branches (branch 0 the main row, which also carries Result's stop
	// reason, turns, tool errors and loop events); Result.Sequence and
	// Result.Messages are not used.
	Session *gateway.SessionRecord
	// BranchRewards override Score.Value for single branches of Session
	// (by index; a standalone gateway's caller posts them); the group's
	// statistics use Score.Value only. BranchAdvantages are their
	// advantages under the group's mean and std (AssembleGroup).
	BranchRewards    map[int]float64
	BranchAdvantages map[int]float64
	// deterministic: the failure would repeat on a retry (a bad spec).
	deterministic bool
}

// Sequences are the rollout's trainable token sequences: its session's
// branches (harness envs), else its one Result.Sequence. Counters and the
// staleness bound read them all: a branch other than 0 holds sampled
// tokens too.
func (ro *Rollout) Sequences() []*inference.Sequence {
	if ro.Session == nil {
		return []*inference.Sequence{&ro.Result.Sequence}
	}
	out := make([]*inference.Sequence, len(ro.Session.Branches))
	for i := range ro.Session.Branches {
		out[i] = &ro.Session.Branches[i].Sequence
	}
	return out
}

// Group is one item's G rollouts, assembled.
type Group struct {
	ID       string // the item's key: unique within the run, stable across resumes
	Item     datasets.Item
	Task     envs.Task
	Rollouts []Rollout
	// Dropped: every ok rollout scored the same and advantage.drop_equal
	// is on. Recorded, counted, skipped by trainer-facing streams.
	Dropped bool
	// OK counts rollouts with status ok.
	OK int
	// Mean and Std of the ok rollouts' scores.
	Mean, Std float64
	// PolicyVersion the group was generated with, when a trainer set one.
	PolicyVersion *int64
	// RequestID echoes the trainer request that asked for the item.
	RequestID string
	// Sequence is the group's position in the run directory, set by the
	// durable sink before any other sink sees the group (-1: no run
	// directory, or the journal is off). WatchJob and CollectGroups clients
	// resume from it.
	Sequence int64
	// Versions is the group's policy-version summary over its ok
	// rollouts' sampled tokens (nil when the backend reports none).
	Versions *GroupVersions
	// Stale: the group is outside async.max_staleness and on_stale is
	// "mark" (it is delivered, flagged).
	Stale bool
	// StaleDropped: the group is outside the bound and was not handed to
	// any sink (on_stale "drop", or "regenerate" out of attempts).
	StaleDropped bool
	// Regenerated counts the times the group was generated again because
	// it was stale.
	Regenerated int
}

// Sink receives finished groups. WriteGroup may block (back-pressure); an
// error stops intake and fails the run.
type Sink interface {
	WriteGroup(ctx context.Context, run *RunInfo, g *Group) error
}

// Durable is implemented by a sink that stores groups durably (the run
// directory) and whose WriteGroup is safe for concurrent use. Run hands each
// finished group to the durable sinks first — for several groups at once,
// so that they can share an fsync — and only after they returned to the
// other sinks (watchers, trainers), the counters, the log and the progress
// callback: nothing announces a group that a crash could still lose.
type Durable interface {
	Sink
	DurableWrites() bool
}

// Admitter is implemented by sinks that gate intake, e.g. a trainer whose
// queue is full. Run calls Admit before starting each group (after a group
// slot is free) and waits while it blocks: intake pauses, rollouts already
// running are never cancelled. Every admitted group is then handed to
// WriteGroup unless the run stops first. An error wrapping
// ErrIntakeStopped stops intake like StopIntake; any other error stops
// intake and fails the run, like a WriteGroup error.
type Admitter interface {
	Admit(ctx context.Context) error
}

// Resumer is implemented by sinks that know which groups a previous run in
// the same output already completed.
type Resumer interface {
	CompletedGroups(ctx context.Context) (map[string]bool, error)
}

// RunInfo is the run-level context sinks need.
type RunInfo struct {
	RunID          string
	Env            string
	Model          string
	Parser         string
	ServiceVersion string
	ConfigHash     string
	SamplingJSON   string
	PolicyVersion  *int64
	RolloutTimeout time.Duration
	ToolTimeout    time.Duration
	PassThreshold  float64
}

// Summary counts a run's outcome.
type Summary struct {
	Groups        int
	GroupsSkipped int // completed by an earlier run (resume)
	GroupsDropped int
	// GroupsInterrupted were cut short by cancellation: they are not
	// handed to the sinks, so a resumed run collects them again whole.
	GroupsInterrupted int
	// GroupsStale counts groups outside async.max_staleness by what was
	// done: dropped, regenerated (each regeneration), marked.
	GroupsStaleDropped     int
	GroupsStaleRegenerated int
	GroupsStaleMarked      int
	Rollouts               int
	RolloutsOK             int
	InfraFailed            int
	Retries                int
	FailuresByKind         map[string]int
	// StopReasons counts the ok rollouts by the agent loop's stop reason
	// (finished, length, max_turns, …).
	StopReasons map[string]int
	// SampledTokens counts the ids the ok rollouts sampled (trained and
	// unscored); UnscoredTokens those of them without a logprob
	// (inference.Sequence.Unscored), which inference.max_unscored_share
	// bounds.
	SampledTokens  int
	UnscoredTokens int
	MeanReward     float64
	Elapsed        time.Duration
}

// Distilled is the teacher's top-K ids and logprobs per token of one
// sequence (nil on untrained positions).
type Distilled struct {
	TokenIDs [][]int32
	Logprobs [][]float32
}
