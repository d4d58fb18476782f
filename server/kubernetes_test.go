package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/rollout-rl/rollout/assemble"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/sandbox/host"
	sbkube "github.com/rollout-rl/rollout/sandbox/kubernetes"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
	"github.com/rollout-rl/rollout/trajectory"
)

// poolHandOuts is how many sandboxes warm pools have handed out in this
// process (rollout_sandbox_acquire_seconds{source="pool"}).
func poolHandOuts(t *testing.T) float64 {
	return float64(histogramCount(t, "rollout_sandbox_acquire_seconds", "source", "pool"))
}

// A job's sandbox.kubernetes.kubeconfig is a host path holding credentials:
// the server's path policy applies to it like to output.dir.
func TestKubernetesJobKubeconfigPathPolicy(t *testing.T) {
	shared := assemble.NewShared(docker.Options{Options: host.Options{Logger: quiet}}, 0)
	t.Cleanup(func() { _ = shared.Close(context.Background()) })
	h := startServer(t, Options{Sandboxes: shared, Images: shared}, RunOptions{})
	cfg := `env: terminal-tasks
groups: 1
inference: {backend: vllm, endpoints: [http://127.0.0.1:1]}
sandbox: {backend: kubernetes, kubernetes: {kubeconfig: /etc/elsewhere/kubeconfig}}
output: {dir: runs/k}
`
	_, err := h.cli.StartJob(bg(t), startReq(cfg, ""))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "sandbox.kubernetes.kubeconfig") {
		t.Fatalf("StartJob with a kubeconfig outside the data dir: %v", err)
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestKubernetesJob runs a sandboxed env through the gRPC API with
// sandbox.backend kubernetes on the lab cluster (scripts/k8s-lab): the
// server's shared backend starts a Kubernetes backend for the job, its
// sandboxes are pods (seen on the cluster while the job runs), and closing
// the backend leaves no pod and no lease.
func TestKubernetesJob(t *testing.T) {
	kc := os.Getenv("ROLLOUT_K8S_LAB_KUBECONFIG")
	if kc == "" {
		t.Skip("ROLLOUT_K8S_LAB_KUBECONFIG not set (start the lab: scripts/k8s-lab/lab.sh up)")
	}
	// The agent the lab loaded into the nodes (its image is named after it).
	t.Setenv("ROLLOUT_AGENT", filepath.Join(filepath.Dir(kc), "rollout-agent"))
	shared, instance := newShared(t, "servertest")

	kcfg := k8sconfig.Config{Kubeconfig: kc}
	rc, err := sbkube.RESTConfig(&kcfg)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		t.Fatal(err)
	}
	// Last (cleanups run in reverse): the connection to the API server,
	// whose HTTP/2 read loop would outlive the test (goleak).
	t.Cleanup(func() { utilnet.CloseIdleConnectionsFor(hc.Transport) })
	cs, err := kubernetes.NewForConfigAndClient(rc, hc)
	if err != nil {
		t.Fatal(err)
	}
	// The job's backend is the first Kubernetes one of the shared backend.
	sel := metav1.ListOptions{LabelSelector: sandbox.LabelInstance + "=" + instance + "-k1"}

	s := newSim(t, "terminal-tasks", -1)
	h := startServer(t, Options{Sandboxes: shared, Images: shared, AllowedPaths: []string{filepath.Dir(kc)}}, RunOptions{})
	cfg := fmt.Sprintf(`env: terminal-tasks
groups: 3
group_size: 2
inference:
  backend: vllm
  endpoints: [%s]
  timeout: 2m
parser: hermes
sampling: {max_tokens: 1024}
sandbox:
  image: rollout-sandbox:busybox
  backend: kubernetes
  kubernetes: {kubeconfig: %s, namespace: default, image_pull_policy: Never}
output: {dir: runs/kubernetes}
`, s.URL, kc)
	fromPool := poolHandOuts(t)
	j := h.start(t, startReq(cfg, ""))
	res := h.watch(bg(t), j.Id, true, nil)
	fromPool = poolHandOuts(t) - fromPool
	if res.err != nil || res.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		for g, rows := range readRun(t, j.OutputDir) {
			for _, r := range rows {
				if r.Status != trajectory.StatusOK {
					t.Errorf("group %s rollout %d: %s %+v", g, r.RolloutIndex, r.Status, r.Failure)
				}
			}
		}
		t.Fatalf("job: %v (%v)", res.finished, res.err)
	}
	if p := res.finished.Progress; p.GroupsDone != 3 || p.RolloutsOk != 6 {
		t.Errorf("progress %v", p)
	}
	// The manifest records the limits the pods were made with (the
	// defaults here), not the zeros of an unset config; a pod has no pids
	// limit of its own.
	d := sandbox.DefaultLimits
	for _, rows := range checkSandboxedRun(t, j.OutputDir, 3, sandbox.BackendKubernetes) {
		for _, r := range rows {
			if m := r.Manifest; m.CPUs != d.CPUs || m.MemoryBytes != d.MemoryBytes || m.DiskBytes != d.DiskBytes || m.PidsLimit != 0 {
				t.Errorf("rollout %s/%d: manifest %+v, want cpus %v, memory %d, disk %d, pids 0", r.GroupID, r.RolloutIndex, m, d.CPUs, d.MemoryBytes, d.DiskBytes)
			}
		}
	}
	// The scheduler's events name every pod of the job and its node (the
	// pods themselves are gone). Read after the job, not polled during it:
	// the backend sets client-go's global logger when it starts.
	prefix := "rollout-" + instance + "-k1-"
	pods, nodes := map[string]bool{}, map[string]bool{}
	for deadline := time.Now().Add(time.Minute); len(pods) < 6 && time.Now().Before(deadline); time.Sleep(time.Second) {
		evs, err := cs.CoreV1().Events("default").List(bg(t), metav1.ListOptions{FieldSelector: "reason=Scheduled"})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "Pod" && strings.HasPrefix(e.InvolvedObject.Name, prefix) {
				pods[e.InvolvedObject.Name] = true
				if i := strings.LastIndex(e.Message, " to "); i >= 0 {
					nodes[e.Message[i+4:]] = true
				}
			}
		}
	}
	seenNodes := make([]string, 0, len(nodes))
	for n := range nodes {
		seenNodes = append(seenNodes, n)
	}
	sort.Strings(seenNodes)
	t.Logf("the job's sandboxes: %d pods scheduled on nodes %v, %v handed out by the warm pool", len(pods), seenNodes, fromPool)
	if len(pods) < 6 {
		// One pod per rollout (pods are never reused).
		t.Errorf("%d pods of the job were scheduled, want >= 6 (one per rollout)", len(pods))
	}
	// The groups were announced: their pods were started ahead by the
	// shared backend's warm pool.
	if fromPool < 1 {
		t.Errorf("no pod was handed out by the shared backend's warm pool")
	}
	// The job's end released its scope: no pod of it is left although
	// the backend is still up.
	live, err := cs.CoreV1().Pods("default").List(bg(t), sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range live.Items {
		if p.DeletionTimestamp == nil {
			t.Errorf("pod %s left after the job ended (%s)", p.Name, p.Status.Phase)
		}
	}

	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := shared.Close(ctx); err != nil {
		t.Fatalf("close the sandbox backends: %v", err)
	}
	left, err := cs.CoreV1().Pods("default").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range left.Items {
		if p.DeletionTimestamp == nil {
			t.Errorf("pod %s left behind (%s)", p.Name, p.Status.Phase)
		}
	}
	leases, err := cs.CoordinationV1().Leases("default").List(ctx, metav1.ListOptions{LabelSelector: sandbox.LabelManaged + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Items {
		if strings.Contains(l.Name, instance) {
			t.Errorf("lease %s left behind", l.Name)
		}
	}
}
