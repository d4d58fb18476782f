package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/scheme"
	coordv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	netv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/klog/v2"

	"github.com/rollout-rl/rollout/internal/util/imageref"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/agent"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
)

// Labels and names of the Kubernetes backend's objects (besides the
// Docker backend's LabelManaged, LabelInstance, LabelHost, LabelPID and
// LabelPool, which pods carry too).
const (
	// LabelNetwork is "none" on pods the deny-all NetworkPolicy selects.
	LabelNetwork = "io.rollout.sandbox.network"
	// NetworkPolicyName is the deny-all policy created in the namespace.
	NetworkPolicyName = "rollout-sandbox-deny-all"
	// leaseDuration: a lease not renewed for this long belongs to a dead
	// process; Reap deletes it and Kubernetes' garbage collector its pods.
	k8sLeaseDuration = 30 * time.Second
	k8sAgentDir      = "/.rollout"
	ContainerName    = "sandbox"
)

// KubernetesOptions configure a Kubernetes backend.
type Options struct {
	Config   k8sconfig.Config
	Instance string               // default random
	Agent    *sandbox.AgentBinary // default ResolveAgent()
	Logger   *slog.Logger
	// ReapInterval of the lease renewal's reaper (default 10s; < 0
	// disables the start-up and periodic reaps).
	ReapInterval time.Duration
	// REST overrides Config's client resolution (tests).
	REST *rest.Config
}

// Kubernetes creates sandboxes as pods: one pod per sandbox, the agent
// exec'd into it over one persistent stream through the API server
// (docs/kubernetes.md). It implements Backend and feeds a Pool.
type Kubernetes struct {
	cfg    k8sconfig.Config
	opts   Options
	rest   *rest.Config
	cs     *kubeClients
	log    *slog.Logger
	agent  sandbox.AgentBinary
	agentI string
	labels map[string]string
	gate   *sandbox.CreateGate
	rate   *sandbox.RateLimiter
	lease  *coordv1.Lease
	// slots: the pool's slot, held only across a create (see slotSem).
	slots *sandbox.SlotSem

	informed chan struct{} // closed when the pod informer stopped
	informer cache.SharedIndexInformer
	// crd is set in mode agent-sandbox (kubernetes_agentsandbox.go).
	crd *agentSandbox

	mu       sync.Mutex
	cond     *sync.Cond // signalled when live shrinks or capacity changes
	live     map[string]*k8sSandbox
	pending  int // creates holding a slot but not yet live
	capacity int // pods the eligible nodes can hold (0 = unknown yet)
	waiters  map[string]chan struct{}
	closed   bool

	stop context.CancelFunc
	bg   sync.WaitGroup
}

var _ sandbox.Backend = (*Kubernetes)(nil)

// NewKubernetes connects to the cluster, checks the namespace, creates the
// process's owner lease and the deny-all NetworkPolicy, reaps pods of dead
// processes and starts watching this process's pods.
func New(ctx context.Context, opts Options) (*Kubernetes, error) {
	cfg := opts.Config
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	if opts.Instance == "" {
		opts.Instance = sandbox.RandomID(8)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ReapInterval == 0 {
		opts.ReapInterval = 10 * time.Second
	}
	rc := opts.REST
	if rc == nil {
		var err error
		if rc, err = RESTConfig(&cfg); err != nil {
			return nil, fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
		}
	}
	cs, err := newKubeClients(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: kubernetes client: %v", sandbox.ErrInvalid, err)
	}
	var ab sandbox.AgentBinary
	if opts.Agent != nil {
		ab = *opts.Agent
	} else if ab, err = sandbox.ResolveAgent(); err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	agentImage := cfg.AgentImage
	if agentImage == "" {
		if agentImage, err = k8sconfig.AgentImageRef(ab); err != nil {
			return nil, fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
		}
	}
	host, _ := os.Hostname()
	k := &Kubernetes{
		cfg: cfg, opts: opts, rest: rc, cs: cs, slots: sandbox.NewSlotSem(math.MaxInt32),
		log:    opts.Logger.With("sandbox_instance", opts.Instance, "namespace", cfg.Namespace),
		agent:  ab,
		agentI: imageref.InRegistry(cfg.ImageRegistry, agentImage),
		labels: map[string]string{
			sandbox.LabelManaged:  "true",
			sandbox.LabelInstance: opts.Instance,
			sandbox.LabelHost:     labelValue(host),
			sandbox.LabelPID:      strconv.Itoa(os.Getpid()),
		},
		gate:    sandbox.NewCreateGate(cfg.MaxParallelCreates, 10*time.Second),
		rate:    sandbox.NewRateLimiter(100, cfg.MaxParallelCreates),
		live:    map[string]*k8sSandbox{},
		waiters: map[string]chan struct{}{},
	}
	k.cond = sync.NewCond(&k.mu)
	quietClientGo(opts.Logger)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cs.core.Namespaces().Get(cctx, cfg.Namespace, metav1.GetOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: namespace %q does not exist (create it first, docs/kubernetes.md)", sandbox.ErrInvalid, cfg.Namespace)
		}
		if !apierrors.IsForbidden(err) { // a namespaced service account may not read namespaces
			return nil, fmt.Errorf("%w: kubernetes API: %v", sandbox.ErrUnavailable, err)
		}
	}
	if cfg.Mode == k8sconfig.ModeAgentSandbox {
		if k.crd, err = newAgentSandbox(k); err != nil {
			return nil, err
		}
	}
	if !cfg.NoNetworkPolicy {
		if err := k.ensureNetworkPolicy(cctx); err != nil {
			return nil, err
		}
	}
	if err := k.createLease(cctx); err != nil {
		return nil, err
	}
	if opts.ReapInterval > 0 {
		if _, err := k.Reap(cctx, sandbox.ReapOptions{}); err != nil {
			k.log.Warn("start-up reap failed", "err", err)
		}
	}
	bctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	k.stop = stop
	k.startInformer(bctx)
	synced := []cache.InformerSynced{k.informer.HasSynced}
	if k.crd != nil {
		k.crd.startInformer(bctx)
		synced = append(synced, k.crd.informer.HasSynced)
	}
	k.bg.Go(func() { k.background(bctx) })
	if !cache.WaitForCacheSync(cctx.Done(), synced...) {
		_ = k.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("%w: pod watch did not sync", sandbox.ErrUnavailable)
	}
	k.refreshCapacity(cctx)
	return k, nil
}

// Instance is the id in the instance label of this backend's pods.
func (k *Kubernetes) Instance() string { return k.opts.Instance }

