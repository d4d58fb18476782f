package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	reg "github.com/rollout-rl/rollout/internal/util/registry"
)

// OpenOptions are the settings every backend understands; a backend's own
// knobs stay in its package's Options.
type OpenOptions struct {
	Instance      string        // service instance id (default: random)
	MaxContainers int           // concurrent sandboxes (default: the backend's)
	ReapInterval  time.Duration // periodic reaper (0: default; < 0 disables, start-up reap too)
	Logger        *slog.Logger
	// Config is the backend's typed block of the run config, when it has
	// one (the kubernetes backend's k8sconfig.Config); nil takes defaults.
	Config any
}

// BackendCloser is a backend that holds resources until closed: every
// registered backend is one.
type BackendCloser interface {
	Backend
	Close(ctx context.Context) error
}

// Registration is what a backend package registers about itself.
type Registration struct {
	Name string
	// Open starts the backend.
	Open func(ctx context.Context, o OpenOptions) (BackendCloser, error)
	// GC removes what dead instances of the backend left behind (every
	// instance's, with ReapOptions.All).
	GC func(ctx context.Context, o OpenOptions, ro ReapOptions) ([]Reaped, error)
}

var registry = reg.New[Registration]("sandbox backend")

// Register adds a backend under r.Name; a backend package calls it from
// init, and sandbox/builtin links the built-in ones. A second registration
// of a name is a programming error.
func Register(r Registration) { registry.Register(r.Name, r) }

// Lookup returns the registration of the named backend; an unknown name is
// ErrInvalid.
func Lookup(name string) (Registration, error) {
	r, ok := registry.Lookup(name)
	if !ok {
		return Registration{}, fmt.Errorf("%w: sandbox backend %q: want one of %v", ErrInvalid, name, registry.Names())
	}
	return r, nil
}

// Registered lists the registered backends' names, sorted.
func Registered() []string { return registry.Names() }
