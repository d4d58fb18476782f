package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
)

// MeasureKubeExecSpawn times n `kubectl exec`-style calls: each opens a new
// exec stream through the API server and kubelet into the sandbox's pod,
// runs argv (default `true`) and reads its output — the per-call path the
// persistent channel replaces (the baseline of MeasureExec on Kubernetes).
// It uses client-go directly, so no CLI start-up is counted.
func MeasureKubeExecSpawn(ctx context.Context, k *Kubernetes, s Sandbox, n int, argv ...string) ([]time.Duration, error) {
	if len(argv) == 0 {
		argv = []string{"true"}
	}
	req := k.cs.core.RESTClient().Post().Resource("pods").Namespace(k.cfg.Namespace).Name(s.ID()).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: k8sContainer, Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		ex, err := newExecutor(k.rest, req.URL())
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
