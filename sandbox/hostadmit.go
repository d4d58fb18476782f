package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/moby/client"
	"github.com/prometheus/client_golang/prometheus"
)

// Host admission: a sandbox starts only when the host has the memory its
// limit allows it to use and the disk its writable layer may fill, each
// plus a reserve. Short of either, a create waits (it never overcommits);
// a spec that could never fit is refused as invalid. Checked only for a
// local engine (the agent is bind-mounted), whose host is this one.

// hostProbe reads the host's available memory and the free space of the
// engine's data root; tests replace it.
type hostProbe interface {
	memAvailable() (int64, error)
	memTotal() (int64, error)
	diskFree(path string) (int64, error)
}

type procHost struct{}

func (procHost) memAvailable() (int64, error) { return meminfo("MemAvailable:") }
func (procHost) memTotal() (int64, error)     { return meminfo("MemTotal:") }

func (procHost) diskFree(path string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

func meminfo(key string) (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, key); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo %s %w", key, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/meminfo: no %s", key)
}

// hostState is what admission needs from the engine once.
type hostState struct {
	once     sync.Once
	dataRoot string
}

func (d *Docker) engineDataRoot(ctx context.Context) string {
	d.host.once.Do(func() {
		var info client.SystemInfoResult
		err := d.daemon(ctx, "info", 30*time.Second, func(ctx context.Context) (err error) {
			info, err = d.cli.Info(ctx, client.InfoOptions{})
			return err
		})
		if err == nil {
			d.host.dataRoot = info.Info.DockerRootDir
		}
	})
	return d.host.dataRoot
}

// admitHost waits until the host has room for spec (block) or reports
// ErrUnavailable at once (!block: warm-pool fills).
func (d *Docker) admitHost(ctx context.Context, spec Spec, block bool) error {
	if !d.bind || d.opts.HostMemoryReserve < 0 {
		return nil
	}
	return admitHost(ctx, d.probe, d.log, spec, d.engineDataRoot(ctx), d.opts.HostMemoryReserve, d.opts.HostDiskReserve, block)
}

// admitHost waits until the host's memory covers spec's limit plus
// memReserve and the disk of root (skipped when "") its disk limit plus
// diskReserve (block), or reports ErrUnavailable at once (!block).
func admitHost(ctx context.Context, probe hostProbe, log *slog.Logger, spec Spec, root string, memReserve, diskReserve int64, block bool) error {
	needMem := spec.Limits.MemoryBytes + memReserve
	if total, err := probe.memTotal(); err == nil && needMem > total {
		return fmt.Errorf("%w: memory limit %d MiB plus the host reserve %d MiB exceeds the host's memory (%d MiB)",
			ErrInvalid, spec.Limits.MemoryBytes>>20, memReserve>>20, total>>20)
	}
	needDisk := spec.Limits.DiskBytes + diskReserve
	var waitedFor string
	for {
		short := ""
		if avail, err := probe.memAvailable(); err == nil && avail < needMem {
			short = fmt.Sprintf("host memory: %d MiB available, a sandbox may use %d MiB plus a reserve of %d MiB",
				avail>>20, spec.Limits.MemoryBytes>>20, memReserve>>20)
		} else if root != "" {
			if free, err := probe.diskFree(root); err == nil && free < needDisk {
				short = fmt.Sprintf("disk of %s: %d MiB free, a sandbox may write %d MiB plus a reserve of %d MiB",
					root, free>>20, spec.Limits.DiskBytes>>20, diskReserve>>20)
			}
		}
		if short == "" {
			return nil
		}
		if !block {
			return fmt.Errorf("%w: %s", ErrUnavailable, short)
		}
		if waitedFor != short {
			log.Warn("sandbox admission waits for host resources", "reason", short)
			waitedFor = short
		}
		metricHostWaits.Inc()
		t := time.NewTimer(500 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for host resources (%s): %w", short, ctx.Err())
		}
	}
}

var metricHostWaits = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "rollout_sandbox_host_admission_waits_total",
	Help: "Half-second waits of sandbox creates for host memory or disk.",
})

func init() { prometheus.MustRegister(metricHostWaits) }
