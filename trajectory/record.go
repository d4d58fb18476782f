package trajectory

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// SchemaVersion is the record schema this build writes and the newest it
// reads. It is stored in every file's key/value metadata under
// MetadataSchemaVersionKey and in run.json. Adding a nullable column keeps the
// version; renaming, removing or changing the meaning of a column bumps it.
const SchemaVersion = 1

// MetadataSchemaVersionKey is the Parquet key/value metadata key that marks a
// file as a rollout trajectory file and carries its schema version.
const MetadataSchemaVersionKey = "rollout.schema_version"

// Status values of a record.
const (
	StatusOK          = "ok"
	StatusInfraFailed = "infra_failed"
)

// Atropos conventions for untrained positions.
const (
	// MaskIgnore is the label value Atropos trainers ignore (masks column).
	MaskIgnore int32 = -100
	// LogprobPlaceholder is the inference logprob Atropos expects on
	// untrained positions.
	LogprobPlaceholder float32 = 1.0
)

// Record is one rollout: one row of a trajectory Parquet file. The runner fills
// it; the field tags define the on-disk schema documented in
// docs/trajectory-schema.md. Slices are written as standard 3-level LISTs and
// RewardComponents as a MAP so that pyarrow, DuckDB and Polars read them as
// native list/map columns.
type Record struct {
	SchemaVersion int32  `parquet:"schema_version"`
	RunID         string `parquet:"run_id,dict"`
	Env           string `parquet:"env,dict"`
	Category      string `parquet:"category,dict"`
	ItemID        string `parquet:"item_id"`
	GroupID       string `parquet:"group_id"`
	RolloutIndex  int32  `parquet:"rollout_index"`

	Model         string `parquet:"model,dict"`
	PolicyVersion *int64 `parquet:"policy_version,optional"`
	// SamplingParams, Messages and Tools are JSON text (OpenAI chat format for
	// Messages, including tool_calls and reasoning_content; OpenAI function
	// tool definitions for Tools).
	SamplingParams string `parquet:"sampling_params"`
	Messages       string `parquet:"messages"`
	Tools          string `parquet:"tools"`

	Tokens           []int32   `parquet:"tokens,list"`
	LossMask         []int8    `parquet:"loss_mask,list"`
	Masks            []int32   `parquet:"masks,list"`
	Logprobs         []float32 `parquet:"logprobs,list" parquet-element:",split"`
	PromptTokens     int32     `parquet:"prompt_tokens"`
	CompletionTokens int32     `parquet:"completion_tokens"`

	Reward           float64            `parquet:"reward"`
	RewardComponents map[string]float64 `parquet:"reward_components"`
	Advantage        *float64           `parquet:"advantage,optional"`

	Turns             int32  `parquet:"turns"`
	FinishedNaturally bool   `parquet:"finished_naturally"`
	StopReason        string `parquet:"stop_reason,dict"`

	Status     string      `parquet:"status,dict"`
	Failure    *Failure    `parquet:"failure,optional"`
	ToolErrors []ToolError `parquet:"tool_errors,list"`
	// LoopEvents are the agent loop's interventions in the conversation
	// (arguments replaced, tool names repaired, messages inserted, …), so a
	// trainer can tell the policy's own text from the loop's. Files written
	// before the column existed read as empty.
	LoopEvents []LoopEvent `parquet:"loop_events,list"`
	// CallStatuses are every tool call's parse outcome, turn by turn
	// (agentloop.CallStatus): ok, repaired (Reason: what the parser
	// fixed) or malformed (Reason: the parser's). Files written before the
	// column existed read as empty.
	CallStatuses []CallStatus `parquet:"call_statuses,list"`
	// TurnRewards are the env responder's intermediate rewards, one per
	// turn (0 where it gave none), beside the final Reward; empty for envs
	// without turn feedback and in files written before the column existed.
	TurnRewards []float64 `parquet:"turn_rewards,list"`
	// DistillTokenIDs and DistillLogprobs are on-policy distillation's
	// teacher top-K per token, aligned to Tokens: the K most likely ids
	// (by the teacher's rank) and their logprobs at each trained position,
	// an empty list elsewhere. Empty without distillation and in files
	// written before the columns existed.
	DistillTokenIDs [][]int32   `parquet:"distill_token_ids,list"`
	DistillLogprobs [][]float32 `parquet:"distill_logprobs,list"`

	Timings     Timings `parquet:"timings"`
	DriftTokens int32   `parquet:"drift_tokens"`
	// UnscoredTokens counts sampled tokens the engine returned no logprob
	// for (llama.cpp withholds it for a token that ends inside a UTF-8
	// character): they are in Tokens, in context, with LossMask 0 and the
	// 1.0 placeholder, so not trained. 0 in files written before the
	// column existed.
	UnscoredTokens int32     `parquet:"unscored_tokens"`
	Manifest       Manifest  `parquet:"manifest"`
	CreatedAt      time.Time `parquet:"created_at,timestamp(microsecond)"`

	// Asynchronous RL (docs/async-rl.md). Files written before these
	// columns existed read as empty/null.
	//
	// TokenVersions is aligned with Tokens: the policy version each sampled
	// token was generated under (untrained positions: the version in force
	// when they were appended). Empty when the backend reports no ids.
	TokenVersions []int64 `parquet:"token_versions,list"`
	// MinPolicyVersion and MaxPolicyVersion span the sampled tokens;
	// PolicyLag is the current version when the group completed minus
	// MinPolicyVersion.
	MinPolicyVersion *int64 `parquet:"min_policy_version,optional"`
	MaxPolicyVersion *int64 `parquet:"max_policy_version,optional"`
	PolicyLag        *int64 `parquet:"policy_lag,optional"`
	// VersionCuts are the points where a generation's version changed.
	VersionCuts []VersionCut `parquet:"version_cuts,list"`
	// Stale marks a group outside async.max_staleness delivered with
	// on_stale "mark".
	Stale bool `parquet:"stale"`

	// RoutedExperts is the mixture-of-experts routing the engine reported
	// (inference.routed_experts; routing replay), flat in C order over
	// RoutedExpertsShape = [positions, layers, topk]:
	// RoutedExperts[(p*layers+l)*topk+k] is the k-th expert token p was
	// routed to at layer l. Positions are Tokens[0:positions] — every token
	// the engine ran a forward pass on in the last turn's request, prompt
	// and template tokens included; the last sampled token and the
	// template's closing after it have none (trainers pad them). Empty
	// without routing and in files written before the columns existed.
	RoutedExperts      []uint16 `parquet:"routed_experts,list"`
	RoutedExpertsShape []int32  `parquet:"routed_experts_shape,list"`
	// Sessions and branches (docs/trajectory-schema.md, "Branches"). A
	// rollout of a gateway session with N branches is N rows sharing
	// group_id, rollout_index, reward, advantage and status; every other
	// rollout is one row, branch 0. Files written before these columns
	// existed read as branch 0 with parent_branch and split_call -1
	// (Normalize).
	//
	// SessionID is the gateway session's id, else the rollout id ("" in
	// older files).
	SessionID string `parquet:"session_id"`
	// Branch is the row's branch in its session: 0 the first (main) one.
	Branch int32 `parquet:"branch"`
	// ParentBranch is the branch this one shares the longest token prefix
	// with, -1 for branch 0; SplitCall the session call that started it
	// (-1 for branch 0); SharedTokens the leading tokens it has in common
	// with its parent.
	ParentBranch int32 `parquet:"parent_branch"`
	SplitCall    int32 `parquet:"split_call"`
	SharedTokens int32 `parquet:"shared_tokens"`
	// Calls is the session's call records as JSON (an array of
	// SessionCall), on branch 0 only; "" without a gateway session.
	Calls string `parquet:"calls"`
	// EchoRewritten and EchoUnanchored count the session's echoed
	// assistant turns the harness had rewritten (anchored back to the
	// sampled ids) and could not be matched to any call (never trained);
	// branch 0 only.
	EchoRewritten  int32 `parquet:"echo_rewritten"`
	EchoUnanchored int32 `parquet:"echo_unanchored"`
}

