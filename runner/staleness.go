package runner

import (
	"context"
	"fmt"
	"math"

	"github.com/rollout-rl/rollout/datasets"
)

// What happens to a group outside async.max_staleness.
const (
	OnStaleDrop       = "drop"
	OnStaleRegenerate = "regenerate"
	OnStaleMark       = "mark"
)

// AsyncConfig bounds the policy lag of collected groups.
type AsyncConfig struct {
	// MaxStaleness is the largest lag, in policy versions, between the
	// oldest sampled token of a group and the current policy version when
	// the group completes (and, for CollectGroups, when it is handed to the
	// trainer). Unset: no bound.
	MaxStaleness *int64 `yaml:"max_staleness,omitempty" json:"max_staleness,omitempty"`
	// OnStale: "drop" (default), "regenerate" (generate the group again,
	// up to max_regenerations times, then drop) or "mark" (deliver it,
	// flagged stale).
	OnStale string `yaml:"on_stale,omitempty" json:"on_stale,omitempty"`
	// MaxRegenerations bounds "regenerate" per group (default 3).
	MaxRegenerations int `yaml:"max_regenerations,omitempty" json:"max_regenerations,omitempty"`
}

// Policy returns on_stale with its default.
func (a AsyncConfig) Policy() string {
	if a.OnStale == "" {
		return OnStaleDrop
	}
	return a.OnStale
}

// MaxRegenerationsOrDefault is max_regenerations with its default.
func (a AsyncConfig) MaxRegenerationsOrDefault() int { return a.regenerations() }

func (a AsyncConfig) regenerations() int {
	if a.MaxRegenerations == 0 {
		return 3
	}
	return a.MaxRegenerations
}

func (a AsyncConfig) validate(bad func(field, format string, args ...any) error) error {
	if a.MaxStaleness != nil && *a.MaxStaleness < 0 {
		return bad("async.max_staleness", "%d is negative; want 0 (on-policy only) or more versions", *a.MaxStaleness)
	}
	switch a.OnStale {
	case "", OnStaleDrop, OnStaleRegenerate, OnStaleMark:
	default:
		return bad("async.on_stale", "%q; want drop, regenerate or mark", a.OnStale)
	}
	if a.MaxRegenerations < 0 {
		return bad("async.max_regenerations", "must not be negative")
	}
	if a.MaxStaleness == nil && (a.OnStale != "" || a.MaxRegenerations != 0) {
		return bad("async.on_stale", "has no effect without async.max_staleness")
	}
	return nil
}

// GroupVersions summarises the policy versions of a group's sampled
// tokens (ok rollouts only).
type GroupVersions struct {
	Min, Max int64
	// Current is the policy version when the group was checked; Lag is
	// Current - Min.
	Current, Lag int64
}

// Versioned is implemented by a policy that knows its current version
// (inference.Client).
type Versioned interface {
	PolicyVersion() int64
}

// CurrentVersion is the policy's current version (ok false when the policy
// does not track versions).
func (r *Runner) CurrentVersion() (int64, bool) {
	v, ok := r.deps.Policy.(Versioned)
	if !ok {
		return 0, false
	}
	return v.PolicyVersion(), true
}

// Versions computes g's version summary against current. It is nil when no
// ok rollout carries per-token versions.
func Versions(g *Group, current int64) *GroupVersions {
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	for i := range g.Rollouts {
		ro := &g.Rollouts[i]
		if ro.Status != StatusOK {
			continue
		}
		for _, seq := range ro.Sequences() {
			if len(seq.Versions) != len(seq.Tokens) || len(seq.Mask) != len(seq.Tokens) {
				continue
			}
			for j, v := range seq.Versions {
				if seq.Mask[j] == 0 {
					continue
				}
				lo, hi = min(lo, v), max(hi, v)
			}
			for _, c := range seq.Cuts {
				hi = max(hi, c.To)
			}
		}
	}
	if lo == math.MaxInt64 {
		return nil
	}
	current = max(current, hi)
	return &GroupVersions{Min: lo, Max: hi, Current: current, Lag: current - lo}
}

// OutsideBound reports whether versions exceed the run's max_staleness.
func (r *Runner) OutsideBound(v *GroupVersions) bool {
	b := r.cfg.Async.MaxStaleness
	return b != nil && v != nil && v.Lag > *b
}

// runBounded runs a group and applies async.max_staleness: a group whose
// oldest sampled token lags the current version by more than the bound is
// dropped, generated again or marked.
func (r *Runner) runBounded(ctx context.Context, idx int, it datasets.Item, o GroupOptions) *Group {
	regen := 0
	for {
		g := r.runGroupOnce(ctx, idx, it, o)
		cur, ok := r.CurrentVersion()
		if !ok {
			return g
		}
		g.Versions = Versions(g, cur)
		g.Regenerated = regen
		if !r.OutsideBound(g.Versions) {
			return g
		}
		switch r.cfg.Async.Policy() {
		case OnStaleMark:
			g.Stale = true
			return g
		case OnStaleRegenerate:
			if regen < r.cfg.Async.regenerations() && ctx.Err() == nil {
				regen++
				r.log.Info("group outside async.max_staleness; generating it again", "group_id", g.ID, "lag", g.Versions.Lag, "attempt", regen)
				continue
			}
		}
		g.StaleDropped = true
		return g
	}
}

// countStale counts a group dropped as stale (it reaches no sink).
func (r *Runner) countStale(g *Group) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sum.GroupsStaleDropped++
	r.sum.GroupsStaleRegenerated += g.Regenerated
}

// CountStale counts a group dropped as stale outside Run (trainer-driven
// collection).
func (r *Runner) CountStale(g *Group) { r.countStale(g) }

// StaleError describes a dropped stale group.
func StaleError(g *Group) error {
	if g.Versions == nil {
		return fmt.Errorf("group %s is outside async.max_staleness", g.ID)
	}
	return fmt.Errorf("group %s is outside async.max_staleness: oldest token version %d, current %d (lag %d)", g.ID, g.Versions.Min, g.Versions.Current, g.Versions.Lag)
}
