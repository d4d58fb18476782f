package kubernetes

import (
	"context"
	"fmt"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
)

func init() {
	sandbox.Register(sandbox.Registration{
		Name: sandbox.BackendKubernetes,
		Open: func(ctx context.Context, o sandbox.OpenOptions) (sandbox.BackendCloser, error) {
			cfg, err := config(o)
			if err != nil {
				return nil, err
			}
			if o.MaxContainers > 0 && cfg.MaxPods == 0 {
				cfg.MaxPods = o.MaxContainers
			}
			b, err := New(ctx, Options{Config: cfg, Instance: o.Instance, ReapInterval: o.ReapInterval, Logger: o.Logger})
			if err != nil {
				return nil, err // not a typed nil in the interface
			}
			return b, nil
		},
		GC: func(ctx context.Context, o sandbox.OpenOptions, ro sandbox.ReapOptions) ([]sandbox.Reaped, error) {
			cfg, err := config(o)
			if err != nil {
				return nil, err
			}
			return GC(ctx, cfg, ro)
		},
	})
}

// config is the kubernetes block carried in o.Config (a value or a
// pointer), or the defaults.
func config(o sandbox.OpenOptions) (k8sconfig.Config, error) {
	switch c := o.Config.(type) {
	case nil:
		return k8sconfig.Config{}, nil
	case k8sconfig.Config:
		return c, nil
	case *k8sconfig.Config:
		return *c, nil
	}
	return k8sconfig.Config{}, fmt.Errorf("%w: kubernetes backend config of type %T", sandbox.ErrInvalid, o.Config)
}