// Namespace is where the pods live.
func (k *Kubernetes) Namespace() string { return k.cfg.Namespace }

// CoreV1 exposes the core API client (benchmarks, tests, the CLI).
func (k *Kubernetes) CoreV1() corev1client.CoreV1Interface { return k.cs.core }

// kubeClients are the three API groups the backend uses. Not the whole
// clientset: it would link every group's client into the binary.
type kubeClients struct {
	core  corev1client.CoreV1Interface
	coord coordv1client.CoordinationV1Interface
	net   netv1client.NetworkingV1Interface
}

func newKubeClients(rc *rest.Config) (*kubeClients, error) {
	core, err := corev1client.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	coord, err := coordv1client.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	net, err := netv1client.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &kubeClients{core: core, coord: coord, net: net}, nil
}

// RESTConfig exposes the client configuration (benchmarks).
func (k *Kubernetes) RESTConfig() *rest.Config { return k.rest }

// Config is the backend's configuration, defaults applied.
func (k *Kubernetes) Config() k8sconfig.Config { return k.cfg }

// Capacity is the number of pods admission currently allows at once:
// min(MaxPods, what the eligible Ready nodes can hold).
func (k *Kubernetes) Capacity() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.limitLocked()
}

func (k *Kubernetes) Logger() *slog.Logger { return k.log }

func (k *Kubernetes) Validate(spec *sandbox.Spec) error {
	return sandbox.ValidateSpec(spec)
}

func (k *Kubernetes) ensureNetworkPolicy(ctx context.Context) error {
	np := &netv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: NetworkPolicyName, Labels: map[string]string{sandbox.LabelManaged: "true"}},
		Spec: netv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{sandbox.LabelManaged: "true", LabelNetwork: sandbox.NetworkNone}},
			PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress, netv1.PolicyTypeEgress},
		},
	}
	_, err := k.cs.net.NetworkPolicies(k.cfg.Namespace).Create(ctx, np, metav1.CreateOptions{})
	if err == nil || apierrors.IsAlreadyExists(err) {
		return nil
	}
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("%w: create NetworkPolicy %s in %s: %v (grant networkpolicies create, or set sandbox.kubernetes.no_network_policy)", sandbox.ErrInvalid, NetworkPolicyName, k.cfg.Namespace, err)
	}
	return fmt.Errorf("%w: create NetworkPolicy: %v", sandbox.ErrUnavailable, err)
}

// createLease makes the owner of every pod of this process. The process
// renews it; a lease left unrenewed is deleted by any instance's reaper (or
// `rollout sandbox gc`), and Kubernetes' garbage collector then deletes
// its pods.
func (k *Kubernetes) createLease(ctx context.Context) error {
	d := int32(k8sLeaseDuration / time.Second)
	now := metav1.NewMicroTime(time.Now())
	holder := k.labels[sandbox.LabelHost] + "/" + k.labels[sandbox.LabelPID]
	l := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "rollout-" + k.opts.Instance, Labels: maps.Clone(k.labels)},
		Spec:       coordv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &d, AcquireTime: &now, RenewTime: &now},
	}
	got, err := k.cs.coord.Leases(k.cfg.Namespace).Create(ctx, l, metav1.CreateOptions{})
	if err != nil {
		if apierrors.IsForbidden(err) {
			return fmt.Errorf("%w: create owner lease: %v (the service account needs leases create/update/delete, docs/kubernetes.md)", sandbox.ErrInvalid, err)
		}
		return fmt.Errorf("%w: create owner lease: %v", sandbox.ErrUnavailable, err)
	}
	k.lease = got
	return nil
}

func (k *Kubernetes) renewLease(ctx context.Context) {
	k.mu.Lock()
	l := k.lease.DeepCopy()
	k.mu.Unlock()
	now := metav1.NewMicroTime(time.Now())
	l.Spec.RenewTime = &now
	got, err := k.cs.coord.Leases(k.cfg.Namespace).Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		k.log.Warn("owner lease renewal failed", "err", err)
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			if cur, gerr := k.cs.coord.Leases(k.cfg.Namespace).Get(ctx, l.Name, metav1.GetOptions{}); gerr == nil {
				k.mu.Lock()
				k.lease = cur
				k.mu.Unlock()
			}
		}
		return
	}
	k.mu.Lock()
	k.lease = got
	k.mu.Unlock()
}

func (k *Kubernetes) startInformer(ctx context.Context) {
	sel := sandbox.LabelInstance + "=" + k.opts.Instance
	// One informer on this instance's pods (not an informer factory: it
	// would link every API group's informers into the binary).
	lw := cache.NewFilteredListWatchFromClient(k.cs.core.RESTClient(), "pods", k.cfg.Namespace,
		func(o *metav1.ListOptions) { o.LabelSelector = sel })
	k.informer = cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	notify := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			if t, ok2 := obj.(cache.DeletedFinalStateUnknown); ok2 {
				pod, _ = t.Obj.(*corev1.Pod)
			}
		}
		if pod == nil {
			return
		}
		k.podChanged(pod.Name, pod)
	}
	_, _ = k.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, obj any) { notify(obj) },
		DeleteFunc: func(obj any) {
			pod, _ := obj.(*corev1.Pod)
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				pod, _ = t.Obj.(*corev1.Pod)
			}
			if pod != nil {
				k.podChanged(pod.Name, nil)
			}
		},
	})
	k.informed = make(chan struct{})
	go func() {
		defer close(k.informed)
		k.informer.RunWithContext(ctx)
	}()
}

// podChanged wakes a create waiting for the pod and breaks the channel of
// a live sandbox whose pod failed, lost its node or was deleted.
func (k *Kubernetes) podChanged(name string, pod *corev1.Pod) {
	if k.crd != nil {
		k.crd.podChanged(name, pod) // channels into warm pods
	}
	k.mu.Lock()
	w := k.waiters[name]
	s := k.live[name]
	k.mu.Unlock()
	if w != nil {
		select {
		case w <- struct{}{}:
		default:
		}
	}
	if s == nil || s.Closing.Load() {
		return
	}
	if why := s.podLost(pod); why != "" {
		s.fail(why)
	}
}

