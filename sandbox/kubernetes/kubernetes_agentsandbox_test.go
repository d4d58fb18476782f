package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

// The agent-sandbox tests run against the lab cluster with the
// kubernetes-sigs/agent-sandbox controller and its CRDs installed
// (docs/kubernetes.md, "Mode agent-sandbox"): the lab step of `make test`
// installs them (scripts/k8s-lab/agent-sandbox.sh up) and sets
// ROLLOUT_K8S_LAB_AGENT_SANDBOX=1 (ci.sh); there the CRDs missing is a
// failure.
// Elsewhere (a lab started by hand without it) the tests skip, saying so.

const asTestWarm = 2

func needAgentSandbox(t *testing.T, warm int) *Kubernetes {
	t.Helper()
	needKube(t) // skips without the lab
	kc := os.Getenv("ROLLOUT_K8S_LAB_KUBECONFIG")
	cfg := k8sconfig.Config{Kubeconfig: kc}
	rc, err := RESTConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckAgentSandboxCRDs(rc); err != nil {
		if errors.Is(err, ErrNoAgentSandboxCRDs) && os.Getenv("ROLLOUT_K8S_LAB_AGENT_SANDBOX") == "" {
			t.Skipf("agent-sandbox CRDs not installed on the lab (%v): install the kubernetes-sigs/agent-sandbox controller with scripts/k8s-lab/agent-sandbox.sh up (make test's lab step does) to run these tests", err)
		}
		t.Fatal(err)
	}
	ab := sandbox.AgentBinary{Path: filepath.Join(filepath.Dir(kc), "rollout-agent")}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k, err := New(ctx, Options{
		Config: k8sconfig.Config{Kubeconfig: kc, ImagePullPolicy: "Never", Mode: k8sconfig.ModeAgentSandbox,
			AgentSandbox: k8sconfig.AgentSandboxConfig{WarmPool: warm}},
		Instance: "kas-" + sandbox.RandomID(4), Agent: &ab,
	})
	if err != nil {
		t.Fatalf("agent-sandbox backend on the lab: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := k.Close(ctx); err != nil {
			t.Errorf("close backend: %v", err)
		}
		waitInstanceGone(t, ctx, k, k.Instance())
	})
	return k
}

