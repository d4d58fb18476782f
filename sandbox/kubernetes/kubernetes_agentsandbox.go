package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Mode agent-sandbox: the kubernetes-sigs/agent-sandbox controller makes
// the pods (docs/kubernetes.md, "Modes"). Per sandbox spec this process
// keeps a SandboxTemplate (the pod podFor builds, without its name and
// the caller's labels) and a SandboxWarmPool of agent_sandbox.warm_pool
// replicas; every sandbox is a SandboxClaim on that pool. The controller
// binds the claim to a warm Sandbox (or creates one cold from the
// template), the claim turns Ready, and the backend opens the same exec
// channel into the Sandbox's pod as in mode pods. Close deletes the claim
// (and at once its Sandbox and pod). Templates, pools and claims are owned
// by the process's Lease, so Kubernetes' garbage collector removes all of
// them (and, through the controller's owner references, the Sandboxes and
// pods) when a dead process's lease is reaped.
//
// The objects are handled as unstructured through the dynamic client: the
// controller's Go module is not a dependency of this project.

// The agent-sandbox API the backend speaks (tested against the controller
// commit recorded in docs/kubernetes.md).
const (
	agentSandboxGroup    = "agents.x-k8s.io"
	agentSandboxExtGroup = "extensions.agents.x-k8s.io"
	agentSandboxVersion  = "v1beta1"
	// asPodNameAnnotation on a Sandbox names its pod when the pod was
	// adopted from a warm pool; otherwise the pod is named as the Sandbox.
	asPodNameAnnotation = "agents.x-k8s.io/pod-name"
	// asWarmPoolLabel is on the pods of a pool's unclaimed Sandboxes.
	asWarmPoolLabel = "agents.x-k8s.io/warm-pool-sandbox"
	// LabelTemplate carries the spec fingerprint on templates and pools.
	LabelTemplate = "io.rollout.sandbox.template"
)

var (
	gvrAgentSandbox = schema.GroupVersionResource{Group: agentSandboxGroup, Version: agentSandboxVersion, Resource: "sandboxes"}
	gvrSandboxClaim = schema.GroupVersionResource{Group: agentSandboxExtGroup, Version: agentSandboxVersion, Resource: "sandboxclaims"}
	gvrSandboxTmpl  = schema.GroupVersionResource{Group: agentSandboxExtGroup, Version: agentSandboxVersion, Resource: "sandboxtemplates"}
	gvrSandboxPool  = schema.GroupVersionResource{Group: agentSandboxExtGroup, Version: agentSandboxVersion, Resource: "sandboxwarmpools"}
)

// ErrNoAgentSandboxCRDs is wrapped by the error NewKubernetes returns in
// mode agent-sandbox when the cluster does not serve the CRDs.
var ErrNoAgentSandboxCRDs = errors.New("agent-sandbox CRDs not installed")

// claimRef names the agent-sandbox objects behind one sandbox pod.
type claimRef struct {
	claim   string // SandboxClaim (named as the pod podFor built)
	sandbox string // the Sandbox the controller bound to it
}

// agentSandbox is the state of mode agent-sandbox in a Kubernetes backend.
type agentSandbox struct {
	k   *Kubernetes
	dyn dynamic.Interface

	// warm is the sum of the warm pools' replicas: pods this process owns
	// that admission must count although no sandbox holds them.
	warm atomic.Int64

	mu        sync.Mutex
	templates map[string]*asTemplate // by fingerprint
	waiters   map[string]chan struct{}
	// chans are channels opened ahead into warm pods, by pod name (nil
	// once closed): a claim bound to one of them needs no exec of its own.
	chans  map[string]*warmChan
	ctx    context.Context // of the opens; cancelled by close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	informer cache.SharedIndexInformer
	informed chan struct{}
}

// asTemplate is one SandboxTemplate + SandboxWarmPool pair.
type asTemplate struct {
	name  string
	spec  sandbox.Spec  // the first sandbox spec of it (agent arguments of a warm pod's channel)
	ready chan struct{} // closed when created (or failed: err)
	err   error
}