// podLost says why a started sandbox pod can no longer serve, or "". A
// pod that was Ready and is no longer (the node lifecycle controller marks
// the pods of a node that stopped reporting NotReady) counts as lost.
func (s *k8sSandbox) podLost(pod *corev1.Pod) string {
	if why := podLost(pod); why != "" {
		return why
	}
	for _, c := range pod.Status.Conditions {
		if c.Type != corev1.PodReady {
			continue
		}
		if c.Status == corev1.ConditionTrue {
			s.seenReady.Store(true)
		} else if s.seenReady.Load() {
			why := fmt.Sprintf("pod no longer ready on node %s (node lost or container stopped)", pod.Spec.NodeName)
			if r := strings.TrimSpace(c.Reason + " " + c.Message); r != "" {
				why += ": " + r
			}
			return why
		}
	}
	return ""
}

// podLost says why a started sandbox pod can no longer serve, or "".
func podLost(pod *corev1.Pod) string {
	if pod == nil {
		return "pod was deleted"
	}
	if pod.DeletionTimestamp != nil {
		return "pod is being deleted"
	}
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		return podFailure(pod)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == ContainerName && cs.State.Terminated != nil {
			return podFailure(pod)
		}
	}
	return ""
}

// podFailure describes a finished pod: evicted, OOM-killed, deadline, exit.
func podFailure(pod *corev1.Pod) string {
	parts := []string{"pod " + strings.ToLower(string(pod.Status.Phase))}
	if pod.Status.Reason != "" {
		parts = append(parts, "reason "+pod.Status.Reason) // Evicted, DeadlineExceeded, NodeLost
	}
	if pod.Status.Message != "" {
		parts = append(parts, pod.Status.Message)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			s := fmt.Sprintf("container %s exited %d", cs.Name, t.ExitCode)
			if t.Reason != "" {
				s += " (" + t.Reason + ")" // OOMKilled, Error
			}
			parts = append(parts, s)
		}
	}
	if pod.Spec.NodeName != "" {
		parts = append(parts, "node "+pod.Spec.NodeName)
	}
	return strings.Join(parts, ", ")
}

func (k *Kubernetes) background(ctx context.Context) {
	renew := time.NewTicker(k8sLeaseDuration / 3)
	defer renew.Stop()
	capT := time.NewTicker(10 * time.Second)
	defer capT.Stop()
	reapEvery := k.opts.ReapInterval
	if reapEvery <= 0 {
		reapEvery = time.Hour
	}
	reap := time.NewTicker(reapEvery)
	defer reap.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			k.renewLease(rctx)
			cancel()
		case <-capT.C:
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			k.refreshCapacity(rctx)
			cancel()
		case <-reap.C:
			if k.opts.ReapInterval > 0 {
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				if _, err := k.Reap(rctx, sandbox.ReapOptions{}); err != nil {
					k.log.Warn("reap failed", "err", err)
				}
				cancel()
			}
			k.enforceLimits(ctx)
		}
	}
}

// refreshCapacity recomputes how many sandbox pods the eligible nodes can
// hold: for each Ready, schedulable node matching the node selector,
// min(allocatable pods, allocatable cpu / cpu request, allocatable memory /
// memory request), minus the pods of other owners already there.
func (k *Kubernetes) refreshCapacity(ctx context.Context) {
	nodes, err := k.cs.core.Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		if !apierrors.IsForbidden(err) {
			k.log.Debug("list nodes for admission failed", "err", err)
		}
		return // keep the last estimate; MaxPods still applies
	}
	cpuReq := k.cfg.CPURequest
	memReq := float64(k.cfg.MemoryRequestMB << 20)
	total := 0
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Spec.Unschedulable || !nodeReady(n) || !matches(n.Labels, k.cfg.NodeSelector) {
			continue
		}
		a := n.Status.Allocatable
		c := a.Pods().Value()
		if cpu := a.Cpu().AsApproximateFloat64() / cpuReq; cpu < float64(c) {
			c = int64(cpu)
		}
		if mem := a.Memory().AsApproximateFloat64() / memReq; mem < float64(c) {
			c = int64(mem)
		}
		total += int(c)
	}
	// Pods of other owners on those nodes take room too.
	if pods, err := k.cs.core.Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Running"}); err == nil {
		for i := range pods.Items {
			if pods.Items[i].Labels[sandbox.LabelInstance] != k.opts.Instance {
				total--
			}
		}
	}
	k.mu.Lock()
	k.capacity = max(total, 1)
	k.cond.Broadcast()
	k.mu.Unlock()
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func matches(labels, sel map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func (k *Kubernetes) limitLocked() int {
	l := k.cfg.MaxPods
	if k.capacity > 0 {
		l = min(k.cfg.MaxPods, k.capacity)
	}
	if k.crd != nil { // the server-side warm pools' pods
		l = max(l-int(k.crd.warm.Load()), 1)
	}
	return l
}

// admit takes a pod slot: it waits while this process's pods (live and
// being created) fill what the nodes can hold, so pods are not created to
// wait in Pending. block=false fails at once (pool fillers).
func (k *Kubernetes) admit(ctx context.Context, block bool) error {
	stop := context.AfterFunc(ctx, func() {
		k.mu.Lock()
		k.cond.Broadcast()
		k.mu.Unlock()
	})
	defer stop()
	k.mu.Lock()
	defer k.mu.Unlock()
	for {
		if k.closed {
			return fmt.Errorf("%w: backend closed", sandbox.ErrClosed)
		}
		if len(k.live)+k.pending < k.limitLocked() {
			k.pending++
			return nil
		}
		if !block {
			return fmt.Errorf("%w: all %d pod slots in use", sandbox.ErrUnavailable, k.limitLocked())
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("waiting for a free pod slot (%d in use): %w", len(k.live)+k.pending, err)
		}
		k.cond.Wait()
	}
}

// Create starts a sandbox pod for spec (Backend).
func (k *Kubernetes) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	start := time.Now()
	s, err := k.create(ctx, spec, nil, true)
	if err != nil {
		return nil, err
	}
	sandbox.MetricAcquire.WithLabelValues("create").Observe(time.Since(start).Seconds())
	return s, nil
}

// slotSem: the Kubernetes backend bounds its pods by its own admission
// (max_pods, the nodes' allocatable resources, the namespace quota), so the
// pool's slot is only held for the create call (createWarm gives it back).
func (k *Kubernetes) SlotSem() *sandbox.SlotSem { return k.slots }

