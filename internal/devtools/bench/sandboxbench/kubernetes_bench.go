package sandboxbench

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/kubernetes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
)

// MeasureKubeExecSpawn times n `kubectl exec`-style calls: each opens a new
// exec stream through the API server and kubelet into the sandbox's pod,
// runs argv (default `true`) and reads its output — the per-call path the
// persistent channel replaces (the baseline of MeasureExec on Kubernetes).
// It uses client-go directly, so no CLI start-up is counted.
func MeasureKubeExecSpawn(ctx context.Context, k *kubernetes.Kubernetes, s sandbox.Sandbox, n int, argv ...string) ([]time.Duration, error) {
	if len(argv) == 0 {
		argv = []string{"true"}
	}
	req := k.CoreV1().RESTClient().Post().Resource("pods").Namespace(k.Namespace()).Name(s.ID()).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: kubernetes.ContainerName, Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		ex, err := kubernetes.NewExecutor(k.RESTConfig(), req.URL())
		if err != nil {
			return out, err
		}
		var stdout, stderr bytes.Buffer
		if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
			return out, fmt.Errorf("exec %v: %w (%s)", argv, err, stderr.String())
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// MeasureAgentSandboxClaim times n claims of a warm sandbox of spec (mode
// agent-sandbox): before each sample the SandboxWarmPool is waited full
// again, with channels open into its pods (not timed); a sample is Create —
// SandboxClaim created, bound to a warm Sandbox, Ready, the channel opened
// ahead into its pod taken — and the sandbox is closed after it.
func MeasureAgentSandboxClaim(ctx context.Context, k *kubernetes.Kubernetes, spec sandbox.Spec, n int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		if err := k.WarmAgentSandbox(ctx, spec, k.Config().AgentSandbox.WarmPool); err != nil {
			return out, err
		}
		d, err := MeasureCreate(ctx, k, spec, 1)
		out = append(out, d...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}