// warmChan is a channel being opened, or open, into a warm pod.
type warmChan struct {
	tmpl  string        // the template's name
	done  chan struct{} // closed when the open ended
	s     *k8sSandbox   // set when open (and not gone)
	taken bool          // a create took it (it owns s from then on)
	gone  bool          // the pod went away before anyone took it
}

// CheckAgentSandboxCRDs reports whether the cluster serves the
// agent-sandbox CRDs this backend uses. The error wraps
// ErrNoAgentSandboxCRDs when they are missing.
func CheckAgentSandboxCRDs(rc *rest.Config) error {
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return fmt.Errorf("%w: discovery client: %v", sandbox.ErrInvalid, err)
	}
	want := map[string][]string{
		agentSandboxGroup + "/" + agentSandboxVersion:    {"sandboxes"},
		agentSandboxExtGroup + "/" + agentSandboxVersion: {"sandboxclaims", "sandboxtemplates", "sandboxwarmpools"},
	}
	var missing []string
	for gv, resources := range want {
		list, err := dc.ServerResourcesForGroupVersion(gv)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: kubernetes API discovery of %s: %v", sandbox.ErrUnavailable, gv, err)
		}
		served := map[string]bool{}
		if list != nil {
			for _, r := range list.APIResources {
				served[r.Name] = true
			}
		}
		for _, r := range resources {
			if !served[r] {
				missing = append(missing, r+"."+gv)
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %w: the API server does not serve %s (install the kubernetes-sigs/agent-sandbox controller with its extensions, docs/kubernetes.md, or use mode %q)",
			sandbox.ErrInvalid, ErrNoAgentSandboxCRDs, strings.Join(slices.Sorted(slices.Values(missing)), ", "), k8sconfig.ModePods)
	}
	return nil
}

func newAgentSandbox(k *Kubernetes) (*agentSandbox, error) {
	if err := CheckAgentSandboxCRDs(k.rest); err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(k.rest)
	if err != nil {
		return nil, fmt.Errorf("%w: dynamic client: %v", sandbox.ErrInvalid, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &agentSandbox{k: k, dyn: dyn, templates: map[string]*asTemplate{}, waiters: map[string]chan struct{}{},
		chans: map[string]*warmChan{}, ctx: ctx, cancel: cancel}, nil
}

// startInformer watches this instance's claims: a claim turning Ready
// wakes the create waiting for it.
func (a *agentSandbox) startInformer(ctx context.Context) {
	sel := sandbox.LabelInstance + "=" + a.k.opts.Instance
	f := dynamicinformer.NewFilteredDynamicInformer(a.dyn, gvrSandboxClaim, a.k.cfg.Namespace, 0, cache.Indexers{},
		func(o *metav1.ListOptions) { o.LabelSelector = sel })
	a.informer = f.Informer()
	notify := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		a.mu.Lock()
		w := a.waiters[u.GetName()]
		a.mu.Unlock()
		if w != nil {
			select {
			case w <- struct{}{}:
			default:
			}
		}
	}
	_, _ = a.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, obj any) { notify(obj) },
		DeleteFunc: notify,
	})
	a.informed = make(chan struct{})
	go func() {
		defer close(a.informed)
		a.informer.RunWithContext(ctx)
	}()
}

// ownerRefs point at the process's lease.
func (a *agentSandbox) ownerRefs() []any {
	k := a.k
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lease == nil {
		return nil
	}
	return []any{map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "name": k.lease.Name, "uid": string(k.lease.UID)}}
}

func stringMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// templateFor returns the SandboxTemplate and SandboxWarmPool for pod's
// spec, creating them on first use. The template holds everything of the
// pod except its name, owner and the per-sandbox labels (those travel on
// the claim).
func (a *agentSandbox) templateFor(ctx context.Context, sbSpec sandbox.Spec, pod *corev1.Pod, perSandbox map[string]string) (string, error) {
	spec, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&pod.Spec)
	if err != nil {
		return "", fmt.Errorf("%w: pod template: %v", sandbox.ErrInvalid, err)
	}
	labels := map[string]string{}
	for key, v := range pod.Labels {
		if _, ok := perSandbox[key]; !ok {
			labels[key] = v
		}
	}
	// The agent's arguments (user, workdir) are part of it: a channel
	// opened into a warm pod must be the one the claim's sandbox wants.
	fpData, err := json.Marshal(map[string]any{"spec": spec, "labels": labels, "agent": a.k.agentArgs(sbSpec)})
	if err != nil {
		return "", fmt.Errorf("%w: pod template: %v", sandbox.ErrInvalid, err)
	}
	sum := sha256.Sum256(fpData)
	fp := hex.EncodeToString(sum[:])[:12]

	a.mu.Lock()
	t := a.templates[fp]
	if t == nil {
		t = &asTemplate{name: "rollout-" + a.k.opts.Instance + "-" + fp, spec: sbSpec, ready: make(chan struct{})}
		a.templates[fp] = t
		a.mu.Unlock()
		labels[LabelTemplate] = fp
		t.err = a.createTemplate(ctx, t.name, fp, spec, labels)
		if t.err != nil {
			a.mu.Lock()
			delete(a.templates, fp) // the next create tries again
			a.mu.Unlock()
		}
		close(t.ready)
	} else {
		a.mu.Unlock()
		select {
		case <-t.ready:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	return t.name, t.err
}

func (a *agentSandbox) createTemplate(ctx context.Context, name, fp string, spec map[string]any, podLabels map[string]string) error {
	k := a.k
	meta := map[string]any{
		"name": name, "namespace": k.cfg.Namespace,
		"labels":          stringMap(a.objectLabels(fp)),
		"ownerReferences": a.ownerRefs(),
	}
	tmpl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": agentSandboxExtGroup + "/" + agentSandboxVersion,
		"kind":       "SandboxTemplate",
		"metadata":   meta,
		"spec": map[string]any{
			"podTemplate": map[string]any{"metadata": map[string]any{"labels": stringMap(podLabels)}, "spec": spec},
			// The backend's own deny-all NetworkPolicy selects the pods
			// of network "none" by label, as in mode pods; the
			// controller's managed policy (egress to the internet) would
			// open what the spec closed.
			"networkPolicyManagement": "Unmanaged",
		},
	}}
	if err := a.create(ctx, gvrSandboxTmpl, tmpl); err != nil {
		return fmt.Errorf("create SandboxTemplate %s: %w", name, err)
	}
	replicas := int64(k.cfg.AgentSandbox.WarmPool)
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": agentSandboxExtGroup + "/" + agentSandboxVersion,
		"kind":       "SandboxWarmPool",
		"metadata": map[string]any{
			"name": name, "namespace": k.cfg.Namespace,
			"labels":          stringMap(a.objectLabels(fp)),
			"ownerReferences": a.ownerRefs(),
		},
		"spec": map[string]any{"replicas": replicas, "sandboxTemplateRef": map[string]any{"name": name}},
	}}
	if err := a.create(ctx, gvrSandboxPool, pool); err != nil {
		return fmt.Errorf("create SandboxWarmPool %s: %w", name, err)
	}
	a.warm.Add(replicas)
	if replicas > 0 {
		k.mu.Lock()
		k.cond.Broadcast()
		k.mu.Unlock()
	}
	k.log.Debug("agent-sandbox template and warm pool created", "template", name, "warm_pool", replicas)
	return nil
}

// objectLabels go on this process's templates, pools and claims.
func (a *agentSandbox) objectLabels(fp string) map[string]string {
	l := maps.Clone(a.k.labels)
	if fp != "" {
		l[LabelTemplate] = fp
	}
	return l
}

