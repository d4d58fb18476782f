package assemble

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
)

// BackendSelector is a shared sandbox backend that serves jobs of more than
// one sandbox.backend: Open asks it for the job's (Options.Sandboxes).
type BackendSelector interface {
	For(cfg runner.Config) (runner.Sandboxes, runner.ImageBuilder, error)
}

// Shared is the lazily started sandbox backends and task-image builders of
// many jobs (the gRPC server's): one Docker backend with one container
// limit, one reaper, one instance label and one warm pool for the whole
// process, plus one Kubernetes backend (and warm pool) per distinct
// sandbox.kubernetes block that jobs name, one runc backend for the jobs
// with sandbox.backend runc, and one Close that removes every sandbox still
// alive. The engine or cluster is contacted on a job's first sandbox.
//
// Each job gets its backend through a scope of the backend's warm pool
// (sharedJob): the groups it announces are started ahead of time as in
// rollout run, and with sandbox.reuse (Docker) its sandboxes are reset in
// place for its own next rollouts, never for another job's.
type Shared struct {
	opts   docker.Options
	docker *lazyBackend
	images *taskImages

	mu     sync.RWMutex // Create/BuildTask hold R while starting a backend; For and Close hold W
	closed bool
	kube   map[string]*sharedBackend // by the canonical JSON of the validated config
	runc   *sharedBackend            // made for the first job with sandbox.backend runc
}

var (
	_ runner.Sandboxes    = (*Shared)(nil)
	_ runner.ImageBuilder = (*Shared)(nil)
	_ BackendSelector     = (*Shared)(nil)
)

// NewShared returns a shared backend; opts configure the Docker backend
// when it starts (and the Kubernetes ones: logger, instance, and
// MaxContainers as an upper bound of their max_pods). warm bounds the idle
// sandboxes of each backend's warm pool across all jobs (started
// ahead of a job's groups, or reset for its next rollouts); they count
// against MaxContainers, and a job needing a slot removes an idle one. 0
// runs without the pool: every sandbox is created on demand and
// sandbox.reuse is refused.
func NewShared(opts docker.Options, warm int) *Shared {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	d := &lazyBackend{log: opts.Logger, instance: opts.Instance, opts: &opts, warm: max(warm, 0), reuse: true}
	return &Shared{opts: opts, docker: d, images: &taskImages{backend: d}, kube: map[string]*sharedBackend{}}
}

// For implements BackendSelector: the job's scope of the shared Docker
// backend, or of the shared Kubernetes backend of the config's
// sandbox.kubernetes block, started on its first sandbox. Jobs with equal
// blocks share one backend (one owner lease, one admission, one warm
// pool).
func (s *Shared) For(cfg runner.Config) (runner.Sandboxes, runner.ImageBuilder, error) {
	if cfg.Sandbox.Reuse && s.docker.warm == 0 && cfg.Sandbox.Backend != sandbox.BackendKubernetes {
		return nil, nil, errors.New("sandbox.reuse: this server runs without a warm pool (rollout serve --warm-sandboxes 0), where reset sandboxes would wait")
	}
	if cfg.Sandbox.Backend == sandbox.BackendRunc {
		return s.forRunc(cfg)
	}
	if cfg.Sandbox.Backend != sandbox.BackendKubernetes {
		return &sharedJob{s: s, l: s.docker, reuse: cfg.Sandbox.Reuse, expect: cfg.Sandbox.WarmPool >= 0, limit: sandboxLimit(cfg)}, s, nil
	}
	kc := k8sconfig.Config{}
	if cfg.Sandbox.Kubernetes != nil {
		kc = *cfg.Sandbox.Kubernetes
	}
	if err := kc.Validate(); err != nil {
		return nil, nil, err
	}
	if m := s.opts.MaxContainers; m > 0 && kc.MaxPods > m {
		kc.MaxPods = m // --max-sandboxes bounds the pods too
	}
	key, err := json.Marshal(kc)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox.kubernetes: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, fmt.Errorf("%w: the sandbox backend is shutting down", sandbox.ErrUnavailable)
	}
	k := s.kube[string(key)]
	if k == nil {
		// Each backend owns a lease named after its instance: distinct
		// instances for distinct clusters or namespaces.
		instance := s.opts.Instance
		if instance != "" {
			instance = fmt.Sprintf("%s-k%d", instance, len(s.kube)+1)
		}
		l := &lazyBackend{log: s.opts.Logger, instance: instance, kube: &kc, warm: s.docker.warm}
		k = &sharedBackend{s: s, l: l, images: &taskImages{backend: l}}
		s.kube[string(key)] = k
	}
	return &sharedJob{s: s, l: k.l, expect: cfg.Sandbox.WarmPool >= 0, limit: sandboxLimit(cfg)}, k, nil
}

// Create implements runner.Sandboxes: a sandbox of the shared Docker
// backend outside any job's scope (single-use, never from the warm pool).
func (s *Shared) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	s.mu.RLock()
	err := s.started(ctx, s.docker)
	s.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	return s.docker.d.Create(ctx, spec)
}

// Resets counts the shared Docker and runc backends' resets in place so
// far (jobs with sandbox.reuse): done, and failed (those containers were
// removed).
func (s *Shared) Resets() (ok, failed int64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	ls := []*lazyBackend{s.docker}
	if s.runc != nil {
		ls = append(ls, s.runc.l)
	}
	for _, l := range ls {
		if p := l.poolIfStarted(); p != nil {
			o, f := p.Resets()
			ok, failed = ok+o, failed+f
		}
	}
	return ok, failed
}

