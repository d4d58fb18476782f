package kubernetes

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Kubernetes tests run against the project's lab cluster
// (scripts/k8s-lab/lab.sh up): ROLLOUT_K8S_LAB_KUBECONFIG names its
// kubeconfig; the agent the lab loaded into the nodes lies next to it. They
// skip without it.

var (
	kubeOnce sync.Once
	kubeErr  error
	testKube *Kubernetes
)

const labImage = "rollout-sandbox:busybox"

func needKube(t testing.TB) *Kubernetes {
	t.Helper()
	kc := os.Getenv("ROLLOUT_K8S_LAB_KUBECONFIG")
	if kc == "" {
		t.Skip("ROLLOUT_K8S_LAB_KUBECONFIG not set (start the lab: scripts/k8s-lab/lab.sh up)")
	}
	kubeOnce.Do(func() {
		ab := sandbox.AgentBinary{Path: filepath.Join(filepath.Dir(kc), "rollout-agent")}
		testKube, kubeErr = New(context.Background(), Options{
			Config:   k8sconfig.Config{Kubeconfig: kc, Namespace: "default", ImagePullPolicy: "Never"},
			Instance: "ktest-" + sandbox.RandomID(4), Agent: &ab,
		})
	})
	if kubeErr != nil {
		t.Fatalf("kubernetes backend on the lab: %v", kubeErr)
	}
	return testKube
}

func closeTestKube(ctx context.Context) error {
	if testKube == nil {
		return nil
	}
	return testKube.Close(ctx)
}

func newKubeSandbox(t *testing.T, k *Kubernetes, spec sandbox.Spec) *k8sSandbox {
	t.Helper()
	return sandboxtest.CreateOn(t, k, spec, labImage, 2*time.Minute).(*k8sSandbox)
}

func TestKubernetesConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  k8sconfig.Config
		want string
	}{
		{k8sconfig.Config{Mode: k8sconfig.ModePods, AgentSandbox: k8sconfig.AgentSandboxConfig{WarmPool: 2}}, "needs mode"},
		{k8sconfig.Config{Mode: k8sconfig.ModeAgentSandbox, AgentSandbox: k8sconfig.AgentSandboxConfig{WarmPool: -1}}, "negative"},
		{k8sconfig.Config{Mode: k8sconfig.ModeAgentSandbox, MaxPods: 4, AgentSandbox: k8sconfig.AgentSandboxConfig{WarmPool: 4}}, "below max_pods"},
		{k8sconfig.Config{Mode: "crd"}, "want"},
		{k8sconfig.Config{ImagePullPolicy: "Sometimes"}, "image_pull_policy"},
		{k8sconfig.Config{MaxPods: -1}, "negative"},
		{k8sconfig.Config{Tolerations: []k8sconfig.Toleration{{Operator: "Maybe"}}}, "operator"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
	c := k8sconfig.Config{}
	if err := c.Validate(); err != nil || c.Namespace != "default" || c.Mode != k8sconfig.ModePods || c.MaxPods != 512 {
		t.Fatalf("defaults: %+v %v", c, err)
	}
}

func TestKubernetesSandbox(t *testing.T) {
	k := needKube(t)
	s := newKubeSandbox(t, k, sandbox.Spec{Env: map[string]string{"FOO": "bar"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "echo $FOO; id -u; pwd"})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", r, err)
	}
	if got := string(r.Stdout); got != "bar\n1000\n/workspace\n" {
		t.Fatalf("exec output %q", got)
	}
	// Shell session state survives between commands.
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Command: "cd /tmp && export X=1", Shell: true}); err != nil {
		t.Fatal(err)
	}
	r, err = s.Exec(ctx, sandbox.ExecRequest{Command: "echo $X $(pwd)", Shell: true})
	if err != nil || string(r.Stdout) != "1 /tmp\n" {
		t.Fatalf("shell session: %q %v", r.Stdout, err)
	}
	// A timeout kills the process group and reports 124.
	r, err = s.Exec(ctx, sandbox.ExecRequest{Command: "sleep 30 & sleep 30", Timeout: 300 * time.Millisecond})
	if err != nil || !r.TimedOut || r.ExitCode != 124 {
		t.Fatalf("timeout: %+v %v", r, err)
	}
	// A cancelled call returns once the agent has killed and reaped its
	// command (conn.awaitCancelled), over the exec stream as over Docker's
	// socket: the next call finds no sleep left.
	for i := range 5 {
		cctx, ccancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := s.Exec(cctx, sandbox.ExecRequest{Command: "for i in 1 2 3 4; do sleep 1000 & done; wait"})
		ccancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("cancel %d: err = %v, want deadline exceeded", i, err)
		}
		r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "ps -o comm | grep -c sleep"})
		if err != nil || strings.TrimSpace(string(r.Stdout)) != "0" {
			t.Fatalf("after cancel %d: %q %v", i, r.Stdout, err)
		}
	}
	// Binary file round trip.
	data := patternBytes(3 << 20)
	if err := s.WriteFile(ctx, "/workspace/d/blob", data, 0o640); err != nil {
		t.Fatal(err)
	}
	got, err := s.ReadFile(ctx, "/workspace/d/blob")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
	if _, err := s.ReadFile(ctx, "/workspace/missing"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := s.ReadFile(ctx, "/.rollout/agent"); err != nil {
		t.Logf("agent readable by the user: %v", err)
	}
	// Tar upload and download.
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	script := []byte("#!/bin/sh\necho up\n")
	_ = tw.WriteHeader(&tar.Header{Name: "x/run.sh", Mode: 0o755, Size: int64(len(script)), Typeflag: tar.TypeReg})
	_, _ = tw.Write(script)
	_ = tw.Close()
	if err := s.Upload(ctx, "/workspace/up", &tb); err != nil {
		t.Fatal(err)
	}
	r, err = s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/workspace/up/x/run.sh"}})
	if err != nil || string(r.Stdout) != "up\n" {
		t.Fatalf("uploaded script: %+v %v", r, err)
	}
	var out bytes.Buffer
	if err := s.Download(ctx, "/workspace/up", &out); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&out)
	found := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "x/run.sh" && h.Mode&0o100 != 0 {
			found = true
		}
	}
	if !found {
		t.Fatal("download lacks x/run.sh with its mode")
	}
	// Background processes and quiesce.
	p, err := s.Start(ctx, sandbox.ExecRequest{Command: "echo started; sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Command: "setsid sleep 300 >/dev/null 2>&1 &"}); err != nil {
		t.Fatal(err)
	}
	procs, err := s.Processes(ctx)
	if err != nil || len(procs) != 1 || !procs[0].Running {
		t.Fatalf("processes: %+v %v", procs, err)
	}
	killed, err := s.KillAll(ctx)
	if err != nil || killed < 2 {
		t.Fatalf("killall: killed %d, %v", killed, err)
	}
	info, err := s.Wait(ctx, p.ID, 10*time.Second)
	if err != nil || info.Running {
		t.Fatalf("background process after killall: %+v %v", info, err)
	}
	r, err = s.Exec(ctx, sandbox.ExecRequest{Command: "ps -o user,comm | grep -c sleep || true"})
	if err != nil || strings.TrimSpace(string(r.Stdout)) != "0" {
		t.Fatalf("sleeps left after killall: %q %v", r.Stdout, err)
	}
	// `kill -9 -1` as the sandbox user does not reach the root agent.
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Command: "kill -9 -1"}); err != nil {
		t.Fatalf("kill -9 -1: %v", err)
	}
	if r, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("after kill -9 -1: %+v %v", r, err)
	}
	// Isolation as the API server stored it.
	pod, err := k.cs.core.Pods(k.Namespace()).Get(ctx, s.ID(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	sc := c.SecurityContext
	switch {
	case pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken:
		t.Error("service account token mounted")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("privilege escalation allowed")
	case len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL":
		t.Errorf("capabilities not dropped: %+v", sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != "RuntimeDefault":
		t.Error("no RuntimeDefault seccomp")
	case c.Resources.Limits.Memory().Value() != sandbox.DefaultLimits.MemoryBytes:
		t.Errorf("memory limit %v", c.Resources.Limits.Memory())
	case pod.Labels[LabelNetwork] != sandbox.NetworkNone:
		t.Errorf("network label %q", pod.Labels[LabelNetwork])
	case len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0].Kind != "Lease":
		t.Errorf("owner %+v", pod.OwnerReferences)
	}
	// The commands hold no capabilities and cannot gain any.
	r, err = s.Exec(ctx, sandbox.ExecRequest{Command: "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status"})
	if err != nil || !strings.Contains(string(r.Stdout), "CapEff:\t0000000000000000") || !strings.Contains(string(r.Stdout), "NoNewPrivs:\t1") {
		t.Fatalf("command privileges: %q %v", r.Stdout, err)
	}
	name := s.ID()
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("exec after close: %v", err)
	}
	if _, err := k.cs.core.Pods(k.Namespace()).Get(ctx, name, metav1.GetOptions{}); err == nil {
		t.Fatalf("pod %s still exists after Close", name)
	}
}

