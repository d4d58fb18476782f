package job

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/sandbox"
)

// Shared is one lazily started Docker backend and task-image builder for
// many jobs (the gRPC server's): one container limit, one reaper and one
// instance label for the whole process, and one Close that removes every
// sandbox still alive. The engine is contacted on the first sandbox.
type Shared struct {
	docker *lazyDocker
	images *taskImages

	mu     sync.RWMutex // Create/BuildTask hold R while starting the backend; Close holds W
	closed bool
}

var (
	_ runner.Sandboxes    = (*Shared)(nil)
	_ runner.ImageBuilder = (*Shared)(nil)
)

// NewShared returns a shared backend; opts configure the Docker backend
// when it starts.
func NewShared(opts sandbox.Options) *Shared {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	d := &lazyDocker{log: opts.Logger, instance: opts.Instance, opts: &opts}
	return &Shared{docker: d, images: &taskImages{docker: d}}
}

func (s *Shared) start(ctx context.Context) error {
	if s.closed {
		return fmt.Errorf("%w: the sandbox backend is shutting down", sandbox.ErrUnavailable)
	}
	_, err := s.docker.get(ctx)
	return err
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

// Close removes every sandbox the backend still owns and stops its reaper;
// later calls to Create fail with sandbox.ErrUnavailable.
func (s *Shared) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.docker.Close(ctx)
}
