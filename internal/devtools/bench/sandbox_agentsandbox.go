package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rollout-rl/rollout/internal/devtools/bench/sandboxbench"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/kubernetes"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
)

// measureAgentSandbox reports the warm claim of mode agent-sandbox when
// the cluster has the kubernetes-sigs/agent-sandbox CRDs (and a note
// saying why not otherwise). Baseline: the cold pod start of mode pods
// measured in the same run.
func measureAgentSandbox(ctx context.Context, r *runCtx, kopts kubernetes.Options, pods *kubernetes.Kubernetes, cold sandboxbench.Stats) []Measure {
	const name = "sandbox.k8s.agentsandbox_claim_p50_ms"
	if err := kubernetes.CheckAgentSandboxCRDs(pods.RESTConfig()); err != nil {
		why := firstLine(err.Error())
		if errors.Is(err, kubernetes.ErrNoAgentSandboxCRDs) {
			why = "agent-sandbox CRDs not installed on the cluster (docs/kubernetes.md)"
		}
		return []Measure{{Name: name, Note: why}}
	}
	kopts.Instance = "bench-as-" + randomSuffix()
	kopts.Config.Mode = k8sconfig.ModeAgentSandbox
	kopts.Config.AgentSandbox.WarmPool = 2
	kopts.Config.MaxPods = 64
	k, err := kubernetes.New(ctx, kopts)
	if err != nil {
		return []Measure{{Name: name, Note: firstLine(err.Error())}}
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		_ = k.Close(cctx)
	}()
	d, err := sandboxbench.MeasureAgentSandboxClaim(ctx, k, sandbox.Spec{Image: "rollout-sandbox:busybox"}, r.n(20, 3))
	if err != nil {
		return []Measure{{Name: name, Note: firstLine(err.Error())}}
	}
	s := sandboxbench.Summarize(d)
	return []Measure{{Name: name, Value: ptr(toMS(s.P50)), Baseline: ptr(toMS(cold.P50)),
		BaselineName: "cold pod start of mode pods (create → agent handshake), same run",
		Note:         fmt.Sprintf("n=%d, p99 %.1f ms; SandboxClaim → bound by the controller to a warm Sandbox of a 2-replica SandboxWarmPool → Ready → the channel opened ahead into its pod taken", s.N, toMS(s.P99))}}
}