// Sandboxes spread over the lab's nodes, a warm pool hands them out, and
// nothing is left once they are closed.
func TestKubernetesSpreadAndPool(t *testing.T) {
	k := needKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool := sandbox.NewPool(k, sandbox.PoolOptions{MaxIdle: 16})
	spec := sandbox.Spec{Image: labImage}
	const n = 8
	if err := pool.Expect(spec, n); err != nil {
		t.Fatal(err)
	}
	var boxes []sandbox.Sandbox
	nodes := map[string]int{}
	for range n {
		s, err := pool.Acquire(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		boxes = append(boxes, s)
		nodes[s.(*k8sSandbox).Node()]++
		if r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "hostname"}); err != nil || r.ExitCode != 0 {
			t.Fatalf("exec: %+v %v", r, err)
		}
	}
	if len(nodes) < 2 {
		t.Errorf("pods on %d node(s) %v, want >= 2", len(nodes), nodes)
	}
	for _, s := range boxes {
		if err := s.Close(ctx); err != nil {
			t.Error(err)
		}
	}
	if err := pool.Close(ctx); err != nil {
		t.Fatal(err)
	}
	pods, err := k.cs.core.Pods(k.Namespace()).List(ctx, metav1.ListOptions{LabelSelector: sandbox.LabelInstance + "=" + k.Instance()})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 0 {
		t.Fatalf("%d pods left after closing every sandbox and the pool", len(pods.Items))
	}
}

// An image the nodes do not have is a clear ErrInvalid, not a hang in
// Pending.
func TestKubernetesMissingImage(t *testing.T) {
	k := needKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := k.Create(ctx, sandbox.Spec{Image: "rollout-no-such-image:1"})
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "ErrImageNeverPull") {
		t.Fatalf("missing image: %v", err)
	}
}

// A pod whose memory hog is OOM-killed as a whole, and a pod deleted from
// outside, break the channel with ErrUnavailable saying what happened.
func TestKubernetesPodDeletedFromOutside(t *testing.T) {
	k := needKube(t)
	s := newKubeSandbox(t, k, sandbox.Spec{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.Exec(ctx, sandbox.ExecRequest{Command: "sleep 60"})
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	grace := int64(0)
	if err := k.cs.core.Pods(k.Namespace()).Delete(ctx, s.ID(), metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	err := <-done
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "delet") {
		t.Fatalf("exec in a deleted pod: %v", err)
	}
}

// TestKubernetesNodeLoss freezes a lab node (`docker pause`: its kubelet
// stops reporting and every connection to it hangs, as with a partitioned or
// hung machine; only with ROLLOUT_K8S_LAB_DESTRUCTIVE=1, the node is unpaused
// afterwards). A command running in a sandbox on that node returns
// ErrUnavailable once the node lifecycle controller marks its pods not
// ready, instead of hanging; a sandbox elsewhere keeps working. (A node that
// is killed outright breaks the stream at once: scripts/k8s-lab/e2e.sh
// --kill-node.)
func TestKubernetesNodeLoss(t *testing.T) {
	if os.Getenv("ROLLOUT_K8S_LAB_DESTRUCTIVE") != "1" {
		t.Skip("freezes a lab node: set ROLLOUT_K8S_LAB_DESTRUCTIVE=1")
	}
	k := needKube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	byNode := map[string]*k8sSandbox{}
	for i := 0; i < 12 && len(byNode) < 2; i++ {
		s := newKubeSandbox(t, k, sandbox.Spec{})
		if byNode[s.Node()] == nil {
			byNode[s.Node()] = s
		}
	}
	if len(byNode) < 2 {
		t.Fatalf("sandboxes on one node only: %v", byNode)
	}
	var victim, other *k8sSandbox
	for _, s := range byNode {
		if victim == nil {
			victim = s
		} else {
			other = s
		}
	}
	if out, err := exec.Command("docker", "pause", victim.Node()).CombinedOutput(); err != nil {
		t.Fatalf("docker pause %s: %v %s", victim.Node(), err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "unpause", victim.Node()).Run() })
	start := time.Now()
	_, err := victim.Exec(ctx, sandbox.ExecRequest{Command: "sleep 120"})
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "no longer ready") {
		t.Fatalf("exec on the frozen node: %v", err)
	}
	t.Logf("lost sandbox after %s: %v", time.Since(start).Round(time.Second), err)
	if r, err := other.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("sandbox on the surviving node: %+v %v", r, err)
	}
}

