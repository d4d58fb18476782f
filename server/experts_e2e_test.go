package server

import (
	"context"
	"fmt"
	"testing"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/demo"
)

// Routed experts end to end: a job with inference.routed_experts against
// a mixture-of-experts simulator (vLLM's and SGLang's wire formats)
// delivers every rollout's routing in the gRPC group, aligned with its
// tokens: row p is what the engine routed tokens[p] to.
func TestRoutedExpertsInCollectedGroups(t *testing.T) {
	scripts, err := demo.EnvScripts(context.Background(), "toolcall-match", "train")
	if err != nil {
		t.Fatal(err)
	}
	x := &sim.Experts{Layers: 2, TopK: 2, Num: 8}
	h := startServer(t, Options{}, RunOptions{})
	for _, backend := range []string{"vllm-generate", "sglang"} {
		t.Run(backend, func(t *testing.T) {
			srv, err := sim.Start(context.Background(), sim.Config{Family: "hermes", Seed: 7, SuccessProb: 0.7, Scripts: scripts, Experts: x})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			cfg := fmt.Sprintf(`env: toolcall-match
group_size: 2
seed: 3
inference:
  backend: %s
  endpoints: [%s]
  timeout: 2m
  routed_experts: true
  routed_experts_topk: 2
parser: hermes
sampling: {max_tokens: 256}
limits: {groups_in_flight: 1}
`, backend, srv.URL)
			c := startCollect(t, h.cli, &rolloutv1.CollectStart{
				ConfigYaml: cfg, InitialCredits: 2, StreamId: "moe-" + backend})
			c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{RequestId: "r", Count: 2}}})
			c.until("2 groups", func() bool { return len(c.groups) == 2 })
			c.drain()
			checked := 0
			for _, g := range c.groups {
				for _, ro := range g.Rollouts {
					if ro.Status != "ok" {
						t.Fatalf("rollout %s: %s %s", ro.RolloutId, ro.FailureKind, ro.FailureMessage)
					}
					sh := ro.RoutedExpertsShape
					if len(sh) != 3 || sh[1] != 2 || sh[2] != 2 || int(sh[0]) != len(ro.Tokens)-1 {
						t.Fatalf("rollout %s: shape %v for %d tokens", ro.RolloutId, sh, len(ro.Tokens))
					}
					ids := make([]int, sh[0]+1)
					for i := range ids {
						ids[i] = int(ro.Tokens[i])
					}
					want := x.ExpertsFor(ids)
					if len(want) != len(ro.RoutedExperts) {
						t.Fatalf("rollout %s: %d experts, want %d", ro.RolloutId, len(ro.RoutedExperts), len(want))
					}
					for i, w := range want {
						if ro.RoutedExperts[i] != uint32(w) {
							t.Fatalf("rollout %s: expert %d is %d, the engine routed %d", ro.RolloutId, i, ro.RoutedExperts[i], w)
						}
					}
					checked++
				}
			}
			if checked != 4 {
				t.Fatalf("%d rollouts checked, want 4", checked)
			}
		})
	}
}