// sharedJob is one job's view of a shared backend (Docker, or one of the
// Kubernetes ones): its sandboxes come through its own scope of the
// backend's warm pool (sandbox.PoolScope), made on the job's first sandbox
// and closed by Release when the job ends.
type sharedJob struct {
	s      *Shared
	l      *lazyBackend // the backend
	reuse  bool         // sandbox.reuse (Docker and runc: the config refuses it with Kubernetes)
	expect bool         // sandbox.warm_pool >= 0: the groups it announces are started ahead
	limit  int          // limits.sandboxes: at most this many started ahead for the job at once

	mu       sync.Mutex
	scope    *sandbox.PoolScope
	released bool
}

var (
	_ runner.Sandboxes = (*sharedJob)(nil)
	_ runner.Expecter  = (*sharedJob)(nil)
	_ releaser         = (*sharedJob)(nil)
)

// backend starts the shared backend and returns the job's scope, or nil
// when the server runs without a warm pool.
func (j *sharedJob) backend(ctx context.Context) (*sandbox.PoolScope, error) {
	j.s.mu.RLock()
	err := j.s.started(ctx, j.l)
	j.s.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.released {
		return nil, fmt.Errorf("%w: the job's sandboxes were released", sandbox.ErrClosed)
	}
	if j.scope == nil && j.l.pool != nil {
		j.scope = j.l.pool.Scope(sandbox.ScopeOptions{Reuse: j.reuse, MaxDemand: j.limit})
	}
	return j.scope, nil
}

// Create implements runner.Sandboxes.
func (j *sharedJob) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sc, err := j.backend(ctx)
	if err != nil {
		return nil, err
	}
	if sc == nil {
		return j.l.Create(ctx, spec)
	}
	return sc.Create(ctx, spec)
}

// Expect implements runner.Expecter.
func (j *sharedJob) Expect(spec sandbox.Spec, n int) error {
	if !j.expect {
		return nil
	}
	sc, err := j.backend(context.Background())
	if err != nil || sc == nil {
		return err
	}
	return sc.Expect(spec, n)
}

// Release implements releaser: the job is over. Its scope's demand is
// withdrawn and its reset spares removed; the backend stays up for the
// other jobs.
func (j *sharedJob) Release(ctx context.Context) error {
	j.mu.Lock()
	j.released = true
	sc := j.scope
	j.mu.Unlock()
	if sc == nil {
		return nil
	}
	return sc.Close(ctx)
}

// BuildTask implements runner.ImageBuilder.
func (s *Shared) BuildTask(ctx context.Context, b envs.ImageBuild) (string, error) {
	s.mu.RLock()
	err := s.started(ctx, s.docker)
	s.mu.RUnlock()
	if err != nil {
		return "", fmt.Errorf("task image: %w", err)
	}
	return s.images.BuildTask(ctx, b)
}

// Close removes every sandbox the backends still own and stops their
// reapers and leases; later calls to Create fail with
// sandbox.ErrUnavailable.
func (s *Shared) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	errs := []error{s.docker.Close(ctx)}
	for _, k := range s.kube {
		errs = append(errs, k.l.Close(ctx))
	}
	if s.runc != nil {
		errs = append(errs, s.runc.l.Close(ctx))
	}
	return errors.Join(errs...)
}

// forRunc is For of a job with sandbox.backend runc: the job's scope of
// the shared runc backend, made on the first such job.
func (s *Shared) forRunc(cfg runner.Config) (runner.Sandboxes, runner.ImageBuilder, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, fmt.Errorf("%w: the sandbox backend is shutting down", sandbox.ErrUnavailable)
	}
	if s.runc == nil {
		instance := s.opts.Instance
		if instance != "" {
			instance += "-r"
		}
		l := &lazyBackend{log: s.opts.Logger, instance: instance, runc: true, warm: s.docker.warm, maxContainers: s.opts.MaxContainers, reuse: true}
		s.runc = &sharedBackend{s: s, l: l, images: &taskImages{backend: l}}
	}
	return &sharedJob{s: s, l: s.runc.l, reuse: cfg.Sandbox.Reuse, expect: cfg.Sandbox.WarmPool >= 0, limit: sandboxLimit(cfg)}, s.runc, nil
}

// sharedBackend is one shared Kubernetes or runc backend, with a warm pool
// like the Docker one's (jobs take their sandboxes through sharedJob), and
// its task-image builder.
type sharedBackend struct {
	s      *Shared
	l      *lazyBackend
	images *taskImages
}

// BuildTask implements runner.ImageBuilder: built by the local engine (for
// Kubernetes then pushed to sandbox.kubernetes.image_registry, an error
// without one).
func (k *sharedBackend) BuildTask(ctx context.Context, b envs.ImageBuild) (string, error) {
	k.s.mu.RLock()
	closed := k.s.closed
	k.s.mu.RUnlock()
	if closed {
		return "", fmt.Errorf("task image: %w: the sandbox backend is shutting down", sandbox.ErrUnavailable)
	}
	return k.images.BuildTask(ctx, b)
}

func (s *Shared) started(ctx context.Context, l *lazyBackend) error {
	if s.closed {
		return fmt.Errorf("%w: the sandbox backend is shutting down", sandbox.ErrUnavailable)
	}
	return l.start(ctx)
}