// The pods of a process that stopped renewing its owner lease are deleted by
// Kubernetes' garbage collector once any reaper (here kubernetes.GC, what
// `rollout sandbox gc --kubernetes` runs) deletes the stale lease.
func TestKubernetesOrphanLease(t *testing.T) {
	k := needKube(t) // the lab is up
	_ = k
	kc := os.Getenv("ROLLOUT_K8S_LAB_KUBECONFIG")
	ab := sandbox.AgentBinary{Path: filepath.Join(filepath.Dir(kc), "rollout-agent")}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dead, err := New(ctx, Options{
		Config:   k8sconfig.Config{Kubeconfig: kc, ImagePullPolicy: "Never"},
		Instance: "kdead-" + sandbox.RandomID(4), Agent: &ab, ReapInterval: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := dead.Create(ctx, sandbox.Spec{Image: labImage})
	if err != nil {
		t.Fatal(err)
	}
	// The process "dies": no more renewals, and its lease looks old.
	killOwner(ctx, t, dead)
	reaped, err := GC(ctx, k8sconfig.Config{Kubeconfig: kc}, sandbox.ReapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range reaped {
		if r.Instance == dead.Instance() && strings.HasPrefix(r.Name, "lease/") {
			found = true
		}
		if r.Instance == k.Instance() {
			t.Errorf("gc reaped a live instance's object: %+v", r)
		}
	}
	if !found {
		t.Fatalf("stale lease not reaped: %+v", reaped)
	}
	sel := sandbox.LabelInstance + "=" + dead.Instance()
	for {
		pods, err := dead.cs.core.Pods(dead.Namespace()).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d pods of the dead instance left", len(pods.Items))
		case <-time.After(200 * time.Millisecond):
		}
	}
	_ = s
	if err := dead.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// Limits.ReadOnlyRoot: a read-only root filesystem with writable emptyDir
// /tmp and workdir.
func TestKubernetesReadOnlyRoot(t *testing.T) {
	k := needKube(t)
	s := newKubeSandbox(t, k, sandbox.Spec{Limits: sandbox.Limits{ReadOnlyRoot: true, DiskBytes: 64 << 20}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.WriteFile(ctx, "/workspace/a.txt", []byte("ok"), 0o644); err != nil {
		t.Fatalf("write to the workdir: %v", err)
	}
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "echo x > /tmp/t && cat /workspace/a.txt && touch /bin/nope"})
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode == 0 || !strings.HasPrefix(string(r.Stdout), "ok") || !strings.Contains(string(r.Stderr), "Read-only") {
		t.Fatalf("read-only root: %+v", r)
	}
}

// killOwner makes k look like a dead process: it stops renewing its lease,
// and the lease's last renewal is moved ten durations back.
func killOwner(ctx context.Context, t *testing.T, k *Kubernetes) {
	t.Helper()
	k.stop()
	k.bg.Wait()
	leases := k.cs.coord.Leases(k.Namespace())
	l, err := leases.Get(ctx, k.lease.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := metav1.NewMicroTime(time.Now().Add(-10 * k8sLeaseDuration))
	l.Spec.RenewTime = &old
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// patternBytes returns n bytes covering every byte value (a binary file
// round trip's content).
func patternBytes(n int) []byte {
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i * 7)
	}
	return data
}