// create creates obj, retrying transient failures; AlreadyExists after a
// retry (an earlier attempt got through) is success.
func (a *agentSandbox) create(ctx context.Context, gvr schema.GroupVersionResource, obj *unstructured.Unstructured) error {
	back := 200 * time.Millisecond
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		t := time.Now()
		_, err := a.dyn.Resource(gvr).Namespace(a.k.cfg.Namespace).Create(cctx, obj, metav1.CreateOptions{})
		sandbox.MetricDaemon.WithLabelValues(strings.TrimSuffix(gvr.Resource, "s") + "_create").Observe(time.Since(t).Seconds())
		cancel()
		switch {
		case err == nil:
			return nil
		case apierrors.IsAlreadyExists(err) && attempt > 0:
			return nil
		case apierrors.IsNotFound(err):
			return fmt.Errorf("%w: %w: %v", sandbox.ErrInvalid, ErrNoAgentSandboxCRDs, err)
		case apierrors.IsForbidden(err):
			return fmt.Errorf("%w: %v (the identity needs create/get/list/watch/delete on %s.%s, docs/kubernetes.md)", sandbox.ErrInvalid, err, gvr.Resource, gvr.Group)
		case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
			return fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
		case apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || isConnErr(err):
			if attempt >= 3 {
				return fmt.Errorf("%w: %v", sandbox.ErrUnavailable, err)
			}
		default:
			return fmt.Errorf("%w: %v", sandbox.ErrUnavailable, err)
		}
		select {
		case <-time.After(back):
		case <-ctx.Done():
			return ctx.Err()
		}
		back = min(2*back, 2*time.Second)
	}
}

// start claims a sandbox for pod (built by podFor): it makes sure the
// template and warm pool exist, creates a SandboxClaim named as the pod,
// waits for the claim to be Ready and returns the running pod the
// controller bound to it.
// wake is the create's channel for pod events of pod.Name; it also
// receives the claim's events and those of an adopted warm pod.
func (a *agentSandbox) start(ctx context.Context, pod *corev1.Pod, spec sandbox.Spec, extra map[string]string, wake chan struct{}) (*corev1.Pod, claimRef, error) {
	k := a.k
	ref := claimRef{claim: pod.Name}
	perSandbox := a.perSandboxLabels(spec, extra)
	tmpl, err := a.templateFor(ctx, spec, pod, perSandbox)
	if err != nil {
		sandbox.MetricFailures.WithLabelValues("create").Inc()
		return nil, ref, err
	}
	a.mu.Lock()
	a.waiters[ref.claim] = wake
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.waiters, ref.claim)
		a.mu.Unlock()
	}()
	// Not additionalPodMetadata for the caller's labels: the controller
	// accepts only label keys with a domain prefix from its allowlist
	// (default sandbox.users.io); the pod is labelled once bound instead.
	claimSpec := map[string]any{"warmPoolRef": map[string]any{"name": tmpl}}
	if l := spec.Limits.MaxLifetime; l > 0 {
		// The controller deletes the claim (and so the pod) even when no
		// rollout process is left.
		claimSpec["lifecycle"] = map[string]any{
			"shutdownTime":   time.Now().Add(l + time.Minute).UTC().Format(time.RFC3339),
			"shutdownPolicy": "Delete",
		}
	}
	labels := a.objectLabels("")
	maps.Copy(labels, perSandbox)
	claim := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": agentSandboxExtGroup + "/" + agentSandboxVersion,
		"kind":       "SandboxClaim",
		"metadata": map[string]any{
			"name": ref.claim, "namespace": k.cfg.Namespace,
			"labels":          stringMap(labels),
			"annotations":     stringMap(pod.Annotations),
			"ownerReferences": a.ownerRefs(),
		},
		"spec": claimSpec,
	}}
	t0 := time.Now()
	if err := a.create(ctx, gvrSandboxClaim, claim); err != nil {
		sandbox.MetricFailures.WithLabelValues("create").Inc()
		return nil, ref, fmt.Errorf("create SandboxClaim %s: %w", ref.claim, err)
	}
	t1 := time.Now()
	running, sbx, err := a.waitBound(ctx, ref.claim, wake)
	ref.sandbox = sbx
	if err != nil {
		sandbox.MetricFailures.WithLabelValues("start").Inc()
		return nil, ref, fmt.Errorf("SandboxClaim %s: %w", ref.claim, err)
	}
	t2 := time.Now()
	if err := a.labelPod(ctx, running.Name, perSandbox, pod.Annotations); err != nil {
		sandbox.MetricFailures.WithLabelValues("start").Inc()
		return nil, ref, fmt.Errorf("SandboxClaim %s: %w", ref.claim, err)
	}
	k.log.Debug("sandbox claimed", "claim", ref.claim, "sandbox", sbx, "pod", running.Name, "warm", sbx != ref.claim,
		"claim_create_ms", ms(t1.Sub(t0)), "bound_ms", ms(t2.Sub(t1)), "label_ms", ms(time.Since(t2)))
	return running, ref, nil
}

