package server

import (
	"math"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/trajectory"
)

// rolloutOf builds a full-layout rollout from a mask and logprobs.
func rolloutOf(mask []int32, lps []float32) *rolloutv1.Rollout {
	r := &rolloutv1.Rollout{Index: 3, RolloutId: "g-3", Status: "ok", Reward: 1, MessagesJson: `[]`,
		RewardComponents: map[string]float64{"a": 1}, Tokens: make([]int32, len(mask)), LossMask: mask, Logprobs: lps}
	for i := range r.Tokens {
		r.Tokens[i] = int32(1000 + i)
	}
	return r
}

func TestCompactRolloutRoundTrip(t *testing.T) {
	p := trajectory.LogprobPlaceholder
	cases := []struct {
		name         string
		mask         []int32
		lps          []float32
		runs         []int32
		compactLPs   bool // trained_logprobs used
		compactMask  bool
		trainedCount int
	}{
		{"prompt then turns", []int32{0, 0, 1, 1, 0, 1}, []float32{p, p, -0.5, -0.25, p, -3}, []int32{2, 2, 1, 1}, true, true, 3},
		{"starts trained", []int32{1, 1, 0}, []float32{-1, -2, p}, []int32{0, 2, 1}, true, true, 2},
		{"nothing trained", []int32{0, 0, 0}, []float32{p, p, p}, []int32{3}, false, true, 0},
		{"no logprobs", []int32{0, 1}, nil, []int32{1, 1}, false, true, 0},
		{"real value at an untrained position", []int32{0, 1}, []float32{-0.1, -0.2}, []int32{1, 1}, false, true, 0},
		{"near the placeholder is not the placeholder", []int32{0, 1}, []float32{math.Nextafter32(p, 2), -0.2}, []int32{1, 1}, false, true, 0},
		{"mask value other than 0/1", []int32{0, 2}, []float32{p, -0.2}, nil, false, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			full := rolloutOf(c.mask, c.lps)
			orig := proto.Clone(full)
			cr := CompactRollout(full)
			if !proto.Equal(full, orig) {
				t.Fatal("CompactRollout modified its input")
			}
			if c.compactMask != (len(cr.LossMaskRuns) > 0 && len(cr.LossMask) == 0) {
				t.Fatalf("mask compact = %v, want %v (%v)", len(cr.LossMaskRuns) > 0, c.compactMask, cr)
			}
			if c.compactMask && !equalInts(cr.LossMaskRuns, c.runs) {
				t.Errorf("runs %v, want %v", cr.LossMaskRuns, c.runs)
			}
			if c.compactLPs != (len(cr.TrainedLogprobs) > 0 && len(cr.Logprobs) == 0) {
				t.Fatalf("logprobs compact = %v, want %v", len(cr.TrainedLogprobs) > 0, c.compactLPs)
			}
			if c.compactLPs && len(cr.TrainedLogprobs) != c.trainedCount {
				t.Errorf("%d trained logprobs, want %d", len(cr.TrainedLogprobs), c.trainedCount)
			}
			if c.compactMask && proto.Size(cr) >= proto.Size(full) && len(c.mask) > 4 {
				t.Errorf("compact %d B, full %d B", proto.Size(cr), proto.Size(full))
			}
			got := proto.Clone(cr).(*rolloutv1.Rollout)
			if err := ExpandRollout(got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, full) {
				t.Errorf("expanded\n%v\nwant\n%v", got, full)
			}
		})
	}
}

func TestCompactGroupLeavesSharedGroupAlone(t *testing.T) {
	p := trajectory.LogprobPlaceholder
	g := &rolloutv1.Group{GroupId: "g", Mean: 0.5, Rollouts: []*rolloutv1.Rollout{
		rolloutOf([]int32{0, 1, 1}, []float32{p, -1, -2}), rolloutOf(nil, nil)}}
	orig := proto.Clone(g)
	cg := CompactGroup(g)
	if !proto.Equal(g, orig) {
		t.Fatal("CompactGroup modified the shared group")
	}
	if cg.GroupId != "g" || cg.Mean != 0.5 || len(cg.Rollouts) != 2 || len(cg.Rollouts[0].LossMaskRuns) == 0 {
		t.Fatalf("compact group %v", cg)
	}
	if err := ExpandGroup(cg); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(cg, orig) {
		t.Errorf("expanded %v, want %v", cg, orig)
	}
}

func TestExpandRolloutRefusesInconsistentFields(t *testing.T) {
	cases := []struct {
		name string
		r    *rolloutv1.Rollout
		want string
	}{
		{"runs short of the tokens", &rolloutv1.Rollout{Tokens: []int32{1, 2, 3}, LossMaskRuns: []int32{1, 1}}, "cover 2 positions"},
		{"negative run", &rolloutv1.Rollout{Tokens: []int32{1}, LossMaskRuns: []int32{2, -1}}, "negative run"},
		{"both masks", &rolloutv1.Rollout{Tokens: []int32{1}, LossMask: []int32{1}, LossMaskRuns: []int32{0, 1}}, "both loss_mask"},
		{"too few trained logprobs", &rolloutv1.Rollout{Tokens: []int32{1, 2}, LossMaskRuns: []int32{0, 2}, TrainedLogprobs: []float32{-1}}, "1 trained_logprobs for 2"},
		{"trained logprobs without a mask", &rolloutv1.Rollout{TrainedLogprobs: []float32{-1}}, "for 0 trained"},
		{"both logprobs", &rolloutv1.Rollout{Tokens: []int32{1}, LossMask: []int32{1}, Logprobs: []float32{-1}, TrainedLogprobs: []float32{-1}}, "both logprobs"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := ExpandRollout(c.r)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
		})
	}
}

