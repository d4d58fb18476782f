package docker

import (
	"context"
	"time"

	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

func (d *Docker) engineDataRoot(ctx context.Context) string {
	d.host.Once.Do(func() {
		var info client.SystemInfoResult
		err := d.daemon(ctx, "info", 30*time.Second, func(ctx context.Context) (err error) {
			info, err = d.cli.Info(ctx, client.InfoOptions{})
			return err
		})
		if err == nil {
			d.host.DataRoot = info.Info.DockerRootDir
		}
	})
	return d.host.DataRoot
}

// admitHost waits until the host has room for spec (block) or reports
// ErrUnavailable at once (!block: warm-pool fills).
func (d *Docker) admitHost(ctx context.Context, spec sandbox.Spec, block bool) error {
	if !d.bind || d.opts.HostMemoryReserve < 0 {
		return nil
	}
	return host.AdmitHost(ctx, d.probe, d.log, spec, d.engineDataRoot(ctx), d.opts.HostMemoryReserve, d.opts.HostDiskReserve, block)
}