// labelPod gives a bound pod the sandbox's own labels and annotations (the
// run's and rollout's, as in mode pods). The controller leaves keys it did
// not propagate itself alone.
func (a *agentSandbox) labelPod(ctx context.Context, pod string, labels, annotations map[string]string) error {
	if len(labels) == 0 && len(annotations) == 0 {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels, "annotations": annotations}})
	if err != nil {
		return fmt.Errorf("%w: label pod %s: %v", sandbox.ErrInvalid, pod, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t := time.Now()
	_, err = a.k.cs.core.Pods(a.k.cfg.Namespace).Patch(cctx, pod, types.MergePatchType, patch, metav1.PatchOptions{})
	sandbox.MetricDaemon.WithLabelValues("pod_patch").Observe(time.Since(t).Seconds())
	if err != nil {
		return fmt.Errorf("%w: label pod %s: %v", sandbox.ErrUnavailable, pod, err)
	}
	return nil
}

// perSandboxLabels are the pod labels podFor took from the caller's
// labels (run, rollout) and extra (the client-side pool's): they go on the
// claim, not on the template shared by every sandbox of the spec.
func (a *agentSandbox) perSandboxLabels(spec sandbox.Spec, extra map[string]string) map[string]string {
	out := maps.Clone(extra)
	if out == nil {
		out = map[string]string{}
	}
	for key, v := range spec.Labels {
		if len(validation.IsQualifiedName(key)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			out[key] = v
		}
	}
	return out
}

// claimState reads what waitBound needs from a claim.
func claimState(u *unstructured.Unstructured) (ready bool, reason, message, sandbox string) {
	sandbox, _, _ = unstructured.NestedString(u.Object, "status", "sandbox", "name")
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || m["type"] != "Ready" {
			continue
		}
		reason, _ = m["reason"].(string)
		message, _ = m["message"].(string)
		return m["status"] == "True", reason, message, sandbox
	}
	return false, "", "", sandbox
}

// Claim Ready=False reasons that no retry of the controller will change.
var claimFatal = map[string]bool{
	"InvalidMetadata":           true,
	"EnvVarsInjectionRejected":  true,
	"VolumeClaimTemplatesError": true,
	"ClaimExpired":              true,
}