func (k *Kubernetes) CreateWarm(ctx context.Context, spec sandbox.Spec, extra map[string]string, slot sandbox.SlotMode, block bool) (sandbox.Warmable, error) {
	if slot == sandbox.SlotHeld {
		defer k.slots.Release()
	} else if err := k.slots.Acquire(ctx); err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	} else {
		defer k.slots.Release()
	}
	s, err := k.create(ctx, spec, extra, block)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (k *Kubernetes) create(ctx context.Context, spec sandbox.Spec, extra map[string]string, block bool) (_ *k8sSandbox, err error) {
	spec.Labels = maps.Clone(spec.Labels)
	spec.Env = maps.Clone(spec.Env)
	if err := k.Validate(&spec); err != nil {
		return nil, fmt.Errorf("create sandbox: %w: %v", sandbox.ErrInvalid, err)
	}
	if err := k.admit(ctx, block); err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	admitted := true
	defer func() {
		if admitted {
			k.mu.Lock()
			k.pending--
			k.cond.Broadcast()
			k.mu.Unlock()
		}
	}()
	if err := k.rate.Wait(ctx); err != nil {
		return nil, fmt.Errorf("create sandbox: waiting for the create rate limit: %w", err)
	}
	if err := k.gate.Acquire(ctx); err != nil {
		return nil, fmt.Errorf("create sandbox: waiting for a create turn: %w", err)
	}
	gateStart := time.Now()
	defer func() { k.gate.Release(time.Since(gateStart), err == nil) }()

	pod := k.podFor(spec, extra)
	name := pod.Name
	wake := make(chan struct{}, 1)
	k.mu.Lock()
	k.waiters[name] = wake
	k.mu.Unlock()
	defer func(name string) {
		k.mu.Lock()
		delete(k.waiters, name)
		k.mu.Unlock()
	}(name)
	log := k.log.With("pod", name)
	var ref *claimRef // mode agent-sandbox
	// From here every failure deletes the pod (also when the create's
	// answer was lost: deleting a missing pod is fine).
	defer func() {
		if err != nil {
			_ = k.remove(context.WithoutCancel(ctx), name, ref)
		}
	}()
	var running *corev1.Pod
	if k.crd != nil {
		var r claimRef
		running, r, err = k.crd.start(ctx, pod, spec, extra, wake)
		ref = &r
		if err != nil {
			return nil, fmt.Errorf("create sandbox from %s: %w", spec.Image, err)
		}
		name = running.Name
		log = k.log.With("pod", name, "claim", r.claim)
	} else {
		if err := k.createPod(ctx, pod); err != nil {
			sandbox.MetricFailures.WithLabelValues("create").Inc()
			return nil, fmt.Errorf("create sandbox from %s: %w", spec.Image, err)
		}
		if running, err = k.waitRunning(ctx, name, wake); err != nil {
			sandbox.MetricFailures.WithLabelValues("start").Inc()
			return nil, fmt.Errorf("create sandbox %s from %s: %w", name, spec.Image, err)
		}
	}
	var s *k8sSandbox
	if k.crd != nil { // a channel already open into the adopted warm pod
		s = k.crd.takeChannel(ctx, name)
	}
	if s != nil {
		s.claim, s.spec, s.node, s.created, s.log = ref, spec, running.Spec.NodeName, time.Now(), log
	} else {
		s = &k8sSandbox{k: k, name: name, claim: ref, spec: spec, node: running.Spec.NodeName, created: time.Now(), log: log, stderr: sandbox.NewTailBuffer(8 << 10)}
	}
	for _, cs := range running.Status.ContainerStatuses {
		if cs.Name == ContainerName {
			s.imageID = cs.ImageID
		}
	}
	s.Touch()
	if s.Conn == nil {
		if err := s.connect(ctx); err != nil {
			sandbox.MetricFailures.WithLabelValues("handshake").Inc()
			return nil, fmt.Errorf("create sandbox %s: %w", name, err)
		}
	}
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		s.stopStream()
		return nil, fmt.Errorf("create sandbox: %w: backend closed", sandbox.ErrClosed)
	}
	k.live[name] = s
	k.pending--
	admitted = false
	sandbox.MetricLive.Set(float64(len(k.live)))
	k.mu.Unlock()
	sandbox.MetricCreates.Inc()
	// The pod may have been lost while the channel was being opened.
	if obj, ok, _ := k.informer.GetStore().GetByKey(k.cfg.Namespace + "/" + name); ok {
		if why := s.podLost(obj.(*corev1.Pod)); why != "" {
			s.fail(why)
		}
	}
	if ferr := sandbox.PlaceFiles(ctx, s, spec.Files); ferr != nil {
		_ = s.Close(ctx)
		return nil, fmt.Errorf("create sandbox %s: %w", name, ferr)
	}
	log.Debug("sandbox started", "image", spec.Image, "node", s.node, "user", s.Hello.User, "uid", s.Hello.UID)
	return s, nil
}

// createPod creates the pod; a namespace quota that is full is waited out
// (admission by quota) rather than failed.
func (k *Kubernetes) createPod(ctx context.Context, pod *corev1.Pod) error {
	back := 200 * time.Millisecond
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		t := time.Now()
		_, err := k.cs.core.Pods(k.cfg.Namespace).Create(cctx, pod, metav1.CreateOptions{})
		sandbox.MetricDaemon.WithLabelValues("pod_create").Observe(time.Since(t).Seconds())
		cancel()
		switch {
		case err == nil:
			return nil
		case apierrors.IsAlreadyExists(err) && attempt > 0:
			return nil // an earlier attempt reached the API server
		case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
			k.log.Debug("namespace quota full, waiting", "err", err)
		case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
			return fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
		case apierrors.IsForbidden(err):
			return fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
		case apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || isConnErr(err):
			if attempt >= 3 {
				return fmt.Errorf("%w: create pod: %v", sandbox.ErrUnavailable, err)
			}
		default:
			return fmt.Errorf("%w: create pod: %v", sandbox.ErrUnavailable, err)
		}
		select {
		case <-time.After(back):
		case <-ctx.Done():
			return ctx.Err()
		}
		back = min(2*back, 2*time.Second)
	}
}

func isConnErr(err error) bool {
	s := err.Error()
	return strings.Contains(s, "connection refused") || strings.Contains(s, "connection reset") ||
		strings.Contains(s, "EOF") || strings.Contains(s, "i/o timeout")
}

