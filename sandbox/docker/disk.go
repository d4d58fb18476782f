package docker

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

var _ sandbox.LimitsReporter = (*dockerSandbox)(nil)

// Applied returns the limits read back from the created container.
func (s *dockerSandbox) Applied() sandbox.Applied { return s.applied }

// inspectCreated reads what the engine made of a container: the applied
// limits, and the host path of its writable layer (the disk watchdog
// measures it; empty when the engine's files are not on this host).
func (d *Docker) inspectCreated(ctx context.Context, id string, spec sandbox.Spec) (sandbox.Applied, string, error) {
	var res client.ContainerInspectResult
	err := d.daemon(ctx, "container_inspect", 30*time.Second, func(cctx context.Context) (err error) {
		res, err = d.cli.ContainerInspect(cctx, id, client.ContainerInspectOptions{})
		return err
	})
	if err != nil {
		return sandbox.Applied{}, "", fmt.Errorf("%w: inspect created container: %v", sandbox.ErrUnavailable, err)
	}
	a := sandbox.Applied{DiskBytes: spec.Limits.DiskBytes, Network: spec.Network, Runtime: spec.Runtime, Backend: sandbox.BackendDocker}
	if hc := res.Container.HostConfig; hc != nil {
		a.MemoryBytes = hc.Memory
		a.CPUs = float64(hc.NanoCPUs) / 1e9
		if hc.PidsLimit != nil {
			a.PIDs = *hc.PidsLimit
		}
		a.ReadOnlyRoot = hc.ReadonlyRootfs
		if hc.Runtime != "" {
			a.Runtime = hc.Runtime
		}
	}
	if a.Runtime == "" {
		a.Runtime = sandbox.RuntimeRunc
	}
	upper := ""
	if gd := res.Container.GraphDriver; gd != nil && d.bind {
		if u := gd.Data["UpperDir"]; u != "" {
			if _, err := os.Stat(u); err == nil {
				upper = u
			}
		}
	}
	return a, upper, nil
}

// The disk watchdog. Overlay storage on ext4 (overlay2, fuse-overlayfs)
// has no per-container quota (--storage-opt size needs xfs with pquota),
// so the writable layer of a sandbox is measured on the host: every
// DiskCheckInterval the watchdog sums the allocated blocks under the
// container's upper dir and removes a sandbox past Limits.DiskBytes, with
// the reason "disk limit exceeded". Writable tmpfs mounts (read-only root)
// are bounded by the kernel through their size= option instead. The bound
// is enforced within one interval: a writer at disk speed can overshoot
// by what it writes in that time.

// diskLoop runs the watchdog until ctx ends.
func (d *Docker) diskLoop(ctx context.Context) {
	host.Every(ctx, d.opts.DiskCheckInterval, func() { d.checkDisks(ctx) })
}

// checkDisks measures every live sandbox with a known upper dir.
func (d *Docker) checkDisks(ctx context.Context) {
	d.mu.Lock()
	watched := make([]host.LiveHandle, 0, len(d.live))
	for _, s := range d.live {
		watched = append(watched, s)
	}
	d.mu.Unlock()
	host.CheckDisks(ctx, watched, d.log)
}

func (s *dockerSandbox) Expiry(now time.Time) string {
	return host.Expiry(s.spec.Limits, now, s.created, s.LastUsed.Load(), s.Pooled.Load())
}

func (s *dockerSandbox) DiskTarget() (string, int64) { return s.upperDir, s.spec.Limits.DiskBytes }
func (s *dockerSandbox) SetDiskUsed(n int64)         { s.diskUsed.Store(n) }
func (s *dockerSandbox) Evict(ctx context.Context, why string) error {
	s.Reason.Store(why)
	return s.Close(ctx)
}