// waitBound waits until the claim is Ready and its pod runs; it returns the
// pod and the Sandbox's name. Errors are classified as in mode pods (a
// missing image is ErrInvalid, a timeout ErrUnavailable with the claim's
// last condition).
func (a *agentSandbox) waitBound(ctx context.Context, name string, wake chan struct{}) (*corev1.Pod, string, error) {
	k := a.k
	deadline := time.NewTimer(k.cfg.StartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Second) // the claim watch is the fast path
	defer tick.Stop()
	key := k.cfg.Namespace + "/" + name
	last := "no status from the agent-sandbox controller yet (is it running? docs/kubernetes.md)"
	sbx, podName := "", ""
	for {
		obj, ok, _ := a.informer.GetStore().GetByKey(key)
		if ok {
			u := obj.(*unstructured.Unstructured)
			ready, reason, msg, bound := claimState(u)
			if bound != "" {
				sbx = bound
			}
			if reason != "" {
				last = "Ready=False " + reason
				if msg != "" {
					last += ": " + msg
				}
			}
			if claimFatal[reason] {
				return nil, sbx, fmt.Errorf("%w: %s", sandbox.ErrInvalid, last)
			}
			// A cold Sandbox's pod is named as the claim: its waiting
			// reasons (a missing image, unschedulable) are the useful ones.
			pn := name
			if ready && sbx != "" {
				if podName == "" {
					var err error
					if podName, err = a.podOf(ctx, sbx); err != nil {
						return nil, sbx, err
					}
					if podName != name {
						k.mu.Lock()
						k.waiters[podName] = wake
						k.mu.Unlock()
						defer func() {
							k.mu.Lock()
							delete(k.waiters, podName)
							k.mu.Unlock()
						}()
						continue // the pod may have changed meanwhile
					}
				}
				pn = podName
			}
			if pobj, ok, _ := k.informer.GetStore().GetByKey(k.cfg.Namespace + "/" + pn); ok {
				pod := pobj.(*corev1.Pod)
				done, err := podStarting(pod)
				if err != nil {
					return nil, sbx, err
				}
				if ready && done {
					return pod, sbx, nil
				}
				if !ready {
					last += "; pod " + describeWaiting(pod)
				}
			}
		}
		select {
		case <-wake:
		case <-tick.C:
		case <-deadline.C:
			return nil, sbx, fmt.Errorf("%w: not Ready after %s (%s)", sandbox.ErrUnavailable, k.cfg.StartTimeout, last)
		case <-ctx.Done():
			return nil, sbx, ctx.Err()
		}
	}
}

// podOf is the pod of a Sandbox: named in its pod-name annotation when
// adopted from a warm pool, else named as the Sandbox.
func (a *agentSandbox) podOf(ctx context.Context, sbName string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t := time.Now()
	sb, err := a.dyn.Resource(gvrAgentSandbox).Namespace(a.k.cfg.Namespace).Get(cctx, sbName, metav1.GetOptions{})
	sandbox.MetricDaemon.WithLabelValues("sandbox_get").Observe(time.Since(t).Seconds())
	if err != nil {
		return "", fmt.Errorf("%w: get Sandbox %s: %v", sandbox.ErrUnavailable, sbName, err)
	}
	if p := sb.GetAnnotations()[asPodNameAnnotation]; p != "" {
		return p, nil
	}
	return sbName, nil
}

// release deletes a sandbox's claim, then its Sandbox and pod at once
// (the garbage collector would, a little later): the claim first, so that
// the controller does not make a new Sandbox for it.
func (a *agentSandbox) Release(ctx context.Context, ref claimRef, pod string) error {
	bg := metav1.DeletePropagationBackground
	var errs []error
	del := func(gvr schema.GroupVersionResource, name string) {
		if name == "" {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		t := time.Now()
		err := a.dyn.Resource(gvr).Namespace(a.k.cfg.Namespace).Delete(cctx, name, metav1.DeleteOptions{PropagationPolicy: &bg})
		sandbox.MetricDaemon.WithLabelValues(strings.TrimSuffix(gvr.Resource, "s") + "_delete").Observe(time.Since(t).Seconds())
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s %s: %w: %v", gvr.Resource, name, sandbox.ErrUnavailable, err))
		}
	}
	del(gvrSandboxClaim, ref.claim)
	del(gvrAgentSandbox, ref.sandbox)
	if pod != "" {
		if err := a.k.deletePod(ctx, pod); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		sandbox.MetricFailures.WithLabelValues("remove").Inc()
	}
	return errors.Join(errs...)
}

