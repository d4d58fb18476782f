package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Between suites the machine is given time to settle: a suite that ends
// with a thousand sandboxes torn down leaves the engine, containerd and
// the kernel removing them for a minute or more, and the next suite's
// end-to-end rows (the runner's sandbox share, durability's throughput
// ratio) measured that teardown instead of the project (a full run of
// 5b18e8d read runner.reuse_steady_sandbox_share 0.734 right after the
// sandbox suite, 0.143 when the runner suite ran alone minutes later).
// The first suite waits too: whatever ran before the bench (a build, an
// earlier run's teardown) is the same disturbance (a full run of 1a0e809
// started at load average 12 and read the parser rows 20-40 % low).
const (
	settleBusyMax  = 0.35             // share of all CPUs busy (not idle, not waiting for I/O)
	settleQuiet    = 3                // consecutive quiet samples
	settleInterval = time.Second      // one sample
	settleMaxWait  = 3 * time.Minute  // then the suite runs anyway, and the report says so
	settleMaxQuick = 10 * time.Second // --quick
)

// cpuSampler returns the machine's cumulative busy and total CPU time in
// any unit.
type cpuSampler func() (busy, total uint64, err error)

// procStat reads the aggregate "cpu" line of /proc/stat: busy is every
// column but idle and iowait.
func procStat() (busy, total uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	return parseProcStat(string(b))
}

func parseProcStat(s string) (busy, total uint64, err error) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: first line %q is not the aggregate cpu line", line)
	}
	var idle uint64
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: column %d: %w", i+1, err)
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return total - idle, total, nil
}

// settled is what settle saw.
type settled struct {
	Waited time.Duration
	Busy   float64 // busy share of the last sample
	Quiet  bool    // false: gave up at maxWait
}

// settle waits until quiet consecutive samples, interval apart, each find
// at most busyMax of the machine's CPU busy, or until maxWait.
func settle(ctx context.Context, sample cpuSampler, interval, maxWait time.Duration, busyMax float64, quiet int) (settled, error) {
	start := time.Now()
	b0, t0, err := sample()
	if err != nil {
		return settled{}, err
	}
	var out settled
	run := 0
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			out.Waited = time.Since(start)
			return out, ctx.Err()
		case <-t.C:
		}
		b1, t1, err := sample()
		if err != nil {
			return out, err
		}
		if t1 > t0 {
			out.Busy = float64(b1-b0) / float64(t1-t0)
		}
		b0, t0 = b1, t1
		if out.Busy <= busyMax {
			run++
		} else {
			run = 0
		}
		out.Waited = time.Since(start)
		if run >= quiet {
			out.Quiet = true
			return out, nil
		}
		if out.Waited >= maxWait {
			return out, nil
		}
	}
}

// settleBefore waits for the machine before a suite and says how long it
// took; it never fails the run (without /proc/stat it does not wait).
func (r *runCtx) settleBefore(ctx context.Context, suite string) (time.Duration, error) {
	limit := settleMaxWait
	if r.quick() {
		limit = settleMaxQuick
	}
	s, err := settle(ctx, procStat, settleInterval, limit, settleBusyMax, settleQuiet)
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return s.Waited, err
	case err != nil:
		r.printf("    (not waiting for the machine to settle: %v)", err)
	case !s.Quiet:
		r.printf("    (machine still %.0f%% busy after %s; %s runs anyway)", 100*s.Busy, s.Waited.Round(time.Second), suite)
	case s.Waited > 5*time.Second:
		r.printf("    (waited %s for the machine to settle)", s.Waited.Round(time.Second))
	}
	return s.Waited, nil
}