// SessionCall is one model call of a gateway session in the calls
// column (gateway.CallRecord).
type SessionCall struct {
	Index            int            `json:"index"`
	API              string         `json:"api"`
	Branch           int            `json:"branch"`
	Status           string         `json:"status"`
	Reason           string         `json:"reason,omitempty"`
	Kind             string         `json:"kind,omitempty"`
	Requested        map[string]any `json:"requested,omitempty"`
	MaxTokens        int            `json:"max_tokens,omitempty"`
	Granted          int            `json:"granted,omitempty"`
	Stream           bool           `json:"stream,omitempty"`
	ToolChoice       string         `json:"tool_choice,omitempty"`
	ReplyID          string         `json:"reply_id,omitempty"`
	PromptTokens     int            `json:"prompt_tokens"`
	CompletionTokens int            `json:"completion_tokens"`
	Started          time.Time      `json:"started"`
	DurationMS       float64        `json:"duration_ms"`
}

// Main reports whether r is its rollout's main row (branch 0): the row
// that counts a session once (inspect, eval, conversation exports).
func (r *Record) Main() bool { return r.Branch == 0 }

// Normalize fills what older files lack: branch 0 has no parent and no
// split call (-1), which a file written before the branch columns
// existed reads as 0. Readers call it on every record.
func (r *Record) Normalize() {
	if r.Branch == 0 {
		r.ParentBranch, r.SplitCall = -1, -1
	}
}

