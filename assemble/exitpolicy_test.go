package assemble

import (
	"errors"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/runner"
)

func TestExitPolicy(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		name     string
		max      *float64
		sum      runner.Summary
		fail     bool
		wantText string
	}{
		{"nothing ran", nil, runner.Summary{}, false, ""},
		{"all ok", nil, runner.Summary{Rollouts: 8, RolloutsOK: 8}, false, ""},
		{"none ok", f(1), runner.Summary{Rollouts: 8, InfraFailed: 8, FailuresByKind: map[string]int{"task": 8}}, true, "no rollout succeeded: all 8 infra_failed (task 8)"},
		{"half failed, default", nil, runner.Summary{Rollouts: 8, RolloutsOK: 4, InfraFailed: 4}, false, ""},
		{"most failed, default", nil, runner.Summary{Rollouts: 8, RolloutsOK: 3, InfraFailed: 5, FailuresByKind: map[string]int{"inference": 3, "sandbox": 2}},
			true, "5 of 8 rollouts infra_failed (62%, above max_infra_failed_fraction 0.5): inference 3, sandbox 2"},
		{"one failed, strict", f(0), runner.Summary{Rollouts: 8, RolloutsOK: 7, InfraFailed: 1, FailuresByKind: map[string]int{"reward": 1}}, true, "1 of 8"},
	} {
		err := exitPolicy(runner.Config{MaxInfraFailedFraction: tc.max}, tc.sum)
		if tc.fail != (err != nil) || (err != nil && (!errors.Is(err, ErrRunFailed) || !strings.Contains(err.Error(), tc.wantText))) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// A run whose ok rollouts left more than inference.max_unscored_share of
// their sampled ids without a logprob fails, after writing its rows.
func TestExitPolicyUnscored(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		name     string
		max      *float64
		sampled  int
		unscored int
		fail     bool
		wantText string
	}{
		{"none unscored", nil, 1000, 0, false, ""},
		{"at the default", nil, 1000, 10, false, ""},
		{"above the default", nil, 1000, 94, true, "94 of 1000 sampled tokens have no logprob and were not trained (9.40%, above inference.max_unscored_share 0.01)"},
		{"allowed", f(0.7), 1010, 653, false, ""},
		{"strict", f(0), 1000, 1, true, "1 of 1000"},
	} {
		cfg := runner.Config{}
		cfg.Inference.MaxUnscoredShare = tc.max
		sum := runner.Summary{Rollouts: 4, RolloutsOK: 4, SampledTokens: tc.sampled, UnscoredTokens: tc.unscored}
		err := exitPolicy(cfg, sum)
		if tc.fail != (err != nil) || (err != nil && (!errors.Is(err, ErrRunFailed) || !strings.Contains(err.Error(), tc.wantText))) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
