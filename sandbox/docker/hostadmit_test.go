package docker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

type fakeHost struct {
	avail, total, free atomic.Int64
}

func (f *fakeHost) MemAvailable() (int64, error)   { return f.avail.Load(), nil }
func (f *fakeHost) MemTotal() (int64, error)       { return f.total.Load(), nil }
func (f *fakeHost) DiskFree(string) (int64, error) { return f.free.Load(), nil }

func hostDocker(h host.HostProbe) *Docker {
	d := &Docker{bind: true, probe: h, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		opts: Options{Options: host.Options{HostMemoryReserve: 512 << 20, HostDiskReserve: 2 << 30}}}
	d.host.Once.Do(func() {})
	d.host.DataRoot = "/var/lib/docker"
	return d
}

// Host admission waits while memory or disk is short, proceeds when room
// appears, refuses at once a limit the host could never hold, and never
// waits for a warm-pool fill.
func TestHostAdmission(t *testing.T) {
	h := &fakeHost{}
	h.total.Store(8 << 30)
	h.avail.Store(1 << 30)
	h.free.Store(100 << 30)
	d := hostDocker(h)
	spec := sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 2 << 30, DiskBytes: 1 << 30}}

	if err := d.admitHost(context.Background(), sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 8 << 30}}, true); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("memory limit of the whole host: %v, want ErrInvalid", err)
	}
	if err := d.admitHost(context.Background(), spec, false); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "host memory") {
		t.Errorf("pool fill with 1 GiB available for 2 GiB: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	if err := d.admitHost(ctx, spec, true); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("create with memory short: %v, want it to wait until its ctx ends", err)
	}
	done := make(chan error, 1)
	go func() { done <- d.admitHost(context.Background(), spec, true) }()
	h.avail.Store(4 << 30)
	if err := <-done; err != nil {
		t.Errorf("once memory is there: %v", err)
	}
	h.free.Store(2 << 30)
	if err := d.admitHost(context.Background(), spec, false); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "disk") {
		t.Errorf("disk short: %v", err)
	}
}
