package runc

import (
	"context"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

func init() {
	sandbox.Register(sandbox.Registration{
		Name: sandbox.BackendRunc,
		Open: func(ctx context.Context, o sandbox.OpenOptions) (sandbox.BackendCloser, error) {
			b, err := New(ctx, options(o))
			if err != nil {
				return nil, err // not a typed nil in the interface
			}
			return b, nil
		},
		GC: func(ctx context.Context, o sandbox.OpenOptions, ro sandbox.ReapOptions) ([]sandbox.Reaped, error) {
			return GC(ctx, options(o), ro)
		},
	})
}

func options(o sandbox.OpenOptions) Options {
	return Options{Options: host.Options{Instance: o.Instance, MaxContainers: o.MaxContainers, ReapInterval: o.ReapInterval, Logger: o.Logger}}
}