// close deletes this process's warm pools and templates (the garbage
// collector then removes the warm Sandboxes and pods) and the channels
// opened into warm pods. Claims of live sandboxes were released before.
func (a *agentSandbox) close(ctx context.Context) error {
	a.mu.Lock()
	chans := a.chans
	a.chans = nil
	a.mu.Unlock()
	a.cancel()
	a.wg.Wait()
	for _, c := range chans {
		if c.s != nil && !c.taken {
			c.s.stopStream()
		}
	}
	bg := metav1.DeletePropagationBackground
	sel := sandbox.LabelInstance + "=" + a.k.opts.Instance
	var errs []error
	for _, gvr := range []schema.GroupVersionResource{gvrSandboxPool, gvrSandboxTmpl} {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err := a.dyn.Resource(gvr).Namespace(a.k.cfg.Namespace).DeleteCollection(cctx,
			metav1.DeleteOptions{PropagationPolicy: &bg}, metav1.ListOptions{LabelSelector: sel})
		cancel()
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s: %w", gvr.Resource, err))
		}
	}
	a.warm.Store(0)
	return errors.Join(errs...)
}

// wait waits for the claim watch to stop (after the backend's context was
// cancelled).
func (a *agentSandbox) Wait() {
	if a.informed != nil {
		<-a.informed
	}
}

// ownedByAgentSandbox reports whether the controller manages pod (it is
// owned by a Sandbox): the reaper leaves such pods to their owners — a
// warm pod is tracked by no sandbox of this process, and deleting a bound
// one would only make the controller start another.
func ownedByAgentSandbox(pod *corev1.Pod) bool {
	for _, o := range pod.OwnerReferences {
		if o.Kind == "Sandbox" && strings.HasPrefix(o.APIVersion, agentSandboxGroup+"/") {
			return true
		}
	}
	return false
}

// reapLeaked deletes claims of this process that no sandbox and no create
// in flight holds (a create whose answer was lost) once older than a
// minute, like the pods of mode pods.
func (a *agentSandbox) reapLeaked(ctx context.Context) ([]sandbox.Reaped, error) {
	if a.informer == nil { // the start-up reap runs before the watch
		return nil, nil
	}
	k := a.k
	held := map[string]bool{}
	k.mu.Lock()
	for _, s := range k.live {
		if s.claim != nil {
			held[s.claim.claim] = true
		}
	}
	for n := range k.waiters { // creates in flight, keyed by claim name
		held[n] = true
	}
	k.mu.Unlock()
	a.mu.Lock()
	for n := range a.waiters {
		held[n] = true
	}
	a.mu.Unlock()
	var out []sandbox.Reaped
	for _, obj := range a.informer.GetStore().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || held[u.GetName()] || u.GetDeletionTimestamp() != nil || time.Since(u.GetCreationTimestamp().Time) < time.Minute {
			continue
		}
		_, _, _, sbx := claimState(u)
		if err := a.Release(ctx, claimRef{claim: u.GetName(), sandbox: sbx}, ""); err != nil {
			return out, err
		}
		sandbox.MetricReaped.WithLabelValues("leaked").Inc()
		out = append(out, sandbox.Reaped{ID: string(u.GetUID()), Name: "sandboxclaim/" + u.GetName(), Instance: k.opts.Instance, Reason: "leaked"})
	}
	return out, nil
}

