package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
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
	// Backend is the backend that made the sandbox: BackendDocker,
	// BackendRunc or BackendKubernetes (the first two both run runc).
	Backend string
}

// LimitsReporter is implemented by sandboxes that know the limits their
// container was created with (the Docker, runc and Kubernetes backends'
// do).
type LimitsReporter interface {
	Applied() Applied
}

var (
	_ LimitsReporter = (*dockerSandbox)(nil)
	_ LimitsReporter = (*k8sSandbox)(nil)
)

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
	a := Applied{DiskBytes: spec.Limits.DiskBytes, Network: spec.Network, Runtime: spec.Runtime, Backend: BackendDocker}
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
	every(ctx, d.opts.DiskCheckInterval, func() { d.checkDisks(ctx) })
}

// every runs fn every interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

// checkDisks measures every live sandbox with a known upper dir.
func (d *Docker) checkDisks(ctx context.Context) {
	d.mu.Lock()
	watched := make([]liveHandle, 0, len(d.live))
	for _, s := range d.live {
		watched = append(watched, s)
	}
	d.mu.Unlock()
	checkDisks(ctx, watched, d.log)
}

// liveHandle is what a backend's housekeeping needs of a live sandbox
// handle (Docker's, runc's): the disk watchdog (checkDisks) and the idle
// and lifetime limits (expireLimits).
type liveHandle interface {
	// diskTarget is the host directory of the writable layer ("" unknown)
	// and the limit on it.
	diskTarget() (dir string, limit int64)
	// expiry names the limit the sandbox is past at now ("lifetime",
	// "idle"), or "".
	expiry(now time.Time) string
	isClosing() bool
	setDiskUsed(n int64)
	short() string
	// evict closes the sandbox, giving why as the reason later calls see.
	evict(ctx context.Context, why string) error
}

// expiry is liveHandle.expiry of a sandbox with limits l, created at
// created, last used at lastUsed (unix ns), waiting in a warm pool when
// pooled (exempt from the idle limit).
func expiry(l Limits, now, created time.Time, lastUsed int64, pooled bool) string {
	switch {
	case l.MaxLifetime > 0 && now.Sub(created) > l.MaxLifetime:
		return "lifetime"
	case l.IdleTimeout > 0 && !pooled && now.Sub(time.Unix(0, lastUsed)) > l.IdleTimeout:
		return "idle"
	}
	return ""
}

// expireLimits closes the handles past their idle or lifetime limit.
func expireLimits(ctx context.Context, live []liveHandle, log *slog.Logger) {
	now := time.Now()
	for _, s := range live {
		why := s.expiry(now)
		if why == "" || s.isClosing() {
			continue
		}
		metricReaped.WithLabelValues(why).Inc()
		log.Info("closing sandbox past its limit", "container", s.short(), "reason", why)
		if err := s.evict(ctx, fmt.Sprintf("removed by the reaper: %s limit", why)); err != nil {
			log.Warn("close expired sandbox", "container", s.short(), "err", err)
		}
	}
}

func (s *dockerSandbox) expiry(now time.Time) string {
	return expiry(s.spec.Limits, now, s.created, s.lastUsed.Load(), s.pooled.Load())
}

func (s *dockerSandbox) diskTarget() (string, int64) { return s.upperDir, s.spec.Limits.DiskBytes }
func (s *dockerSandbox) isClosing() bool             { return s.closing.Load() }
func (s *dockerSandbox) setDiskUsed(n int64)         { s.diskUsed.Store(n) }
func (s *dockerSandbox) evict(ctx context.Context, why string) error {
	s.reason.Store(why)
	return s.Close(ctx)
}

// checkDisks measures the writable layer of every watched sandbox, four
// at a time, and evicts those past their limit.
func checkDisks(ctx context.Context, watched []liveHandle, log *slog.Logger) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, s := range watched {
		dir, limit := s.diskTarget()
		if dir == "" || limit <= 0 || s.isClosing() {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			used, err := dirUsage(dir, limit)
			if err != nil {
				if !errors.Is(err, fs.ErrNotExist) {
					log.Debug("disk watchdog: measure", "container", s.short(), "err", err)
				}
				return
			}
			s.setDiskUsed(used)
			if used <= limit || s.isClosing() || ctx.Err() != nil {
				return
			}
			metricReaped.WithLabelValues("disk").Inc()
			log.Warn("removing sandbox past its disk limit", "container", s.short(), "used_mib", used>>20, "limit_mib", limit>>20)
			why := fmt.Sprintf("disk limit exceeded: the sandbox wrote more than %d MiB (limit %d MiB)", used>>20, limit>>20)
			if err := s.evict(context.WithoutCancel(ctx), why); err != nil {
				log.Warn("close sandbox past its disk limit", "container", s.short(), "err", err)
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