// MainRows returns the records that are branch 0 of their rollout.
func MainRows(recs []Record) []Record {
	all := true
	for i := range recs {
		if !recs[i].Main() {
			all = false
			break
		}
	}
	if all {
		return recs
	}
	out := make([]Record, 0, len(recs))
	for i := range recs {
		if recs[i].Main() {
			out = append(out, recs[i])
		}
	}
	return out
}

// VersionCut is one change of policy version inside a generation: an
// abort cut and its continuation ("abort", Position the index in tokens of
// the first token after the cut) or a keep-mode freeze ("keep", Position
// -1: the engine continued the request, the switch point is unknown and
// the turn's tokens carry the older version).
type VersionCut struct {
	Turn     int32  `parquet:"turn"`
	Position int32  `parquet:"position"`
	Kind     string `parquet:"kind,dict"`
	From     int64  `parquet:"from"`
	To       int64  `parquet:"to"`
}

// Failure says why a rollout failed. Kind is a stable class name from the
// runner's failure taxonomy (e.g. "sandbox_start", "inference_timeout").
type Failure struct {
	Kind    string `parquet:"kind,dict"`
	Message string `parquet:"message"`
}

// ToolError is one failed tool call inside an otherwise completed rollout.
type ToolError struct {
	Turn    int32  `parquet:"turn"`
	Tool    string `parquet:"tool,dict"`
	CallID  string `parquet:"call_id"`
	Kind    string `parquet:"kind,dict"`
	Message string `parquet:"message"`
}

// LoopEvent is one intervention of the agent loop (agentloop.Event).
// Message is the index in messages of the message concerned; Original is
// what the model wrote when the loop changed it.
type LoopEvent struct {
	Turn     int32  `parquet:"turn"`
	Kind     string `parquet:"kind,dict"`
	Message  int32  `parquet:"message"`
	CallID   string `parquet:"call_id"`
	Original string `parquet:"original"`
	Detail   string `parquet:"detail"`
}

// CallStatus is one tool call's parse outcome (agentloop.CallStatus).
// Index is the call's position among its turn's calls.
type CallStatus struct {
	Turn   int32  `parquet:"turn"`
	Index  int32  `parquet:"index"`
	Name   string `parquet:"name,dict"`
	Status string `parquet:"status,dict"`
	Reason string `parquet:"reason"`
	// SpanStart, SpanEnd: the call's token span [start, end) in Tokens:
	// sampled ids of its turn whose text contains the call as parsed.
	// -1 when unknown; files written before the columns existed read 0, 0
	// — any span with end ≤ start is unknown (a call is never empty).
	SpanStart int32 `parquet:"span_start"`
	SpanEnd   int32 `parquet:"span_end"`
}

