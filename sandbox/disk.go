package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/moby/moby/client"
)

// Applied are the limits a sandbox's container was actually created with,
// read back from the engine (ContainerInspect), for manifests.
type Applied struct {
	MemoryBytes int64
	CPUs        float64
	PIDs        int64
	// DiskBytes is the writable-layer and tmpfs bound; the project enforces
	// it (tmpfs size, disk watchdog), not the engine.
	DiskBytes    int64
	ReadOnlyRoot bool
	Network      string // the policy: none, bridge (egress only) or open
	Runtime      string // OCI runtime: runc, runsc
}

// LimitsReporter is implemented by sandboxes that know the limits their
// container was created with (the Docker backend's do).
type LimitsReporter interface {
	Applied() Applied
}

var _ LimitsReporter = (*dockerSandbox)(nil)

// Applied returns the limits read back from the created container.
func (s *dockerSandbox) Applied() Applied { return s.applied }

// inspectCreated reads what the engine made of a container: the applied
// limits, and the host path of its writable layer (the disk watchdog
// measures it; empty when the engine's files are not on this host).
func (d *Docker) inspectCreated(ctx context.Context, id string, spec Spec) (Applied, string, error) {
	var res client.ContainerInspectResult
	err := d.daemon(ctx, "container_inspect", 30*time.Second, func(cctx context.Context) (err error) {
		res, err = d.cli.ContainerInspect(cctx, id, client.ContainerInspectOptions{})
		return err
	})
	if err != nil {
		return Applied{}, "", fmt.Errorf("%w: inspect created container: %v", ErrUnavailable, err)
	}
	a := Applied{DiskBytes: spec.Limits.DiskBytes, Network: spec.Network, Runtime: spec.Runtime}
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
		a.Runtime = RuntimeRunc
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
	t := time.NewTicker(d.opts.DiskCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.checkDisks(ctx)
	}
}

// checkDisks measures every live sandbox with a known upper dir.
func (d *Docker) checkDisks(ctx context.Context) {
	d.mu.Lock()
	var watched []*dockerSandbox
	for _, s := range d.live {
		if s.upperDir != "" && s.spec.Limits.DiskBytes > 0 && !s.closing.Load() {
			watched = append(watched, s)
		}
	}
	d.mu.Unlock()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, s := range watched {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			limit := s.spec.Limits.DiskBytes
			used, err := dirUsage(s.upperDir, limit)
			if err != nil {
				if !errors.Is(err, fs.ErrNotExist) {
					d.log.Debug("disk watchdog: measure", "container", s.short(), "err", err)
				}
				return
			}
			s.diskUsed.Store(used)
			if used <= limit || s.closing.Load() || ctx.Err() != nil {
				return
			}
			s.reason.Store(fmt.Sprintf("disk limit exceeded: the sandbox wrote more than %d MiB (limit %d MiB)", used>>20, limit>>20))
			metricReaped.WithLabelValues("disk").Inc()
			d.log.Warn("removing sandbox past its disk limit", "container", s.short(), "used_mib", used>>20, "limit_mib", limit>>20)
			if err := s.Close(context.WithoutCancel(ctx)); err != nil {
				d.log.Warn("close sandbox past its disk limit", "container", s.short(), "err", err)
			}
		})
	}
	wg.Wait()
}

// dirUsage sums the allocated bytes of the files under root (hard links
// counted once), stopping early once past limit. Files vanishing during
// the walk are skipped.
func dirUsage(root string, limit int64) (int64, error) {
	var total int64
	seen := map[uint64]bool{}
	errStop := errors.New("past limit")
	err := filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p != root {
				return nil
			}
			return err
		}
		info, err := de.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			total += info.Size()
		} else {
			if st.Nlink > 1 && !info.IsDir() {
				if seen[st.Ino] {
					return nil
				}
				seen[st.Ino] = true
			}
			total += st.Blocks * 512
		}
		if total > limit {
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return total, err
	}
	return total, nil
}