// waitRunning waits until the sandbox container runs, turning the pod's
// waiting reasons into classified errors.
func (k *Kubernetes) waitRunning(ctx context.Context, name string, wake <-chan struct{}) (*corev1.Pod, error) {
	deadline := time.NewTimer(k.cfg.StartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Second) // informer events are the fast path
	defer tick.Stop()
	key := k.cfg.Namespace + "/" + name
	var last string
	for {
		if obj, ok, _ := k.informer.GetStore().GetByKey(key); ok {
			pod := obj.(*corev1.Pod)
			done, err := podStarting(pod)
			if err != nil || done {
				return pod, err
			}
			last = describeWaiting(pod)
		}
		select {
		case <-wake:
		case <-tick.C:
			// A pod bound to a node that stopped reporting would wait out
			// the whole start timeout: give up as soon as the node is not
			// Ready.
			if obj, ok, _ := k.informer.GetStore().GetByKey(key); ok {
				if node := obj.(*corev1.Pod).Spec.NodeName; node != "" {
					if n, err := k.cs.core.Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil && !nodeReady(n) {
						return nil, fmt.Errorf("%w: node %s of the starting pod is not ready (%s)", sandbox.ErrUnavailable, node, last)
					}
				}
			}
		case <-deadline.C:
			return nil, fmt.Errorf("%w: pod not running after %s (%s)", sandbox.ErrUnavailable, k.cfg.StartTimeout, last)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// podStarting reports whether the sandbox container runs, or why it never
// will.
func podStarting(pod *corev1.Pod) (bool, error) {
	if pod.DeletionTimestamp != nil {
		return false, fmt.Errorf("%w: pod deleted while starting", sandbox.ErrUnavailable)
	}
	if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return false, fmt.Errorf("%w: %s", sandbox.ErrUnavailable, podFailure(pod))
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range list {
			if w := cs.State.Waiting; w != nil {
				switch w.Reason {
				case "ErrImageNeverPull", "InvalidImageName":
					return false, fmt.Errorf("%w: image %s of container %s: %s: %s (load it into the nodes or push it to a registry, docs/kubernetes.md)", sandbox.ErrInvalid, cs.Image, cs.Name, w.Reason, w.Message)
				case "ErrImagePull", "ImagePullBackOff":
					return false, fmt.Errorf("%w: image %s of container %s: %s: %s", sandbox.ErrInvalid, cs.Image, cs.Name, w.Reason, w.Message)
				case "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff":
					return false, fmt.Errorf("%w: container %s: %s: %s", sandbox.ErrUnavailable, cs.Name, w.Reason, w.Message)
				}
			}
			if t := cs.State.Terminated; t != nil && (t.ExitCode != 0 || cs.Name == ContainerName) {
				return false, fmt.Errorf("%w: container %s exited %d (%s) while starting: %s", sandbox.ErrUnavailable, cs.Name, t.ExitCode, t.Reason, strings.TrimSpace(t.Message))
			}
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == ContainerName && cs.State.Running != nil {
			return true, nil
		}
	}
	return false, nil
}

func describeWaiting(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return "unschedulable: " + c.Message
		}
	}
	for _, cs := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			return cs.Name + " waiting: " + w.Reason
		}
	}
	return "phase " + string(pod.Status.Phase)
}

// podFor builds the pod of a sandbox (docs/kubernetes.md, "Isolation").
func (k *Kubernetes) podFor(spec sandbox.Spec, extra map[string]string) *corev1.Pod {
	labels := maps.Clone(k.labels)
	annotations := map[string]string{}
	for key, v := range spec.Labels {
		annotations[key] = v
		if len(validation.IsQualifiedName(key)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			labels[key] = v
		}
	}
	maps.Copy(labels, extra)
	labels[LabelNetwork] = spec.Network
	agentPath := k8sAgentDir + "/agent"
	args := append([]string(nil), k.agent.Args...)
	env := make([]corev1.EnvVar, 0, len(spec.Env))
	for key, v := range spec.Env {
		env = append(env, corev1.EnvVar{Name: key, Value: v})
	}
	sort.Slice(env, func(i, j int) bool { return env[i].Name < env[j].Name })
	cpu := resource.NewMilliQuantity(int64(math.Ceil(spec.Limits.CPUs*1000)), resource.DecimalSI)
	mem := resource.NewQuantity(spec.Limits.MemoryBytes, resource.BinarySI)
	disk := resource.NewQuantity(spec.Limits.DiskBytes+64<<20, resource.BinarySI)
	cpuReq := resource.NewMilliQuantity(int64(math.Ceil(min(k.cfg.CPURequest, spec.Limits.CPUs)*1000)), resource.DecimalSI)
	memReq := resource.NewQuantity(min(k.cfg.MemoryRequestMB<<20, spec.Limits.MemoryBytes), resource.BinarySI)
	f, t := false, true
	var root int64
	grace := int64(0)
	rootCtx := &corev1.SecurityContext{
		// Only the root agent holds these four: it switches to the sandbox
		// user (SETUID/SETGID), prepares the workdir (CHOWN) and kills that
		// user's process groups (KILL). Commands run with none.
		RunAsUser:                &root,
		RunAsNonRoot:             &f,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"CHOWN", "SETUID", "SETGID", "KILL"}},
		AllowPrivilegeEscalation: &f,
		ReadOnlyRootFilesystem:   &spec.Limits.ReadOnlyRoot,
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	nobody := int64(65534)
	agentMount := corev1.VolumeMount{Name: "rollout-agent", MountPath: k8sAgentDir}
	volumes := []corev1.Volume{{Name: "rollout-agent", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(128<<20, resource.BinarySI)}}}}
	mounts := []corev1.VolumeMount{{Name: "rollout-agent", MountPath: k8sAgentDir, ReadOnly: true}}
	if spec.Limits.ReadOnlyRoot {
		volumes = append(volumes,
			corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(min(spec.Limits.DiskBytes, 512<<20), resource.BinarySI)}}},
			corev1.Volume{Name: "workdir", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(spec.Limits.DiskBytes, resource.BinarySI)}}})
		mounts = append(mounts, corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"}, corev1.VolumeMount{Name: "workdir", MountPath: spec.Workdir})
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "rollout-" + k.opts.Instance + "-" + sandbox.RandomID(6),
			Namespace:   k.cfg.Namespace,
			Labels:      labels,
			Annotations: annotations,
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &f,
			EnableServiceLinks:            &f,
			TerminationGracePeriodSeconds: &grace,
			ServiceAccountName:            k.cfg.ServiceAccount,
			NodeSelector:                  k.cfg.NodeSelector,
			SecurityContext:               &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Volumes:                       volumes,
			InitContainers: []corev1.Container{{
				Name:            "install-agent",
				Image:           k.agentI,
				ImagePullPolicy: corev1.PullPolicy(k.cfg.ImagePullPolicy),
				Command:         append(append([]string{"/rollout-agent"}, args...), "-install", agentPath),
				VolumeMounts:    []corev1.VolumeMount{agentMount},
				SecurityContext: &corev1.SecurityContext{
					RunAsUser: &nobody, RunAsNonRoot: &t, AllowPrivilegeEscalation: &f, ReadOnlyRootFilesystem: &t,
					Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				Resources: corev1.ResourceRequirements{
					Limits:   corev1.ResourceList{corev1.ResourceCPU: *cpu, corev1.ResourceMemory: *mem},
					Requests: corev1.ResourceList{corev1.ResourceCPU: *cpuReq, corev1.ResourceMemory: *memReq},
				},
			}},
			Containers: []corev1.Container{{
				Name:            ContainerName,
				Image:           imageref.InRegistry(k.cfg.ImageRegistry, spec.Image),
				ImagePullPolicy: corev1.PullPolicy(k.cfg.ImagePullPolicy),
				// The pod's main process only reaps orphans; the agent that
				// serves the channel is exec'd (Kubernetes.connect).
				Command:         append(append([]string{agentPath}, args...), "-init"),
				WorkingDir:      "/",
				Env:             env,
				VolumeMounts:    mounts,
				SecurityContext: rootCtx,
				Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{corev1.ResourceCPU: *cpu, corev1.ResourceMemory: *mem,
						corev1.ResourceEphemeralStorage: *disk},
					Requests: corev1.ResourceList{corev1.ResourceCPU: *cpuReq, corev1.ResourceMemory: *memReq},
				},
			}},
		},
	}
	if k.cfg.RuntimeClassName != "" {
		rc := k.cfg.RuntimeClassName
		pod.Spec.RuntimeClassName = &rc
	}
	for _, tl := range k.cfg.Tolerations {
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{Key: tl.Key, Operator: corev1.TolerationOperator(tl.Operator),
			Value: tl.Value, Effect: corev1.TaintEffect(tl.Effect), TolerationSeconds: tl.TolerationSeconds})
	}
	if spec.Limits.MaxLifetime > 0 {
		// The kubelet ends the pod even when no rollout process is left.
		secs := int64(math.Ceil(spec.Limits.MaxLifetime.Seconds())) + 60
		pod.Spec.ActiveDeadlineSeconds = &secs
	}
	k.mu.Lock()
	if k.lease != nil {
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Name: k.lease.Name, UID: k.lease.UID}}
	}
	k.mu.Unlock()
	return pod
}