// waitInstanceGone waits until no claim, template, pool, Sandbox or pod
// of instance is left.
func waitInstanceGone(t *testing.T, ctx context.Context, k *Kubernetes, instance string) {
	t.Helper()
	sel := metav1.ListOptions{LabelSelector: sandbox.LabelInstance + "=" + instance}
	for {
		var left []string
		pods, err := k.cs.core.Pods(k.Namespace()).List(ctx, sel)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			left = append(left, "pod/"+p.Name)
		}
		for _, gvr := range []schema.GroupVersionResource{gvrSandboxClaim, gvrSandboxTmpl, gvrSandboxPool, gvrAgentSandbox} {
			l, err := k.crd.dyn.Resource(gvr).Namespace(k.Namespace()).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range l.Items {
				// Sandboxes carry the pod template's labels only inside
				// their spec: match them by owner instead.
				if u.GetLabels()[sandbox.LabelInstance] == instance || strings.HasPrefix(u.GetName(), "rollout-"+instance+"-") {
					left = append(left, gvr.Resource+"/"+u.GetName())
				}
			}
		}
		if len(left) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("left of instance %s: %v", instance, left)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// A claimed sandbox serves the same channel as a pod of mode pods: exec,
// files, tar; its claim is owned by the lease, its pod by the Sandbox;
// Close removes the claim, the Sandbox and the pod.
func TestKubernetesAgentSandboxClaim(t *testing.T) {
	k := needAgentSandbox(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := k.Create(ctx, sandbox.Spec{Image: labImage, Env: map[string]string{"FOO": "bar"},
		Labels: map[string]string{"io.rollout.run": "r1", "io.rollout.rollout": "r1-0-1"}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	s := sb.(*k8sSandbox)
	if s.claim == nil || s.claim.claim == "" || s.claim.sandbox == "" {
		t.Fatalf("no claim recorded: %+v", s.claim)
	}
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "echo $FOO; id -u; pwd"})
	if err != nil || r.ExitCode != 0 || string(r.Stdout) != "bar\n1000\n/workspace\n" {
		t.Fatalf("exec: %+v %v", r, err)
	}
	data := patternBytes(1 << 20)
	if err := s.WriteFile(ctx, "/workspace/blob", data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := s.ReadFile(ctx, "/workspace/blob")
	if err != nil || string(got) != string(data) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
	r, err = s.Exec(ctx, sandbox.ExecRequest{Command: "sleep 30", Timeout: 500 * time.Millisecond})
	if err != nil || !r.TimedOut {
		t.Fatalf("timeout: %+v %v", r, err)
	}

	claim, err := k.crd.dyn.Resource(gvrSandboxClaim).Namespace(k.Namespace()).Get(ctx, s.claim.claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if o := claim.GetOwnerReferences(); len(o) != 1 || o[0].Kind != "Lease" || o[0].UID != k.lease.UID {
		t.Errorf("claim owners %+v, want the lease", o)
	}
	pod, err := k.cs.core.Pods(k.Namespace()).Get(ctx, s.ID(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !ownedByAgentSandbox(pod) {
		t.Errorf("pod owners %+v, want the Sandbox", pod.OwnerReferences)
	}
	// Isolation as in mode pods (the same podFor), and the run labels
	// travelled through the claim.
	c := pod.Spec.Containers[0]
	switch {
	case pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken:
		t.Error("service-account token mounted")
	case c.SecurityContext == nil || c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation:
		t.Error("privilege escalation allowed")
	case pod.Labels["io.rollout.rollout"] != "r1-0-1" || pod.Labels[sandbox.LabelInstance] != k.Instance() || pod.Labels[LabelNetwork] != sandbox.NetworkNone:
		t.Errorf("pod labels %v", pod.Labels)
	case pod.Annotations["io.rollout.run"] != "r1":
		t.Errorf("pod annotations %v", pod.Annotations)
	}

	if err := s.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := k.crd.dyn.Resource(gvrSandboxClaim).Namespace(k.Namespace()).Get(ctx, s.claim.claim, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("claim after Close: %v", err)
	}
	if _, err := k.crd.dyn.Resource(gvrAgentSandbox).Namespace(k.Namespace()).Get(ctx, s.claim.sandbox, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Sandbox after Close: %v", err)
	}
	// The pod was deleted with grace period 0; a pod the controller
	// might have started again in between goes with its Sandbox.
	for {
		_, err := k.cs.core.Pods(k.Namespace()).Get(ctx, s.ID(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s after Close: %v", s.ID(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if _, err := s.Exec(ctx, sandbox.ExecRequest{Command: "true"}); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("exec after close: %v", err)
	}
}

// With a SandboxWarmPool the claim adopts a running pod: it is faster than
// a cold claim of the same spec, measured in the same run (no timing is
// asserted: the figures are logged for docs/kubernetes.md).
func TestKubernetesAgentSandboxWarmPool(t *testing.T) {
	k := needAgentSandbox(t, asTestWarm)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	spec := sandbox.Spec{Image: labImage}
	const n = 5
	var warm []time.Duration
	for range n {
		if err := k.WarmAgentSandbox(ctx, spec, asTestWarm); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		sb, err := k.Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		warm = append(warm, time.Since(start))
		s := sb.(*k8sSandbox)
		// Adopted from the pool: the Sandbox is one of the pool's, not
		// one made for the claim (which is named as the claim).
		if s.claim.sandbox == s.claim.claim {
			t.Errorf("claim %s was started cold although the pool had %d ready", s.claim.claim, asTestWarm)
		}
		if r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "echo ok"}); err != nil || string(r.Stdout) != "ok\n" {
			t.Fatalf("exec in the adopted pod: %+v %v", r, err)
		}
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Cold claims of the same spec in the same run: another process with
	// no warm pool.
	kc := needAgentSandbox(t, 0)
	var colds []time.Duration
	for range 3 {
		start := time.Now()
		sb, err := kc.Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		colds = append(colds, time.Since(start))
		if s := sb.(*k8sSandbox); s.claim.sandbox != s.claim.claim {
			t.Errorf("claim %s of an empty pool bound to %s, not a Sandbox of its own", s.claim.claim, s.claim.sandbox)
		}
		_ = sb.Close(ctx)
	}
	t.Logf("warm-pool claim → sandbox ready: p50 %s %v; cold claim: p50 %s %v", median(warm), warm, median(colds), colds)
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// A dead process's claims, templates, pools, Sandboxes and pods are
// collected once its lease is reaped (here by kubernetes.GC, what `rollout
// sandbox gc --kubernetes` runs): Kubernetes' garbage collector follows
// the owner references.
func TestKubernetesAgentSandboxDeadOwner(t *testing.T) {
	live := needAgentSandbox(t, 0)
	kc := os.Getenv("ROLLOUT_K8S_LAB_KUBECONFIG")
	ab := sandbox.AgentBinary{Path: filepath.Join(filepath.Dir(kc), "rollout-agent")}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dead, err := New(ctx, Options{
		Config: k8sconfig.Config{Kubeconfig: kc, ImagePullPolicy: "Never", Mode: k8sconfig.ModeAgentSandbox,
			AgentSandbox: k8sconfig.AgentSandboxConfig{WarmPool: 1}},
		Instance: "kasdead-" + sandbox.RandomID(4), Agent: &ab, ReapInterval: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dead.Create(ctx, sandbox.Spec{Image: labImage}); err != nil {
		t.Fatal(err)
	}
	// The process "dies": no renewals, its lease looks old.
	killOwner(ctx, t, dead)
	reaped, err := GC(ctx, k8sconfig.Config{Kubeconfig: kc}, sandbox.ReapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range reaped {
		if r.Instance == dead.Instance() && r.Name == "lease/"+dead.lease.Name {
			found = true
		}
		if r.Instance == live.Instance() {
			t.Errorf("gc reaped a live instance's object: %+v", r)
		}
	}
	if !found {
		t.Fatalf("stale lease not reaped: %+v", reaped)
	}
	waitInstanceGone(t, ctx, dead, dead.Instance())
	if err := dead.Close(ctx); err != nil { // its sandbox's stream broke with the pod
		t.Fatal(err)
	}
}

// Without the CRDs the mode fails at once with a clear error (an API
// server that serves only the core group).
func TestKubernetesAgentSandboxNoCRDs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/apis/"+agentSandboxGroup+"/"+agentSandboxVersion {
			fmt.Fprintf(w, `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"%s/%s","resources":[{"name":"sandboxes","namespaced":true,"kind":"Sandbox","verbs":["get"]}]}`, agentSandboxGroup, agentSandboxVersion)
			return
		}
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	}))
	defer srv.Close()
	err := CheckAgentSandboxCRDs(&rest.Config{Host: srv.URL})
	if !errors.Is(err, ErrNoAgentSandboxCRDs) || !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("got %v, want ErrNoAgentSandboxCRDs", err)
	}
	for _, want := range []string{"agent-sandbox CRDs not installed", "sandboxclaims.extensions.agents.x-k8s.io/v1beta1", "sandboxwarmpools", "docs/kubernetes.md"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "sandboxes.agents.x-k8s.io") {
		t.Errorf("error names a served resource as missing: %v", err)
	}
}

// A claimed sandbox whose pod is deleted from outside fails its calls with
// ErrUnavailable at once (the same pod informer as mode pods), although the
// controller starts a new pod for the Sandbox; Close still removes it all.
func TestKubernetesAgentSandboxPodDeleted(t *testing.T) {
	k := needAgentSandbox(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := k.Create(ctx, sandbox.Spec{Image: labImage})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := sb.Exec(ctx, sandbox.ExecRequest{Command: "sleep 60"})
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	grace := int64(0)
	if err := k.cs.core.Pods(k.Namespace()).Delete(ctx, sb.ID(), metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "delet") {
		t.Fatalf("exec in a deleted pod: %v", err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// A claim whose pod cannot start (image not on the nodes) fails at once
// with the pod's reason, classified as in mode pods, and its claim is
// deleted.
func TestKubernetesAgentSandboxMissingImage(t *testing.T) {
	k := needAgentSandbox(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := k.Create(ctx, sandbox.Spec{Image: "rollout-no-such-image:1"})
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "ErrImageNeverPull") || !strings.Contains(err.Error(), "SandboxClaim") {
		t.Fatalf("missing image: %v", err)
	}
	claims, err := k.crd.dyn.Resource(gvrSandboxClaim).Namespace(k.Namespace()).List(ctx, metav1.ListOptions{LabelSelector: sandbox.LabelInstance + "=" + k.Instance()})
	if err != nil {
		t.Fatal(err)
	}
	if len(claims.Items) != 0 {
		t.Errorf("%d claims left after the failed create", len(claims.Items))
	}
}
