package trajectory

import (
	"bufio"
	"fmt"
	"io"
)

// What the trainer-sample exports (verl, SkyRL, NeMo Gym) share: which
// records become samples, how a record splits into prompt and response,
// the routing layout, and the rollout facts each sample carries beside the
// trainer's own fields. Upstream shapes and commits: docs/trajectory-schema.md,
// "Trainer exports".

// RolloutRef is what a trainer sample says about the rollout it came from,
// under the key "rollout" (verl: inside extra_fields). A gateway session's
// branches share everything but the branch fields.
type RolloutRef struct {
	RunID             string    `json:"run_id"`
	Env               string    `json:"env"`
	ItemID            string    `json:"item_id"`
	GroupID           string    `json:"group_id"`
	RolloutIndex      int32     `json:"rollout_index"`
	SessionID         string    `json:"session_id"`
	Branch            int32     `json:"branch"`
	ParentBranch      int32     `json:"parent_branch"`
	SplitCall         int32     `json:"split_call"`
	SharedTokens      int32     `json:"shared_tokens"`
	Advantage         *float64  `json:"advantage"`
	PolicyVersion     *int64    `json:"policy_version,omitempty"`
	MinPolicyVersion  *int64    `json:"min_policy_version,omitempty"`
	MaxPolicyVersion  *int64    `json:"max_policy_version,omitempty"`
	StopReason        string    `json:"stop_reason"`
	FinishedNaturally bool      `json:"finished_naturally"`
	Stale             bool      `json:"stale,omitempty"`
	TurnRewards       []float64 `json:"turn_rewards,omitempty"`
}

func rolloutRef(r *Record) RolloutRef {
	return RolloutRef{
		RunID: r.RunID, Env: r.Env, ItemID: r.ItemID, GroupID: r.GroupID, RolloutIndex: r.RolloutIndex,
		SessionID: r.SessionID, Branch: r.Branch, ParentBranch: r.ParentBranch, SplitCall: r.SplitCall, SharedTokens: r.SharedTokens,
		Advantage: r.Advantage, PolicyVersion: r.PolicyVersion, MinPolicyVersion: r.MinPolicyVersion, MaxPolicyVersion: r.MaxPolicyVersion,
		StopReason: r.StopReason, FinishedNaturally: r.FinishedNaturally, Stale: r.Stale, TurnRewards: r.TurnRewards,
	}
}

// generatedNothing reports a row where the model was never called (a
// harness that made no call): data with nothing to train on, and not a
// chat-mode row, which counts its tokens.
func generatedNothing(r *Record) bool {
	return len(r.Tokens) == 0 && r.PromptTokens == 0 && r.CompletionTokens == 0
}

// trainableRecords selects what a token-level trainer may see: ok rows that
// generated something, through f's reward and finish filters. Infra failures
// are never exported as training data (f.IncludeFailed is ignored), and
// Dedupe does not apply to samples. TopK ranks rollouts, not rows: a kept
// rollout keeps every branch of its session.
func trainableRecords(recs []Record, f Filter) ([]Record, ExportStats) {
	st := ExportStats{Read: len(recs)}
	f.IncludeFailed, f.Dedupe = false, false
	var pre []Record
	for i := range recs {
		if recs[i].Status == StatusOK && !generatedNothing(&recs[i]) {
			pre = append(pre, recs[i])
		}
	}
	type key struct {
		group string
		index int32
	}
	kept := map[key]bool{}
	for _, r := range f.Select(MainRows(pre)) {
		kept[key{r.GroupID, r.RolloutIndex}] = true
	}
	var out []Record
	for i := range pre {
		if kept[key{pre[i].GroupID, pre[i].RolloutIndex}] {
			out = append(out, pre[i])
		}
	}
	st.Filtered = len(recs) - len(out)
	return out, st
}

// responseSplit is a record's token columns cut at its prompt: the layout
// of verl's and SkyRL's samples. Logprobs are nil when the backend returned
// none, and 0.0 (not the Atropos 1.0 placeholder) on untrained positions,
// as verl's tool agent loop and SkyRL's generator pad them.
type responseSplit struct {
	prompt, response []int32
	mask             []int8
	logprobs         []float32
}