// agentArgs are the exec'd agent's arguments for spec.
func (k *Kubernetes) agentArgs(spec sandbox.Spec) []string {
	user, optional := spec.User, false
	if user == "" {
		user, optional = "agent", true
	}
	cmd := append(append([]string{k8sAgentDir + "/agent"}, k.agent.Args...), "-user", user, "-workdir", spec.Workdir)
	if optional {
		// Without the image's metadata the fallback is the container's
		// user, root (as the Docker backend for images without USER).
		cmd = append(cmd, "-optional-user", "-fallback-user", "0")
	}
	return cmd
}

// remove deletes a sandbox's pod, in mode agent-sandbox its claim first.
func (k *Kubernetes) remove(ctx context.Context, pod string, ref *claimRef) error {
	if ref != nil && k.crd != nil {
		return k.crd.Release(ctx, *ref, pod)
	}
	return k.deletePod(ctx, pod)
}

// deletePod deletes a pod at once (grace period 0), also after ctx was
// cancelled, also on a lost node (the API object goes away immediately).
func (k *Kubernetes) deletePod(ctx context.Context, name string) error {
	grace := int64(0)
	var err error
	for attempt := range 4 {
		if attempt > 0 {
			time.Sleep(time.Duration(200<<attempt) * time.Millisecond)
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		t := time.Now()
		err = k.cs.core.Pods(k.cfg.Namespace).Delete(cctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
		sandbox.MetricDaemon.WithLabelValues("pod_delete").Observe(time.Since(t).Seconds())
		cancel()
		if err == nil || apierrors.IsNotFound(err) {
			return nil
		}
		if !(apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || isConnErr(err)) {
			break
		}
	}
	sandbox.MetricFailures.WithLabelValues("remove").Inc()
	return fmt.Errorf("delete pod %s: %w: %v", name, sandbox.ErrUnavailable, err)
}

// Close deletes every pod this backend still owns, stops the watch and the
// lease renewal and deletes the lease.
func (k *Kubernetes) Close(ctx context.Context) error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil
	}
	k.closed = true
	k.cond.Broadcast()
	live := make([]*k8sSandbox, 0, len(k.live))
	for _, s := range k.live {
		live = append(live, s)
	}
	k.mu.Unlock()
	errs := sandbox.CloseAll(ctx, live, 32)
	if k.crd != nil {
		if err := k.crd.close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if k.stop != nil {
		k.stop()
	}
	k.bg.Wait()
	if k.informed != nil {
		<-k.informed
	}
	if k.crd != nil {
		k.crd.Wait()
	}
	if k.lease != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		// Background propagation: the garbage collector deletes whatever
		// pod this process still owns (none, normally).
		bg := metav1.DeletePropagationBackground
		err := k.cs.coord.Leases(k.cfg.Namespace).Delete(cctx, k.lease.Name, metav1.DeleteOptions{PropagationPolicy: &bg})
		cancel()
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete owner lease: %w", err))
		}
	}
	return errors.Join(errs...)
}

// enforceLimits closes sandboxes past their idle timeout or lifetime.
func (k *Kubernetes) enforceLimits(ctx context.Context) {
	now := time.Now()
	var expired []*k8sSandbox
	var reasons []string
	k.mu.Lock()
	for _, s := range k.live {
		l := s.spec.Limits
		switch {
		case l.MaxLifetime > 0 && now.Sub(s.created) > l.MaxLifetime:
			expired, reasons = append(expired, s), append(reasons, "lifetime")
		case l.IdleTimeout > 0 && !s.Pooled.Load() && now.Sub(time.Unix(0, s.LastUsed.Load())) > l.IdleTimeout:
			expired, reasons = append(expired, s), append(reasons, "idle")
		}
	}
	k.mu.Unlock()
	for i, s := range expired {
		s.Reason.Store("closed by the reaper: " + reasons[i] + " limit")
		sandbox.MetricReaped.WithLabelValues(reasons[i]).Inc()
		_ = s.Close(ctx)
	}
}

