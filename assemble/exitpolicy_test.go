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
