package runner

import (
	"math"
)

// AssembleGroup computes a group's statistics and advantages over its ok
// rollouts, as the runner does for the groups it runs: for groups
// assembled outside it (a standalone gateway's sessions).
func AssembleGroup(g *Group, a Advantage) { assemble(g, a) }

// assemble computes the group statistics and advantages over ok rollouts.
func assemble(g *Group, a Advantage) {
	var sum float64
	for _, ro := range g.Rollouts {
		if ro.Status == StatusOK {
			g.OK++
			sum += ro.Score.Value
		}
	}
	if g.OK == 0 {
		return
	}
	g.Mean = sum / float64(g.OK)
	var ss float64
	equal := true
	for _, ro := range g.Rollouts {
		if ro.Status == StatusOK {
			d := ro.Score.Value - g.Mean
			ss += d * d
			if math.Abs(d) > 1e-12 {
				equal = false
			}
		}
	}
	g.Std = math.Sqrt(ss / float64(g.OK))
	g.Dropped = a.DropEqual && equal
	if a.Mode == AdvantageNone {
		return
	}
	for i := range g.Rollouts {
		ro := &g.Rollouts[i]
		if ro.Status != StatusOK {
			continue
		}
		adv := advantage(ro.Score.Value, g, a)
		ro.Advantage = &adv
		ro.BranchAdvantages = nil
		for b, r := range ro.BranchRewards {
			if ro.BranchAdvantages == nil {
				ro.BranchAdvantages = map[int]float64{}
			}
			ro.BranchAdvantages[b] = advantage(r, g, a)
		}
	}
}

// advantage of a reward in group g.
func advantage(r float64, g *Group, a Advantage) float64 {
	adv := r - g.Mean
	if a.Mode == AdvantageGRPO {
		adv /= g.Std + 1e-6
	}
	return adv
}