func TestCheckLayout(t *testing.T) {
	for _, l := range []rolloutv1.TokenLayout{0, 1, 2} {
		if err := checkLayout("f", l); err != nil {
			t.Errorf("%v: %v", l, err)
		}
	}
	if err := checkLayout("start.token_layout", 7); err == nil || !strings.Contains(err.Error(), "start.token_layout: unknown token layout 7") {
		t.Errorf("layout 7: %v", err)
	}
}

func equalInts(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A record's turn rewards and teacher top-K reach the stream as Parquet
// holds them, and survive the compact layout.
func TestRolloutProtoCarriesTurnRewardsAndDistill(t *testing.T) {
	rec := trajectory.Record{Status: trajectory.StatusOK, Reward: 1, Tokens: []int32{5, 6, 7, 8},
		LossMask: []int8{0, 1, 1, 0}, Logprobs: []float32{trajectory.LogprobPlaceholder, -0.5, -0.25, trajectory.LogprobPlaceholder},
		UnscoredTokens:  1,
		TurnRewards:     []float64{0, 0.5},
		DistillTokenIDs: [][]int32{{}, {6, 9}, {7, 1}, {}},
		DistillLogprobs: [][]float32{{}, {-0.1, -2.5}, {-0.3, -1.5}, {}}}
	pr := RolloutProto(&rec, "g#0", 1)
	if pr.UnscoredTokens != 1 {
		t.Fatalf("unscored_tokens %d, want 1", pr.UnscoredTokens)
	}
	if !slices.Equal(pr.TurnRewards, rec.TurnRewards) {
		t.Fatalf("turn_rewards %v, want %v", pr.TurnRewards, rec.TurnRewards)
	}
	if len(pr.Distill) != 4 || len(pr.Distill[0].TokenIds) != 0 ||
		!slices.Equal(pr.Distill[1].TokenIds, []int32{6, 9}) || !slices.Equal(pr.Distill[2].Logprobs, []float32{-0.3, -1.5}) {
		t.Fatalf("distill %v", pr.Distill)
	}
	cr := CompactRollout(pr)
	if err := ExpandRollout(cr); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(cr, pr) {
		t.Fatalf("compact round trip\n%v\nwant\n%v", cr, pr)
	}
	if none := RolloutProto(&trajectory.Record{Status: trajectory.StatusOK}, "g#1", 1); none.TurnRewards != nil || none.Distill != nil {
		t.Fatalf("a record without them: %v %v", none.TurnRewards, none.Distill)
	}
}

// Each tool call's parse status reaches the stream as Parquet holds it.
func TestRolloutProtoCarriesCallStatuses(t *testing.T) {
	rec := trajectory.Record{Status: trajectory.StatusOK, CallStatuses: []trajectory.CallStatus{
		{Turn: 1, Index: 0, Name: "terminal", Status: trajectory.CallMalformed, Reason: "call is truncated", SpanStart: 40, SpanEnd: 57},
		{Turn: 2, Index: 0, Name: "terminal", Status: trajectory.CallRepaired, Reason: "close marker missing", SpanStart: -1, SpanEnd: -1},
	}}
	pr := RolloutProto(&rec, "g#0", 1)
	if len(pr.CallStatuses) != 2 {
		t.Fatalf("call_statuses %v", pr.CallStatuses)
	}
	for i, c := range rec.CallStatuses {
		got := pr.CallStatuses[i]
		if got.Turn != c.Turn || got.Index != c.Index || got.Name != c.Name || got.Status != c.Status || got.Reason != c.Reason ||
			got.SpanStart != c.SpanStart || got.SpanEnd != c.SpanEnd {
			t.Errorf("call_statuses[%d] = %v, want %+v", i, got, c)
		}
	}
}

// A record's routed experts reach the stream as Parquet holds them, and
// survive the compact layout.
func TestRolloutProtoCarriesRoutedExperts(t *testing.T) {
	rec := trajectory.Record{Status: trajectory.StatusOK, Tokens: []int32{5, 6, 7},
		LossMask: []int8{0, 1, 1}, Logprobs: []float32{trajectory.LogprobPlaceholder, -0.5, -0.25},
		RoutedExperts: []uint16{1, 2, 3, 4, 65535, 0, 7, 8}, RoutedExpertsShape: []int32{2, 2, 2}}
	pr := RolloutProto(&rec, "g#0", 1)
	if !slices.Equal(pr.RoutedExperts, []uint32{1, 2, 3, 4, 65535, 0, 7, 8}) || !slices.Equal(pr.RoutedExpertsShape, []int32{2, 2, 2}) {
		t.Fatalf("routed experts %v shape %v", pr.RoutedExperts, pr.RoutedExpertsShape)
	}
	cr := CompactRollout(pr)
	if err := ExpandRollout(cr); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(cr, pr) {
		t.Fatalf("compact round trip\n%v\nwant\n%v", cr, pr)
	}
	if none := RolloutProto(&trajectory.Record{Status: trajectory.StatusOK}, "g#1", 1); none.RoutedExperts != nil || none.RoutedExpertsShape != nil {
		t.Fatalf("a record without them: %v", none.RoutedExperts)
	}
}