// Reap deletes the owner leases of dead processes (not renewed for three
// lease durations; the garbage collector then deletes their pods) and, with
// opts.All, every pod and lease of this service in the namespace. It also
// deletes pods of this process it does not track (a create whose answer was
// lost) once older than a minute.
func (k *Kubernetes) Reap(ctx context.Context, opts sandbox.ReapOptions) ([]sandbox.Reaped, error) {
	k.mu.Lock()
	tracked := map[string]bool{}
	for n := range k.live {
		tracked[n] = true
	}
	for n := range k.waiters {
		tracked[n] = true
	}
	k.mu.Unlock()
	out, err := reapKubernetes(ctx, k.cs, k.cfg.Namespace, k.opts.Instance, tracked, opts)
	if k.crd != nil && err == nil {
		var more []sandbox.Reaped
		more, err = k.crd.reapLeaked(ctx)
		out = append(out, more...)
	}
	return out, err
}

// GCKubernetes is `rollout sandbox gc` for a cluster: a fresh client, the
// same rules as Reap, no process of its own.
func GC(ctx context.Context, cfg k8sconfig.Config, opts sandbox.ReapOptions) ([]sandbox.Reaped, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	rc, err := RESTConfig(&cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	cs, err := newKubeClients(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	return reapKubernetes(ctx, cs, cfg.Namespace, "", nil, opts)
}

func reapKubernetes(ctx context.Context, cs *kubeClients, ns, self string, tracked map[string]bool, opts sandbox.ReapOptions) ([]sandbox.Reaped, error) {
	sel := sandbox.LabelManaged + "=true"
	leases, err := cs.coord.Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("%w: list leases: %v", sandbox.ErrUnavailable, err)
	}
	var out []sandbox.Reaped
	alive := map[string]bool{}
	bg := metav1.DeletePropagationBackground
	for _, l := range leases.Items {
		inst := l.Labels[sandbox.LabelInstance]
		expired := true
		if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil {
			d := time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
			expired = time.Since(l.Spec.RenewTime.Time) > 3*d
		}
		if inst == self || (!expired && !opts.All) {
			alive[inst] = true
			continue
		}
		err := cs.coord.Leases(ns).Delete(ctx, l.Name, metav1.DeleteOptions{PropagationPolicy: &bg})
		if err != nil && !apierrors.IsNotFound(err) {
			return out, fmt.Errorf("%w: delete lease %s: %v", sandbox.ErrUnavailable, l.Name, err)
		}
		sandbox.MetricReaped.WithLabelValues("orphan").Inc()
		out = append(out, sandbox.Reaped{ID: string(l.UID), Name: "lease/" + l.Name, Instance: inst, Reason: "orphan"})
	}
	// Pods whose owner is gone (the garbage collector does this too, but a
	// pod created without an owner, or with --all, is deleted here).
	pods, err := cs.core.Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return out, fmt.Errorf("%w: list pods: %v", sandbox.ErrUnavailable, err)
	}
	grace := int64(0)
	for _, p := range pods.Items {
		inst := p.Labels[sandbox.LabelInstance]
		reason := ""
		switch {
		case ownedByAgentSandbox(&p):
			// The agent-sandbox controller's pod goes with its claim or
			// warm pool, which the lease owns.
		case inst == self && self != "":
			if !tracked[p.Name] && time.Since(p.CreationTimestamp.Time) > time.Minute {
				reason = "leaked"
			}
		case opts.All:
			reason = "all"
		case !alive[inst]:
			reason = "orphan"
		}
		if reason == "" {
			continue
		}
		err := cs.core.Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
		if err != nil && !apierrors.IsNotFound(err) {
			return out, fmt.Errorf("%w: delete pod %s: %v", sandbox.ErrUnavailable, p.Name, err)
		}
		sandbox.MetricReaped.WithLabelValues(reason).Inc()
		out = append(out, sandbox.Reaped{ID: string(p.UID), Name: "pod/" + p.Name, Instance: inst, Reason: reason})
	}
	return out, nil
}