func splitResponse(r *Record) (responseSplit, error) {
	n := len(r.Tokens)
	if n == 0 {
		return responseSplit{}, fmt.Errorf("%s: %w; trainer exports need a tokens-mode run", recordRef(r), ErrNoTokens)
	}
	if len(r.LossMask) != n {
		return responseSplit{}, fmt.Errorf("%w: %s: loss_mask has %d entries, tokens %d", ErrInvalidRecord, recordRef(r), len(r.LossMask), n)
	}
	if len(r.Logprobs) != 0 && len(r.Logprobs) != n {
		return responseSplit{}, fmt.Errorf("%w: %s: logprobs has %d entries, tokens %d", ErrInvalidRecord, recordRef(r), len(r.Logprobs), n)
	}
	p := int(r.PromptTokens)
	if p < 0 || p > n {
		return responseSplit{}, fmt.Errorf("%w: %s: prompt_tokens %d outside the %d tokens", ErrInvalidRecord, recordRef(r), p, n)
	}
	for i := range p {
		if r.LossMask[i] != 0 {
			return responseSplit{}, fmt.Errorf("%w: %s: prompt position %d is trained", ErrInvalidRecord, recordRef(r), i)
		}
	}
	s := responseSplit{
		prompt:   append([]int32{}, r.Tokens[:p]...),
		response: append([]int32{}, r.Tokens[p:]...),
		mask:     append([]int8{}, r.LossMask[p:]...),
	}
	if len(r.Logprobs) == n {
		s.logprobs = make([]float32, n-p)
		for i := range s.logprobs {
			if s.mask[i] != 0 {
				s.logprobs[i] = r.Logprobs[p+i]
			}
		}
	}
	return s, nil
}

// routingShape checks r's routed experts against its tokens and returns
// layers × topk; 0, 0 without routing.
func routingShape(r *Record) (layers, topk int, err error) {
	sh := r.RoutedExpertsShape
	if len(sh) == 0 && len(r.RoutedExperts) == 0 {
		return 0, 0, nil
	}
	if len(sh) != 3 || sh[0] < 0 || sh[1] <= 0 || sh[2] <= 0 || int(sh[0]) > len(r.Tokens) || len(r.RoutedExperts) != int(sh[0])*int(sh[1])*int(sh[2]) {
		return 0, 0, fmt.Errorf("%s: routed_experts_shape %v does not fit %d experts and %d tokens", recordRef(r), sh, len(r.RoutedExperts), len(r.Tokens))
	}
	return int(sh[1]), int(sh[2]), nil
}

// expertsRows expands r's flat routing to [n][layers][topk] over
// tokens[0:n], zeros where the engine reported none (the positions past
// routed_experts_shape[0]): the per-sample layout of verl's routed_experts
// and SkyRL's rollout_expert_indices.
func expertsRows(r *Record, n, layers, topk int) [][][]uint16 {
	rows := make([][][]uint16, n)
	flat := make([]uint16, n*layers*topk)
	copy(flat, r.RoutedExperts)
	for p := range rows {
		rows[p] = make([][]uint16, layers)
		for l := range layers {
			off := (p*layers + l) * topk
			rows[p][l] = flat[off : off+topk : off+topk]
		}
	}
	return rows
}

// groupExperts is the routing of a group's sequences, each aligned to its
// tokens, when they all carry routing of one layers × topk shape; nil when
// none does. A group where only some do is refused: a trainer replaying
// routing needs all or none.
func groupExperts(g []*Record) ([][][][]uint16, error) {
	with := 0
	for _, r := range g {
		if len(r.RoutedExpertsShape) > 0 || len(r.RoutedExperts) > 0 {
			with++
		}
	}
	if with == 0 {
		return nil, nil
	}
	if with != len(g) {
		return nil, fmt.Errorf("group %s: %d of %d records carry routed experts; a trainer replaying routing needs all or none", g[0].GroupID, with, len(g))
	}
	var out [][][][]uint16
	var layers, topk int
	for i, r := range g {
		l, k, err := routingShape(r)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			layers, topk = l, k
		} else if l != layers || k != topk {
			return nil, fmt.Errorf("%s: routed experts of %d layers × top-%d, the group's first record has %d × %d", recordRef(r), l, k, layers, topk)
		}
		out = append(out, expertsRows(r, len(r.Tokens), layers, topk))
	}
	return out, nil
}

// writeLines finishes an export: on a build error nothing is written;
// otherwise each value of lines is one JSON line.
func writeLines[T any](out io.Writer, what string, lines []T, st ExportStats, err error) (ExportStats, error) {
	if err != nil {
		return st, err
	}
	return st, writeJSONLines(out, what, lines)
}

func writeJSONLines[T any](out io.Writer, what string, lines []T) error {
	bw := bufio.NewWriter(out)
	for i := range lines {
		b, err := marshalNoEscape(&lines[i])
		if err != nil {
			return fmt.Errorf("encode %s line %d: %w", what, i+1, err)
		}
		if _, err := bw.Write(b); err != nil {
			return fmt.Errorf("write %s export: %w", what, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write %s export: %w", what, err)
	}
	return nil
}
