package kubernetes

import (
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/sandbox"
)

// Validate refuses what a pod cannot be held to by itself, without a
// cluster: the callers' own checks (the run config, the runner) are not
// the only guard. A spec it accepted stays accepted when validated again.
func TestKubernetesValidateSpec(t *testing.T) {
	k := &Kubernetes{}
	for _, tc := range []struct {
		spec sandbox.Spec
		want []string
	}{
		{sandbox.Spec{Image: "x", Limits: sandbox.Limits{PIDs: 256}}, []string{"pids limit 256", "kubernetes backend", "podPidsLimit"}},
		{sandbox.Spec{Image: "x", Limits: sandbox.Limits{PIDs: 4}}, []string{"pids limit 4", "kubernetes backend"}},
		{sandbox.Spec{Image: "x", Runtime: sandbox.RuntimeRunsc}, []string{"runtime", "runtime_class_name"}},
		{sandbox.Spec{Image: "x", Network: sandbox.NetworkBridge}, []string{"network", "kubernetes backend"}},
		{sandbox.Spec{}, []string{"image is empty"}},
	} {
		err := k.Validate(&tc.spec)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: got %v, want an error containing %q", tc.spec.Limits, err, w)
			}
		}
	}
	spec := sandbox.Spec{Image: "x", Network: sandbox.NetworkOpen}
	if err := k.Validate(&spec); err != nil {
		t.Fatal(err)
	}
	if spec.Limits.PIDs != 0 || spec.Limits.MemoryBytes != sandbox.DefaultLimits.MemoryBytes {
		t.Errorf("limits after validation: %+v (pids: none per pod; the other defaults filled)", spec.Limits)
	}
	if err := k.Validate(&spec); err != nil {
		t.Errorf("validated twice: %v", err)
	}
}
