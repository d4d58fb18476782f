package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"strconv"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/rollout-rl/rollout/internal/util/imageref"
	"github.com/rollout-rl/rollout/sandbox"
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

// RESTConfig exposes the client configuration (benchmarks).
func (k *Kubernetes) RESTConfig() *rest.Config { return k.rest }

// Config is the backend's configuration, defaults applied.
func (k *Kubernetes) Config() k8sconfig.Config { return k.cfg }

func (k *Kubernetes) Logger() *slog.Logger { return k.log }

// Validate applies the shared checks and refuses what a pod cannot be
// held to (docs/security.md, "Limits on every backend"): runtime runsc
// (the pods' runtime is the config's runtime_class_name), network bridge
// (a pod is either denied all traffic or unrestricted) and a pids limit (a
// pod spec has none; the kubelet's podPidsLimit bounds every pod of a
// node). The shared checks' pids default is not kept either: the spec
// says 0, none enforced per pod, as the manifest does, and validating it
// again finds nothing to refuse.
func (k *Kubernetes) Validate(spec *sandbox.Spec) error {
	if spec.Limits.PIDs > 0 {
		return fmt.Errorf("pids limit %d: not enforced by the kubernetes backend (a pod spec has no pids limit; set podPidsLimit on the sandbox nodes and remove the pids limit)", spec.Limits.PIDs)
	}
	if err := sandbox.ValidateSpec(spec); err != nil {
		return err
	}
	spec.Limits.PIDs = 0
	if spec.Runtime == sandbox.RuntimeRunsc {
		return fmt.Errorf("runtime %q: not implemented in the kubernetes backend (set runtime_class_name in its config to a RuntimeClass whose handler is runsc)", spec.Runtime)
	}
	if spec.Network == sandbox.NetworkBridge {
		return fmt.Errorf("network %q (egress only): not implemented in the kubernetes backend (a pod is denied all traffic, network none, or unrestricted, network open)", spec.Network)
	}
	return nil
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
	var running *corev1.Pod
	// From here every failure deletes the pod (also when the create's
	// answer was lost: deleting a missing pod is fine).
	defer func() {
		if err != nil {
			_ = k.remove(context.WithoutCancel(ctx), name, ref)
		}
	}()
	running, ref, err = k.runPod(ctx, pod, spec, extra, wake)
	if err != nil {
		return nil, err
	}
	if ref != nil {
		name = running.Name
		log = k.log.With("pod", name, "claim", ref.claim)
	}
	s, err := k.handleFor(ctx, running, ref, spec, log)
	if err != nil {
		return nil, err
	}
	if err := k.register(s); err != nil {
		s.stopStream()
		return nil, err
	}
	admitted = false // register counted it live
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

// runPod makes the pod run: in mode agent-sandbox a claim on the
// controller's pods (ref is set, also when that fails, so the caller's
// cleanup deletes the claim), else pod created here and awaited until it
// runs.
func (k *Kubernetes) runPod(ctx context.Context, pod *corev1.Pod, spec sandbox.Spec, extra map[string]string, wake chan struct{}) (*corev1.Pod, *claimRef, error) {
	if k.crd != nil {
		running, r, err := k.crd.start(ctx, pod, spec, extra, wake)
		if err != nil {
			return nil, &r, fmt.Errorf("create sandbox from %s: %w", spec.Image, err)
		}
		return running, &r, nil
	}
	if err := k.createPod(ctx, pod); err != nil {
		sandbox.MetricFailures.WithLabelValues("create").Inc()
		return nil, nil, fmt.Errorf("create sandbox from %s: %w", spec.Image, err)
	}
	running, err := k.waitRunning(ctx, pod.Name, wake)
	if err != nil {
		sandbox.MetricFailures.WithLabelValues("start").Inc()
		return nil, nil, fmt.Errorf("create sandbox %s from %s: %w", pod.Name, spec.Image, err)
	}
	return running, nil, nil
}

// handleFor is the sandbox handle of the running pod, with its agent
// channel open: the one already opened into an adopted warm pod (mode
// agent-sandbox), else one opened now.
func (k *Kubernetes) handleFor(ctx context.Context, running *corev1.Pod, ref *claimRef, spec sandbox.Spec, log *slog.Logger) (*k8sSandbox, error) {
	name := running.Name
	var s *k8sSandbox
	if k.crd != nil {
		s = k.crd.takeChannel(ctx, name)
	}
	if s != nil {
		s.claim, s.spec, s.node, s.created, s.log = ref, spec, running.Spec.NodeName, time.Now(), log
	} else {
		s = &k8sSandbox{k: k, name: name, claim: ref, spec: spec, node: running.Spec.NodeName, created: time.Now(), log: log, stderr: sandbox.NewTailBuffer(8 << 10)}
		s.Bind(name, s.broken)
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
	return s, nil
}

// register makes s one of the backend's live sandboxes, moving it from
// the pending count, unless the backend closed meanwhile.
func (k *Kubernetes) register(s *k8sSandbox) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return fmt.Errorf("create sandbox: %w: backend closed", sandbox.ErrClosed)
	}
	k.live[s.name] = s
	k.pending--
	sandbox.MetricLive.Set(float64(len(k.live)))
	return nil
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
