package host

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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rollout-rl/rollout/sandbox"
)

// Host admission: a sandbox starts only when the host has the memory its
// limit allows it to use and the disk its writable layer may fill, each
// plus a reserve. Short of either, a create waits (it never overcommits);
// a spec that could never fit is refused as invalid. Checked only for a
// local engine (the agent is bind-mounted), whose host is this one.

// hostProbe reads the host's available memory and the free space of the
// engine's data root; tests replace it.
type HostProbe interface {
	MemAvailable() (int64, error)
	MemTotal() (int64, error)
	DiskFree(path string) (int64, error)
}

type ProcHost struct{}

func (ProcHost) MemAvailable() (int64, error) { return Meminfo("MemAvailable:") }
func (ProcHost) MemTotal() (int64, error)     { return Meminfo("MemTotal:") }

func (ProcHost) DiskFree(path string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

func Meminfo(key string) (int64, error) {
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
type HostState struct {
	Once     sync.Once
	DataRoot string
}

// admitHost waits until the host's memory covers spec's limit plus
// memReserve and the disk of root (skipped when "") its disk limit plus
// diskReserve (block), or reports ErrUnavailable at once (!block).
func AdmitHost(ctx context.Context, probe HostProbe, log *slog.Logger, spec sandbox.Spec, root string, memReserve, diskReserve int64, block bool) error {
	needMem := spec.Limits.MemoryBytes + memReserve
	if total, err := probe.MemTotal(); err == nil && needMem > total {
		return fmt.Errorf("%w: memory limit %d MiB plus the host reserve %d MiB exceeds the host's memory (%d MiB)",
			sandbox.ErrInvalid, spec.Limits.MemoryBytes>>20, memReserve>>20, total>>20)
	}
	needDisk := spec.Limits.DiskBytes + diskReserve
	var waitedFor string
	for {
		short := ""
		if avail, err := probe.MemAvailable(); err == nil && avail < needMem {
			short = fmt.Sprintf("host memory: %d MiB available, a sandbox may use %d MiB plus a reserve of %d MiB",
				avail>>20, spec.Limits.MemoryBytes>>20, memReserve>>20)
		} else if root != "" {
			if free, err := probe.DiskFree(root); err == nil && free < needDisk {
				short = fmt.Sprintf("disk of %s: %d MiB free, a sandbox may write %d MiB plus a reserve of %d MiB",
					root, free>>20, spec.Limits.DiskBytes>>20, diskReserve>>20)
			}
		}
		if short == "" {
			return nil
		}
		if !block {
			return fmt.Errorf("%w: %s", sandbox.ErrUnavailable, short)
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