// Parse statuses of CallStatus.Status.
const (
	CallOK        = "ok"
	CallRepaired  = "repaired"
	CallMalformed = "malformed"
)

// Stop reasons the exports and summaries treat specially (the agent loop's
// values; the column holds any of docs/agentloop.md's).
const (
	// StopLength: the last generation hit max_tokens. The Atropos export
	// can zero such rollouts' advantage (ZeroAdvantageOnTruncation).
	StopLength = "length"
)

// Timings are wall-clock milliseconds spent in each phase of a rollout.
type Timings struct {
	GenerationMS   int64 `parquet:"generation_ms"`
	ToolsMS        int64 `parquet:"tools_ms"`
	SandboxStartMS int64 `parquet:"sandbox_start_ms"`
	RewardMS       int64 `parquet:"reward_ms"`
	TotalMS        int64 `parquet:"total_ms"`
}

// Manifest records what is needed to reproduce a rollout.
type Manifest struct {
	ImageDigest      string  `parquet:"image_digest,dict"`
	CPUs             float64 `parquet:"cpus"`
	MemoryBytes      int64   `parquet:"memory_bytes"`
	PidsLimit        int64   `parquet:"pids_limit"`
	Network          string  `parquet:"network,dict"`
	RolloutTimeoutMS int64   `parquet:"rollout_timeout_ms"`
	ToolTimeoutMS    int64   `parquet:"tool_timeout_ms"`
	Parser           string  `parquet:"parser,dict"`
	ServiceVersion   string  `parquet:"service_version,dict"`
	ConfigHash       string  `parquet:"config_hash,dict"`
	// DiskBytes and Runtime complete the applied limits: the sandbox's
	// disk bound and OCI runtime (runc, runsc). Zero/empty in files
	// written before they existed.
	DiskBytes int64  `parquet:"disk_bytes"`
	Runtime   string `parquet:"runtime,dict"`
	// Backend is the sandbox backend that made the sandbox: docker, runc
	// or kubernetes. Empty in files written before it existed and for
	// rollouts without a sandbox.
	Backend string `parquet:"backend,dict"`
}

// ErrInvalidRecord is returned (wrapped) by Validate and Writer.Write for a
// record whose fields contradict each other.
var ErrInvalidRecord = errors.New("invalid trajectory record")

// DeriveTrainingFields fills Masks from Tokens and LossMask (token id where
// trained, MaskIgnore elsewhere) when Masks is empty, and sets Logprobs to
// LogprobPlaceholder on untrained positions, so the Atropos conventions hold.
// It allocates a new Masks slice and rewrites Logprobs in place.
func (r *Record) DeriveTrainingFields() {
	if len(r.Masks) == 0 && len(r.LossMask) == len(r.Tokens) && len(r.Tokens) > 0 {
		r.Masks = make([]int32, len(r.Tokens))
		for i, t := range r.Tokens {
			if r.LossMask[i] != 0 {
				r.Masks[i] = t
			} else {
				r.Masks[i] = MaskIgnore
			}
		}
	}
	if len(r.Logprobs) == len(r.LossMask) {
		for i, m := range r.LossMask {
			if m == 0 {
				r.Logprobs[i] = LogprobPlaceholder
			}
		}
	}
}