// WarmAgentSandbox creates the SandboxTemplate and SandboxWarmPool of spec
// if needed and waits until the pool holds at least n ready sandboxes with
// a channel open into each (mode agent-sandbox; benchmarks and tests, so
// that a claim measured next is a warm one).
func (k *Kubernetes) WarmAgentSandbox(ctx context.Context, spec sandbox.Spec, n int) error {
	if k.crd == nil {
		return fmt.Errorf("%w: the backend is not in mode %q", sandbox.ErrInvalid, k8sconfig.ModeAgentSandbox)
	}
	if n > k.cfg.AgentSandbox.WarmPool {
		return fmt.Errorf("%w: %d ready wanted, the warm pool holds %d", sandbox.ErrInvalid, n, k.cfg.AgentSandbox.WarmPool)
	}
	spec.Labels = maps.Clone(spec.Labels)
	spec.Env = maps.Clone(spec.Env)
	if err := k.Validate(&spec); err != nil {
		return fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	pod := k.podFor(spec, nil)
	tmpl, err := k.crd.templateFor(ctx, spec, pod, k.crd.perSandboxLabels(spec, nil))
	if err != nil {
		return err
	}
	for {
		u, err := k.crd.dyn.Resource(gvrSandboxPool).Namespace(k.cfg.Namespace).Get(ctx, tmpl, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("%w: get SandboxWarmPool %s: %v", sandbox.ErrUnavailable, tmpl, err)
		}
		ready, _, _ := unstructured.NestedInt64(u.Object, "status", "readyReplicas")
		if ready >= int64(n) && k.crd.openChannels(tmpl) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("SandboxWarmPool %s: %d of %d ready: %w", tmpl, ready, n, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// podChanged opens a channel into every warm pod of this process's pools
// as soon as it runs (the agent exec'd and handshaken, as for a sandbox),
// and closes it when the pod goes away unclaimed. Called from the pod
// informer's handler: it never blocks.
func (a *agentSandbox) podChanged(name string, pod *corev1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.chans == nil {
		return // closed
	}
	c := a.chans[name]
	if pod == nil || podLost(pod) != "" {
		if c != nil && !c.taken {
			delete(a.chans, name)
			c.gone = true
			if c.s != nil {
				s := c.s
				a.wg.Go(s.stopStream)
			}
		}
		return
	}
	if c != nil {
		return
	}
	// Only pods of a pool's unclaimed Sandboxes; once claimed the label
	// goes, but an open channel stays for the create that takes it.
	if _, warm := pod.Labels[asWarmPoolLabel]; !warm {
		return
	}
	var t *asTemplate
	if t = a.templates[pod.Labels[LabelTemplate]]; t == nil {
		return
	}
	if done, err := podStarting(pod); err != nil || !done {
		return
	}
	c = &warmChan{tmpl: t.name, done: make(chan struct{})}
	a.chans[name] = c
	node, spec := pod.Spec.NodeName, t.spec
	a.wg.Go(func() { a.Open(c, name, node, spec) })
}

// open execs the agent into a warm pod.
func (a *agentSandbox) Open(c *warmChan, name, node string, spec sandbox.Spec) {
	s := &k8sSandbox{k: a.k, name: name, node: node, spec: spec, log: a.k.log.With("pod", name), stderr: sandbox.NewTailBuffer(8 << 10)}
	s.Bind(name, s.broken)
	err := s.connect(a.ctx)
	a.mu.Lock()
	stop := false
	switch {
	case err != nil:
		if !c.taken && a.chans != nil && a.chans[name] == c {
			delete(a.chans, name) // the pod's next event tries again
		}
		a.k.log.Debug("channel into a warm pod failed", "pod", name, "err", err)
	case c.gone:
		stop = true
	default:
		c.s = s
	}
	close(c.done)
	a.mu.Unlock()
	if stop {
		s.stopStream()
	}
}

// takeChannel hands the channel opened into the warm pod name to the
// create that claimed it (waiting for an open under way), or nil.
func (a *agentSandbox) takeChannel(ctx context.Context, name string) *k8sSandbox {
	a.mu.Lock()
	c := a.chans[name]
	if c == nil {
		a.mu.Unlock()
		return nil
	}
	c.taken = true
	delete(a.chans, name)
	a.mu.Unlock()
	t := time.Now()
	select {
	case <-c.done:
		if c.s != nil && c.s.Conn.Broken() != nil {
			c.s.stopStream()
			return nil
		}
		a.k.log.Debug("channel opened ahead into the warm pod taken", "pod", name, "ok", c.s != nil, "waited_ms", ms(time.Since(t)))
		return c.s
	case <-ctx.Done():
		a.wg.Go(func() {
			<-c.done
			if c.s != nil {
				c.s.stopStream()
			}
		})
		return nil
	}
}

// openChannels counts the channels open into warm pods of template tmpl.
func (a *agentSandbox) openChannels(tmpl string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.chans {
		if c.tmpl == tmpl && c.s != nil && !c.taken {
			n++
		}
	}
	return n
}
