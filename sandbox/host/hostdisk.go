package host

import (
	"context"
	"errors"
	"fmt"
	"github.com/rollout-rl/rollout/sandbox"
	"io/fs"
	"log/slog"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// every runs fn every interval until ctx ends.
func Every(ctx context.Context, interval time.Duration, fn func()) {
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

// liveHandle is what a backend's housekeeping needs of a live sandbox
// handle (Docker's, runc's): the disk watchdog (checkDisks) and the idle
// and lifetime limits (expireLimits).
type LiveHandle interface {
	// diskTarget is the host directory of the writable layer ("" unknown)
	// and the limit on it.
	DiskTarget() (dir string, limit int64)
	// expiry names the limit the sandbox is past at now ("lifetime",
	// "idle"), or "".
	Expiry(now time.Time) string
	IsClosing() bool
	SetDiskUsed(n int64)
	Short() string
	// evict closes the sandbox, giving why as the reason later calls see.
	Evict(ctx context.Context, why string) error
}

// expiry is liveHandle.expiry of a sandbox with limits l, created at
// created, last used at lastUsed (unix ns), waiting in a warm pool when
// pooled (exempt from the idle limit).
func Expiry(l sandbox.Limits, now, created time.Time, lastUsed int64, pooled bool) string {
	switch {
	case l.MaxLifetime > 0 && now.Sub(created) > l.MaxLifetime:
		return "lifetime"
	case l.IdleTimeout > 0 && !pooled && now.Sub(time.Unix(0, lastUsed)) > l.IdleTimeout:
		return "idle"
	}
	return ""
}

// expireLimits closes the handles past their idle or lifetime limit.
func ExpireLimits(ctx context.Context, live []LiveHandle, log *slog.Logger) {
	now := time.Now()
	for _, s := range live {
		why := s.Expiry(now)
		if why == "" || s.IsClosing() {
			continue
		}
		sandbox.MetricReaped.WithLabelValues(why).Inc()
		log.Info("closing sandbox past its limit", "container", s.Short(), "reason", why)
		if err := s.Evict(ctx, fmt.Sprintf("removed by the reaper: %s limit", why)); err != nil {
			log.Warn("close expired sandbox", "container", s.Short(), "err", err)
		}
	}
}

// checkDisks measures the writable layer of every watched sandbox, four
// at a time, and evicts those past their limit.
func CheckDisks(ctx context.Context, watched []LiveHandle, log *slog.Logger) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, s := range watched {
		dir, limit := s.DiskTarget()
		if dir == "" || limit <= 0 || s.IsClosing() {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			used, err := dirUsage(dir, limit)
			if err != nil {
				if !errors.Is(err, fs.ErrNotExist) {
					log.Debug("disk watchdog: measure", "container", s.Short(), "err", err)
				}
				return
			}
			s.SetDiskUsed(used)
			if used <= limit || s.IsClosing() || ctx.Err() != nil {
				return
			}
			sandbox.MetricReaped.WithLabelValues("disk").Inc()
			log.Warn("removing sandbox past its disk limit", "container", s.Short(), "used_mib", used>>20, "limit_mib", limit>>20)
			why := fmt.Sprintf("disk limit exceeded: the sandbox wrote more than %d MiB (limit %d MiB)", used>>20, limit>>20)
			if err := s.Evict(context.WithoutCancel(ctx), why); err != nil {
				log.Warn("close sandbox past its disk limit", "container", s.Short(), "err", err)
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
