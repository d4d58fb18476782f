package runner

import (
	"testing"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/inference"
)

func rolloutWith(versions []int64, mask []int8, cuts ...inference.Cut) Rollout {
	toks := make([]int32, len(versions))
	return Rollout{Status: StatusOK, Result: agentloop.Result{Sequence: inference.Sequence{Tokens: toks, Mask: mask, Versions: versions, Cuts: cuts}}}
}

// The group's versions span the sampled tokens of its ok rollouts only;
// the lag is measured from the oldest one.
func TestGroupVersions(t *testing.T) {
	g := &Group{Rollouts: []Rollout{
		rolloutWith([]int64{0, 0, 3, 3}, []int8{0, 0, 1, 1}),                                                               // prompt at 0 is not sampled
		rolloutWith([]int64{2, 2, 4}, []int8{0, 1, 1}, inference.Cut{Turn: 1, Position: 2, Kind: "abort", From: 2, To: 4}), // cut 2 → 4
		{Status: StatusInfraFailed, Result: agentloop.Result{Sequence: inference.Sequence{Tokens: []int32{1}, Mask: []int8{1}, Versions: []int64{-5}}}},
	}}
	v := Versions(g, 5)
	if v == nil || v.Min != 2 || v.Max != 4 || v.Current != 5 || v.Lag != 3 {
		t.Fatalf("versions %+v, want min 2 max 4 current 5 lag 3", v)
	}
	if v := Versions(g, 1); v.Current != 4 || v.Lag != 2 {
		t.Fatalf("a current version behind the data is raised to the newest token: %+v", v)
	}
	if Versions(&Group{Rollouts: []Rollout{{Status: StatusOK}}}, 3) != nil {
		t.Fatal("no versions without per-token versions")
	}
	one := int64(1)
	r := &Runner{cfg: Config{Async: AsyncConfig{MaxStaleness: &one}}}
	if !r.OutsideBound(v) || r.OutsideBound(&GroupVersions{Lag: 1}) {
		t.Fatal("bound check")
	}
	if (&Runner{}).OutsideBound(v) {
		t.Fatal("no bound without max_staleness")
	}
}