// Validate checks the invariants trainers rely on: aligned token columns,
// masks consistent with loss_mask, a known status, a failure on infra
// failures, and JSON text columns that parse. Errors wrap ErrInvalidRecord.
func (r *Record) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: group %q rollout %d: %s", ErrInvalidRecord, r.GroupID, r.RolloutIndex, fmt.Sprintf(format, args...))
	}
	n := len(r.Tokens)
	if len(r.LossMask) != n {
		return bad("loss_mask has %d entries, tokens %d", len(r.LossMask), n)
	}
	if len(r.Masks) != n {
		return bad("masks has %d entries, tokens %d", len(r.Masks), n)
	}
	if len(r.Logprobs) != 0 && len(r.Logprobs) != n {
		return bad("logprobs has %d entries, tokens %d (must be empty or aligned)", len(r.Logprobs), n)
	}
	if len(r.DistillTokenIDs) != len(r.DistillLogprobs) || (len(r.DistillTokenIDs) != 0 && len(r.DistillTokenIDs) != n) {
		return bad("distill_token_ids has %d entries, distill_logprobs %d, tokens %d (must be empty or aligned)", len(r.DistillTokenIDs), len(r.DistillLogprobs), n)
	}
	for i := range r.DistillTokenIDs {
		if len(r.DistillTokenIDs[i]) != len(r.DistillLogprobs[i]) {
			return bad("position %d: %d distill ids, %d distill logprobs", i, len(r.DistillTokenIDs[i]), len(r.DistillLogprobs[i]))
		}
	}
	if len(r.TokenVersions) != 0 && len(r.TokenVersions) != n {
		return bad("token_versions has %d entries, tokens %d (must be empty or aligned)", len(r.TokenVersions), n)
	}
	for _, c := range r.VersionCuts {
		if c.Position < -1 || int(c.Position) >= max(n, 1) && n > 0 {
			return bad("version cut at position %d outside the %d tokens", c.Position, n)
		}
	}
	for i := range n {
		switch r.LossMask[i] {
		case 0:
			if r.Masks[i] != MaskIgnore {
				return bad("masks[%d] = %d on an untrained position, want %d", i, r.Masks[i], MaskIgnore)
			}
		case 1:
			if r.Masks[i] != r.Tokens[i] {
				return bad("masks[%d] = %d on a trained position, want the token id %d", i, r.Masks[i], r.Tokens[i])
			}
		default:
			return bad("loss_mask[%d] = %d, want 0 or 1", i, r.LossMask[i])
		}
	}
	if n > 0 && int(r.PromptTokens)+int(r.CompletionTokens) != n {
		return bad("prompt_tokens %d + completion_tokens %d != %d tokens", r.PromptTokens, r.CompletionTokens, n)
	}
	switch r.Status {
	case StatusOK:
	case StatusInfraFailed:
		if r.Failure == nil || r.Failure.Kind == "" {
			return bad("status %q needs a failure kind", r.Status)
		}
	default:
		return bad("status %q, want %q or %q", r.Status, StatusOK, StatusInfraFailed)
	}
	for name, text := range map[string]string{"sampling_params": r.SamplingParams, "messages": r.Messages, "tools": r.Tools} {
		if text != "" && !json.Valid([]byte(text)) {
			return bad("%s is not valid JSON", name)
		}
	}
	if r.GroupID == "" {
		return bad("empty group_id")
	}
	switch {
	case r.Branch < 0:
		return bad("branch %d is negative", r.Branch)
	// Branch 0's parent and split call are -1; 0 is "not set" (a record
	// built before the columns existed), which the writer normalizes.
	case r.Branch == 0 && (r.ParentBranch < -1 || r.ParentBranch > 0 || r.SplitCall < -1 || r.SplitCall > 0 || r.SharedTokens != 0):
		return bad("branch 0 has parent_branch %d, split_call %d, shared_tokens %d (want -1, -1, 0)", r.ParentBranch, r.SplitCall, r.SharedTokens)
	case r.Branch > 0 && (r.ParentBranch < 0 || r.ParentBranch >= r.Branch):
		return bad("branch %d has parent_branch %d (want an earlier branch)", r.Branch, r.ParentBranch)
	case r.Branch > 0 && (r.SplitCall < 0 || r.SharedTokens < 0 || int(r.SharedTokens) > n):
		return bad("branch %d has split_call %d, shared_tokens %d of %d tokens", r.Branch, r.SplitCall, r.SharedTokens, n)
	case r.Branch > 0 && (r.Calls != "" || r.EchoRewritten != 0 || r.EchoUnanchored != 0):
		return bad("branch %d carries session columns (calls, echo_*), which belong to branch 0", r.Branch)
	}
	if r.Calls != "" && !json.Valid([]byte(r.Calls)) {
		return bad("calls is not valid JSON")
	}
	return nil
}

// Trained reports the number of trained (loss_mask = 1) positions.
func (r *Record) Trained() int {
	c := 0
	for _, m := range r.LossMask {
		if m != 0 {
			c++
		}
	}
	return c
}
