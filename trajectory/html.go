package trajectory

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
)

//go:embed viewer.html.tmpl
var viewerTemplate string

var viewer = template.Must(template.New("viewer").Parse(viewerTemplate))

// HTMLOptions configures WriteHTML.
type HTMLOptions struct {
	// Title names the run in the page header.
	Title string
	// Limit caps the trajectories embedded in the page (500; token
	// sequences make each one large).
	Limit int
}

type viewRecord struct {
	Env               string             `json:"env"`
	Category          string             `json:"category"`
	ItemID            string             `json:"item_id"`
	GroupID           string             `json:"group_id"`
	RolloutIndex      int32              `json:"rollout_index"`
	Model             string             `json:"model"`
	PolicyVersion     *int64             `json:"policy_version"`
	Reward            float64            `json:"reward"`
	RewardComponents  map[string]float64 `json:"reward_components"`
	Advantage         *float64           `json:"advantage"`
	Status            string             `json:"status"`
	Failure           *Failure           `json:"failure"`
	StopReason        string             `json:"stop_reason"`
	FinishedNaturally bool               `json:"finished_naturally"`
	Turns             int32              `json:"turns"`
	Timings           Timings            `json:"timings"`
	DriftTokens       int32              `json:"drift_tokens"`
	UnscoredTokens    int32              `json:"unscored_tokens"`
	ToolErrors        []viewToolError    `json:"tool_errors"`
	LoopEvents        []viewLoopEvent    `json:"loop_events"`
	CallStatuses      []viewCallStatus   `json:"call_statuses"`
	SessionID         string             `json:"session_id"`
	Branch            int32              `json:"branch"`
	ParentBranch      int32              `json:"parent_branch"`
	SplitCall         int32              `json:"split_call"`
	SharedTokens      int32              `json:"shared_tokens"`
	Messages          json.RawMessage    `json:"messages"`
	Tools             json.RawMessage    `json:"tools"`
	Tokens            []int32            `json:"tokens"`
	LossMask          []int8             `json:"loss_mask"`
	Logprobs          []float32          `json:"logprobs"`
}

type viewToolError struct {
	Turn    int32  `json:"turn"`
	Tool    string `json:"tool"`
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

type viewLoopEvent struct {
	Turn     int32  `json:"turn"`
	Kind     string `json:"kind"`
	Message  int32  `json:"message"`
	Original string `json:"original"`
	Detail   string `json:"detail"`
}

type viewCallStatus struct {
	Turn      int32  `json:"turn"`
	Index     int32  `json:"index"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	Reason    string `json:"reason"`
	SpanStart int32  `json:"span_start"`
	SpanEnd   int32  `json:"span_end"`
}

func jsonOrNull(s string) json.RawMessage {
	if s == "" || !json.Valid([]byte(s)) {
		return json.RawMessage("null")
	}
	return json.RawMessage(s)
}

// WriteHTML writes one static, self-contained page (inline CSS and JS, no
// external assets) to browse recs: filters by env, status, reward and text;
// the conversation with tool calls and results; rewards and components; the
// token sequence with trained positions highlighted.
func WriteHTML(w io.Writer, recs []Record, opts HTMLOptions) error {
	if opts.Limit <= 0 {
		opts.Limit = 500
	}
	n := min(len(recs), opts.Limit)
	view := make([]viewRecord, 0, n)
	for i := range recs[:n] {
		r := &recs[i]
		v := viewRecord{Env: r.Env, Category: r.Category, ItemID: r.ItemID, GroupID: r.GroupID, RolloutIndex: r.RolloutIndex,
			Model: r.Model, PolicyVersion: r.PolicyVersion, Reward: r.Reward, RewardComponents: r.RewardComponents,
			Advantage: r.Advantage, Status: r.Status, Failure: r.Failure, StopReason: r.StopReason,
			FinishedNaturally: r.FinishedNaturally, Turns: r.Turns, Timings: r.Timings, DriftTokens: r.DriftTokens, UnscoredTokens: r.UnscoredTokens,
			Messages: jsonOrNull(r.Messages), Tools: jsonOrNull(r.Tools), Tokens: r.Tokens, LossMask: r.LossMask, Logprobs: r.Logprobs,
			SessionID: r.SessionID, Branch: r.Branch, ParentBranch: r.ParentBranch, SplitCall: r.SplitCall, SharedTokens: r.SharedTokens}
		for _, c := range r.CallStatuses {
			v.CallStatuses = append(v.CallStatuses, viewCallStatus{c.Turn, c.Index, c.Name, c.Status, c.Reason, c.SpanStart, c.SpanEnd})
		}
		for _, te := range r.ToolErrors {
			v.ToolErrors = append(v.ToolErrors, viewToolError{te.Turn, te.Tool, te.Kind, te.Message})
		}
		for _, e := range r.LoopEvents {
			v.LoopEvents = append(v.LoopEvents, viewLoopEvent{e.Turn, e.Kind, e.Message, e.Original, e.Detail})
		}
		view = append(view, v)
	}
	meta := fmt.Sprintf("%d trajectories", len(recs))
	if n < len(recs) {
		meta += fmt.Sprintf(", first %d embedded", n)
	}
	err := viewer.Execute(w, struct {
		Title, Meta string
		Records     []viewRecord
		Truncated   bool
	}{opts.Title, meta, view, n < len(recs)})
	if err != nil {
		return fmt.Errorf("write HTML viewer: %w", err)
	}
	return nil
}
