package job

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
)

// BackendSelector is a shared sandbox backend that serves jobs of more than
// one sandbox.backend: Open asks it for the job's (Options.Sandboxes).
type BackendSelector interface {
	For(cfg runner.Config) (runner.Sandboxes, runner.ImageBuilder, error)
}

// Shared is the lazily started sandbox backends and task-image builders of
// many jobs (the gRPC server's): one Docker backend with one container
// limit, one reaper and one instance label for the whole process, plus one
// Kubernetes backend per distinct sandbox.kubernetes block that jobs name,
// and one Close that removes every sandbox still alive. The engine or
// cluster is contacted on a job's first sandbox.
type Shared struct {
	opts   sandbox.Options
	docker *lazyDocker
	images *taskImages

	mu     sync.RWMutex // Create/BuildTask hold R while starting a backend; For and Close hold W
	closed bool
	kube   map[string]*sharedKube // by the canonical JSON of the validated config
}

var (
	_ runner.Sandboxes    = (*Shared)(nil)
	_ runner.ImageBuilder = (*Shared)(nil)
	_ BackendSelector     = (*Shared)(nil)
)

// NewShared returns a shared backend; opts configure the Docker backend
// when it starts (and the Kubernetes ones: logger, instance, and
// MaxContainers as an upper bound of their max_pods).
func NewShared(opts sandbox.Options) *Shared {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	d := &lazyDocker{log: opts.Logger, instance: opts.Instance, opts: &opts}
	return &Shared{opts: opts, docker: d, images: &taskImages{docker: d}, kube: map[string]*sharedKube{}}
}

// For implements BackendSelector: the shared Docker backend (s itself), or
// the shared Kubernetes backend of the config's sandbox.kubernetes block,
// started on its first sandbox. Jobs with equal blocks share one backend
// (one owner lease, one admission).
func (s *Shared) For(cfg runner.Config) (runner.Sandboxes, runner.ImageBuilder, error) {
	if cfg.Sandbox.Backend != sandbox.BackendKubernetes {
		return s, s, nil
	}
	kc := sandbox.KubernetesConfig{}
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
		l := &lazyDocker{log: s.opts.Logger, instance: instance, kube: &kc}
		k = &sharedKube{s: s, l: l, images: &taskImages{docker: l}}
		s.kube[string(key)] = k
	}
	return k, k, nil
}

func (s *Shared) start(ctx context.Context) error {
	if s.closed {
		return fmt.Errorf("%w: the sandbox backend is shutting down", sandbox.ErrUnavailable)
	}
	return s.docker.start(ctx)
}

// Create implements runner.Sandboxes.
func (s *Shared) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	s.mu.RLock()
	err := s.start(ctx)
	s.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	return s.docker.d.Create(ctx, spec)
}

// BuildTask implements runner.ImageBuilder.
func (s *Shared) BuildTask(ctx context.Context, b envs.ImageBuild) (string, error) {
	s.mu.RLock()
	err := s.start(ctx)
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
	return errors.Join(errs...)
}

// sharedKube is one shared Kubernetes backend. It has no warm pool (jobs
// come and go; the shared Docker backend has none either): pods are
// created per sandbox, under the backend's admission.
type sharedKube struct {
	s      *Shared
	l      *lazyDocker
	images *taskImages
}

// Create implements runner.Sandboxes.
func (k *sharedKube) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	k.s.mu.RLock()
	err := k.s.started(ctx, k.l)
	k.s.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	return k.l.k.Create(ctx, spec)
}

// BuildTask implements runner.ImageBuilder: built locally, pushed to
// sandbox.kubernetes.image_registry (an error without one).
func (k *sharedKube) BuildTask(ctx context.Context, b envs.ImageBuild) (string, error) {
	k.s.mu.RLock()
	closed := k.s.closed
	k.s.mu.RUnlock()
	if closed {
		return "", fmt.Errorf("task image: %w: the sandbox backend is shutting down", sandbox.ErrUnavailable)
	}
	return k.images.BuildTask(ctx, b)
}

func (s *Shared) started(ctx context.Context, l *lazyDocker) error {
	if s.closed {
		return fmt.Errorf("%w: the sandbox backend is shutting down", sandbox.ErrUnavailable)
	}
	return l.start(ctx)
}