// labelValue makes s a valid label value (hostnames usually are).
func labelValue(s string) string {
	if len(validation.IsValidLabelValue(s)) == 0 {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	out := strings.Trim(string(b), "-_.")
	if len(out) > 63 {
		out = strings.Trim(out[:63], "-_.")
	}
	return out
}

// k8sSandbox is one sandbox pod with its agent channel.
type k8sSandbox struct {
	sandbox.ChannelOps
	k       *Kubernetes
	name    string
	claim   *claimRef // mode agent-sandbox
	node    string
	spec    sandbox.Spec
	imageID string
	Hello   agent.Hello
	created time.Time
	log     *slog.Logger
	stderr  *sandbox.TailBuffer

	cancel     context.CancelFunc
	streamDone chan struct{}
	stdin      *io.PipeReader

	sandbox.HandleState
	Once      sync.Once
	closeErr  error
	lost      atomic.Value // string: why the pod can no longer serve
	seenReady atomic.Bool
}

var (
	_ sandbox.Sandbox         = (*k8sSandbox)(nil)
	_ sandbox.Quiescer        = (*k8sSandbox)(nil)
	_ sandbox.StdinCloser     = (*k8sSandbox)(nil)
	_ sandbox.Labeler         = (*k8sSandbox)(nil)
	_ sandbox.ImageIdentifier = (*k8sSandbox)(nil)
	_ sandbox.LimitsReporter  = (*k8sSandbox)(nil)
)

// connect execs the agent into the running pod over one stream (WebSocket,
// falling back to SPDY) and waits for its hello.
func (s *k8sSandbox) connect(ctx context.Context) error {
	k := s.k
	req := k.cs.core.RESTClient().Post().Resource("pods").Namespace(k.cfg.Namespace).Name(s.name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: ContainerName, Command: k.agentArgs(s.spec), Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := NewExecutor(k.rest, req.URL())
	if err != nil {
		return fmt.Errorf("%w: exec stream: %v", sandbox.ErrUnavailable, err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	sctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.stdin, s.streamDone = cancel, inR, make(chan struct{})
	s.ChannelOps = sandbox.NewChannelOps(sandbox.NewConn(outR, inW), s)
	go func() {
		defer close(s.streamDone)
		err := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: s.stderr})
		if err == nil {
			err = io.EOF
		}
		if lost, _ := s.lost.Load().(string); lost != "" {
			err = errors.New(lost)
		}
		outW.CloseWithError(err)
		inR.CloseWithError(err)
	}()
	t := time.NewTimer(k.cfg.StartTimeout)
	defer t.Stop()
	select {
	case h := <-s.Conn.Hello:
		if h.Err != "" {
			s.stopStream()
			return fmt.Errorf("%w: agent start-up: %s", sandbox.ErrInvalid, h.Err)
		}
		if h.Version != agent.ProtocolVersion {
			s.stopStream()
			return fmt.Errorf("%w: agent protocol %d, want %d (stale agent image %s?)", sandbox.ErrInvalid, h.Version, agent.ProtocolVersion, k.agentI)
		}
		s.Hello = h
		return nil
	case <-s.Conn.Done():
		s.stopStream()
		return fmt.Errorf("%w: agent exited before its hello: %v %s", sandbox.ErrUnavailable, s.Conn.Broken(), s.stderr.String())
	case <-t.C:
		s.stopStream()
		return fmt.Errorf("%w: no hello from the agent within %s: %s", sandbox.ErrUnavailable, k.cfg.StartTimeout, s.stderr.String())
	case <-ctx.Done():
		s.stopStream()
		return ctx.Err()
	}
}

// newExecutor opens streams over WebSocket (the API server's current
// protocol) and falls back to SPDY for API servers that refuse the upgrade.
func NewExecutor(rc *rest.Config, u *url.URL) (remotecommand.Executor, error) {
	ws, err := remotecommand.NewWebSocketExecutor(rc, "GET", u.String())
	if err != nil {
		return nil, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(rc, "POST", u)
	if err != nil {
		return nil, err
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

func (s *k8sSandbox) stopStream() {
	if s.cancel != nil {
		s.cancel()
		if s.stdin != nil {
			s.stdin.CloseWithError(errors.New("sandbox closed"))
		}
		<-s.streamDone
		<-s.Conn.Done()
	}
}

// fail breaks the channel because the pod can no longer serve: calls in
// flight and later ones return ErrUnavailable with the reason.
func (s *k8sSandbox) fail(why string) {
	if s.lost.CompareAndSwap(nil, why) {
		s.log.Warn("sandbox pod lost", "reason", why)
		sandbox.MetricFailures.WithLabelValues("channel").Inc()
		s.cancel()
	}
}

func (s *k8sSandbox) Broken() error                 { return s.Conn.Broken() }
func (s *k8sSandbox) SetLabels(l map[string]string) { s.spec.Labels = l }

// ID is the pod name.
func (s *k8sSandbox) ID() string { return s.name }

// Node is the node the pod runs on.
func (s *k8sSandbox) Node() string { return s.node }

// ImageID is the image digest the kubelet reported for the sandbox
// container.
func (s *k8sSandbox) ImageID() string { return s.imageID }

// Applied reports the limits the pod was made with (podFor, from the
// validated spec: defaults filled in): memory and CPU limits, the disk
// bound behind its ephemeral-storage limit, the root and the network
// policy. A pod spec has no pids limit (the kubelet's podPidsLimit applies
// per node), so PIDs is 0: none enforced per pod. Runtime is the runtime
// class when one is set, else empty: the cluster's default handler.
func (s *k8sSandbox) Applied() sandbox.Applied {
	l := s.spec.Limits
	return sandbox.Applied{MemoryBytes: l.MemoryBytes, CPUs: l.CPUs, DiskBytes: l.DiskBytes, ReadOnlyRoot: l.ReadOnlyRoot,
		Network: s.spec.Network, Runtime: s.k.cfg.RuntimeClassName, Backend: sandbox.BackendKubernetes}
}

// Labels returns the caller labels of the spec.
func (s *k8sSandbox) Labels() map[string]string { return maps.Clone(s.spec.Labels) }

func (s *k8sSandbox) Check() error {
	return s.Open("sandbox " + s.name)
}

func (s *k8sSandbox) Wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	if s.Closing.Load() && errors.Is(err, sandbox.ErrUnavailable) {
		return fmt.Errorf("%s in sandbox %s: %w", what, s.name, sandbox.ErrClosed)
	}
	if errors.Is(err, sandbox.ErrUnavailable) {
		if why, _ := s.lost.Load().(string); why != "" {
			return fmt.Errorf("%s in sandbox %s: %w", what, s.name, err) // err carries the reason
		}
		return fmt.Errorf("%s in sandbox %s: %w (%s)", what, s.name, err, s.state())
	}
	return fmt.Errorf("%s in sandbox %s: %w", what, s.name, err)
}

// state describes the pod after the channel broke.
func (s *k8sSandbox) state() string {
	if why, _ := s.lost.Load().(string); why != "" {
		return why
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pod, err := s.k.cs.core.Pods(s.k.cfg.Namespace).Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "pod was deleted"
	}
	if err != nil {
		return "pod state unknown: " + err.Error()
	}
	msg := s.podLost(pod)
	if msg == "" {
		msg = "pod " + strings.ToLower(string(pod.Status.Phase)) + " on node " + pod.Spec.NodeName
	}
	if e := s.stderr.String(); e != "" {
		msg += ", agent: " + e
	}
	return msg
}

// Close deletes the pod. It is idempotent and works with a cancelled ctx.
func (s *k8sSandbox) Close(ctx context.Context) error {
	s.Once.Do(func() {
		s.Closing.Store(true)
		s.stopStream()
		s.closeErr = s.k.remove(ctx, s.name, s.claim)
		k := s.k
		k.mu.Lock()
		if _, ok := k.live[s.name]; ok {
			delete(k.live, s.name)
			k.cond.Broadcast()
		}
		sandbox.MetricLive.Set(float64(len(k.live)))
		k.mu.Unlock()
		if s.closeErr != nil {
			s.closeErr = fmt.Errorf("close sandbox %s: %w", s.name, s.closeErr)
		}
	})
	return s.closeErr
}

var quietOnce sync.Once

// quietClientGo sends client-go's klog output to the logger at debug
// level: it reports every stream the backend closes on purpose (Close, a
// lost pod) as an error; what matters is reported by the backend itself.
func quietClientGo(l *slog.Logger) {
	quietOnce.Do(func() {
		klog.SetSlogLogger(slog.New(debugHandler{l.Handler()}))
	})
}

// debugHandler logs every record at debug level.
type debugHandler struct{ h slog.Handler }

func (d debugHandler) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d debugHandler) Handle(ctx context.Context, r slog.Record) error {
	if !d.h.Enabled(ctx, slog.LevelDebug) {
		return nil // klog's bridge does not ask Enabled first
	}
	r.Level = slog.LevelDebug
	return d.h.Handle(ctx, r)
}

func (d debugHandler) WithAttrs(a []slog.Attr) slog.Handler { return debugHandler{d.h.WithAttrs(a)} }
func (d debugHandler) WithGroup(n string) slog.Handler      { return debugHandler{d.h.WithGroup(n)} }
