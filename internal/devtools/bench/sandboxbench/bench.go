package sandboxbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

// Measurement functions shared by the package benchmarks and `rollout bench
// sandbox`. They return raw samples; Summarize turns them into percentiles.

// Stats summarises latency samples.
type Stats struct {
	N                       int
	Min, P50, P90, P99, Max time.Duration
	Mean                    time.Duration
}

// Summarize computes nearest-rank percentiles of samples.
func Summarize(samples []time.Duration) Stats {
	if len(samples) == 0 {
		return Stats{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	pct := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return Stats{N: len(s), Min: s[0], P50: pct(0.50), P90: pct(0.90), P99: pct(0.99), Max: s[len(s)-1], Mean: sum / time.Duration(len(s))}
}

func (s Stats) String() string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/1e6) }
	return fmt.Sprintf("n=%d p50=%s p90=%s p99=%s min=%s max=%s", s.N, ms(s.P50), ms(s.P90), ms(s.P99), ms(s.Min), ms(s.Max))
}

// MeasureExec times n round trips of argv through the sandbox's channel.
func MeasureExec(ctx context.Context, s sandbox.Sandbox, n int, argv ...string) ([]time.Duration, error) {
	rt, _, err := MeasureExecSplit(ctx, s, n, argv...)
	return rt, err
}

// MeasureExecSplit is MeasureExec that also returns, per call, the time
// the agent itself reported for the command (ExecResult.Duration: the
// spawn, the command's run and the reaping, inside the sandbox), so that a
// round trip splits into the command's own cost and the channel's.
func MeasureExecSplit(ctx context.Context, s sandbox.Sandbox, n int, argv ...string) (roundTrips, inAgent []time.Duration, err error) {
	if len(argv) == 0 {
		argv = []string{"true"}
	}
	roundTrips = make([]time.Duration, 0, n)
	inAgent = make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		r, err := s.Exec(ctx, sandbox.ExecRequest{Argv: argv})
		if err != nil {
			return roundTrips, inAgent, err
		}
		if r.ExitCode != 0 {
			return roundTrips, inAgent, fmt.Errorf("%s exited %d: %s", strings.Join(argv, " "), r.ExitCode, r.Stderr)
		}
		roundTrips = append(roundTrips, time.Since(start))
		inAgent = append(inAgent, r.Duration)
	}
	return roundTrips, inAgent, nil
}

// ChannelShare is, per call of MeasureExecSplit, the round trip less the
// agent's own time: what the channel itself costs (framing, the transport,
// the agent's dispatch), free of the spawn.
func ChannelShare(roundTrips, inAgent []time.Duration) []time.Duration {
	out := make([]time.Duration, 0, min(len(roundTrips), len(inAgent)))
	for i := range min(len(roundTrips), len(inAgent)) {
		out = append(out, max(0, roundTrips[i]-inAgent[i]))
	}
	return out
}

// MeasureHostSpawn times n runs of the program at path with argv (argv[0]
// included) spawned by this process directly on the host, no sandbox, the
// way the agent spawns a command: its own process group, stdout and stderr
// on one pipe read to the end, then reaped. It is the machine's own floor
// under every exec round trip; a non-zero exit is an error.
func MeasureHostSpawn(ctx context.Context, n int, path string, argv ...string) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	var buf bytes.Buffer
	for range n {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		buf.Reset()
		cmd := &exec.Cmd{Path: path, Args: argv, Stdout: &buf, Stderr: &buf,
			SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
		start := time.Now()
		if err := cmd.Run(); err != nil {
			return out, fmt.Errorf("spawn %s: %w: %.200s", path, err, buf.Bytes())
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// MeasureDockerExecCLI times n runs of `docker exec <container> ARGV...`
// (default `true`) with the output read in full, the per-command path of
// CLI-based harnesses (the baseline for MeasureExec).
func MeasureDockerExecCLI(ctx context.Context, containerID string, n int, argv ...string) ([]time.Duration, error) {
	docker, err := exec.LookPath("docker")
	if err != nil {
		return nil, fmt.Errorf("docker CLI: %w", err)
	}
	if len(argv) == 0 {
		argv = []string{"true"}
	}
	args := append([]string{"exec", containerID}, argv...)
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if b, err := exec.CommandContext(ctx, docker, args...).CombinedOutput(); err != nil {
			return out, fmt.Errorf("docker exec: %v: %.200s", err, b)
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// MeasureCreate times n cold sandbox creations (create, start, agent
// handshake) through b, closing each sandbox afterwards.
func MeasureCreate(ctx context.Context, b sandbox.Backend, spec sandbox.Spec, n int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		s, err := b.Create(ctx, spec)
		if err != nil {
			return out, err
		}
		out = append(out, time.Since(start))
		if err := s.Close(ctx); err != nil {
			return out, err
		}
	}
	return out, nil
}

// MeasureDockerRun times n `docker run -d --network none IMAGE sleep 3600`
// (the baseline for MeasureCreate). Containers carry the given labels and
// are removed after each sample.
func MeasureDockerRun(ctx context.Context, cli *client.Client, image string, labels map[string]string, n int) ([]time.Duration, error) {
	docker, err := exec.LookPath("docker")
	if err != nil {
		return nil, fmt.Errorf("docker CLI: %w", err)
	}
	args := []string{"run", "-d", "--network", "none", "--log-driver", "none"}
	for k, v := range labels {
		args = append(args, "--label", k+"="+v)
	}
	args = append(args, image, "sleep", "3600")
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		b, err := exec.CommandContext(ctx, docker, args...).Output()
		elapsed := time.Since(start)
		id := strings.TrimSpace(string(b))
		if id != "" {
			_, _ = cli.ContainerRemove(context.WithoutCancel(ctx), id, client.ContainerRemoveOptions{Force: true})
		}
		if err != nil {
			return out, fmt.Errorf("docker run: %w", err)
		}
		out = append(out, elapsed)
	}
	return out, nil
}

// MeasurePoolAcquire warms n sandboxes of spec, then times n Acquires (all
// served from the pool) and closes the sandboxes.
func MeasurePoolAcquire(ctx context.Context, p *sandbox.Pool, spec sandbox.Spec, n int) ([]time.Duration, error) {
	if err := p.Warm(spec, n); err != nil {
		return nil, err
	}
	for p.Ready(spec) < n {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := p.Warm(spec, 0); err != nil {
		return nil, err
	}
	out := make([]time.Duration, 0, n)
	var got []sandbox.Sandbox
	defer func() {
		for _, s := range got {
			_ = s.Close(ctx)
		}
	}()
	for range n {
		start := time.Now()
		s, err := p.Acquire(ctx, spec)
		if err != nil {
			return out, err
		}
		out = append(out, time.Since(start))
		got = append(got, s)
	}
	return out, nil
}

// PeakResult is the outcome of MeasurePeak.
type PeakResult struct {
	Target  int
	Alive   int           // created and answering an exec at the same time
	Elapsed time.Duration // to create all of them
	Err     error         // first failure, if any
	// Memory while all were alive (local engines; zero when not visible):
	// the drop of the host's MemAvailable from before the first create,
	// and the proportional set size (PSS) of the sandboxes' own processes
	// (init, agent) and of their containerd shims, summed.
	MemAvailableDrop int64
	ContainerPSS     int64
	ShimPSS          int64
	Shims            int // shim processes found for the sandboxes
}

// MeasurePeak creates target sandboxes concurrently, checks that every one
// runs a command while all are alive, and removes them.
func MeasurePeak(ctx context.Context, b sandbox.Backend, spec sandbox.Spec, target, parallel int) PeakResult {
	if parallel <= 0 {
		parallel = 8
	}
	res := PeakResult{Target: target}
	memBefore, memErr := host.Meminfo("MemAvailable:")
	start := time.Now()
	var mu sync.Mutex
	var all []sandbox.Sandbox
	var errs []error
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for range target {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			s, err := b.Create(ctx, spec)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			all = append(all, s)
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	alive := 0
	for _, s := range all {
		if r, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err == nil && r.ExitCode == 0 {
			alive++
		} else if err != nil {
			errs = append(errs, err)
		}
	}
	res.Alive = alive
	if memAfter, err := host.Meminfo("MemAvailable:"); err == nil && memErr == nil {
		res.MemAvailableDrop = memBefore - memAfter
	}
	ids := map[string]bool{}
	for _, s := range all {
		if d, ok := s.(interface{ ID() string }); ok && d.ID() != "" {
			ids[d.ID()] = true
		}
	}
	res.ContainerPSS, res.ShimPSS, res.Shims = containerMemory(ids)
	// Removal runs two at a time: Docker 20.10's daemon can deadlock when
	// many containers are torn down at once (moby/moby#42545), and it
	// did so here with eight.
	rm := make(chan struct{}, 2)
	for _, s := range all {
		wg.Go(func() {
			rm <- struct{}{}
			defer func() { <-rm }()
			_ = s.Close(context.WithoutCancel(ctx))
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		res.Err = fmt.Errorf("%d failures, first: %w", len(errs), errors.Join(errs[0]))
	}
	return res
}

// ChurnResult is the outcome of one churn measurement: Ops full
// lifecycles in Elapsed wall time, Concurrency at a time.
type ChurnResult struct {
	Ops         int
	Concurrency int
	Elapsed     time.Duration
}

// PerSecond is the completed lifecycles per second of wall time.
func (c ChurnResult) PerSecond() float64 {
	if c.Elapsed <= 0 {
		return 0
	}
	return float64(c.Ops) / c.Elapsed.Seconds()
}

// Add merges two results of the same concurrency (rounds of a run).
func (c ChurnResult) Add(o ChurnResult) ChurnResult {
	return ChurnResult{Ops: c.Ops + o.Ops, Concurrency: max(c.Concurrency, o.Concurrency), Elapsed: c.Elapsed + o.Elapsed}
}

// churn runs op n times, concurrency at a time, and stops at the first
// failure.
func churn(ctx context.Context, n, concurrency int, op func(ctx context.Context) error) (ChurnResult, error) {
	concurrency = max(1, concurrency)
	res := ChurnResult{Concurrency: concurrency}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	var first error
	next := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for range concurrency {
		wg.Go(func() {
			for range next {
				if ctx.Err() != nil {
					continue // a failure stopped the run; drain
				}
				if err := op(ctx); err != nil {
					mu.Lock()
					if first == nil {
						first = err
						cancel()
					}
					mu.Unlock()
					continue
				}
				mu.Lock()
				res.Ops++
				mu.Unlock()
			}
		})
	}
feed:
	for range n {
		select {
		case next <- struct{}{}:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res, first
}

// MeasureChurn creates n sandboxes of spec through b, concurrency at a
// time, runs `true` in each once and closes it: the sandbox churn of a run
// with fast turns.
func MeasureChurn(ctx context.Context, b sandbox.Backend, spec sandbox.Spec, n, concurrency int) (ChurnResult, error) {
	return churn(ctx, n, concurrency, func(ctx context.Context) error {
		s, err := b.Create(ctx, spec)
		if err != nil {
			return err
		}
		r, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
		cerr := s.Close(context.WithoutCancel(ctx))
		switch {
		case err != nil:
			return err
		case r.ExitCode != 0:
			return fmt.Errorf("true exited %d: %s", r.ExitCode, r.Stderr)
		}
		return cerr
	})
}

// MeasureResetChurn is MeasureChurn through a pool that resets used
// sandboxes in place (PoolOptions.Reuse; spec gets a read-only root). The
// pool first serves concurrency sandboxes that are not counted, so the
// figure is a long run's steady state, where every Acquire finds a reset
// sandbox. It fails when a reset failed (the pool would have created
// instead).
func MeasureResetChurn(ctx context.Context, d sandbox.PoolSource, spec sandbox.Spec, n, concurrency int) (ChurnResult, error) {
	spec.Limits.ReadOnlyRoot = true
	p := sandbox.NewPool(d, sandbox.PoolOptions{Reuse: true, MaxIdle: max(concurrency, 1)})
	defer p.Close(context.WithoutCancel(ctx))
	if _, err := MeasureChurn(ctx, p, spec, concurrency, concurrency); err != nil {
		return ChurnResult{}, fmt.Errorf("fill the pool: %w", err)
	}
	res, err := MeasureChurn(ctx, p, spec, n, concurrency)
	if err != nil {
		return res, err
	}
	if ok, failed := p.Resets(); failed > 0 || ok < int64(n) {
		return res, fmt.Errorf("%d resets in place, %d failed, for %d lifecycles", ok, failed, n)
	}
	return res, nil
}

// MeasureDockerRunChurn runs n `docker run -d --network none --log-driver
// none IMAGE sleep 3600 && docker rm -f ID` through the CLI, concurrency
// at a time (the baseline for MeasureChurn). Containers carry labels.
func MeasureDockerRunChurn(ctx context.Context, image string, labels map[string]string, n, concurrency int) (ChurnResult, error) {
	docker, err := exec.LookPath("docker")
	if err != nil {
		return ChurnResult{}, fmt.Errorf("docker CLI: %w", err)
	}
	args := []string{"run", "-d", "--network", "none", "--log-driver", "none"}
	for k, v := range labels {
		args = append(args, "--label", k+"="+v)
	}
	args = append(args, image, "sleep", "3600")
	return churn(ctx, n, concurrency, func(ctx context.Context) error {
		b, err := exec.CommandContext(ctx, docker, args...).Output()
		id := strings.TrimSpace(string(b))
		if id != "" {
			if out, rerr := exec.CommandContext(context.WithoutCancel(ctx), docker, "rm", "-f", id).CombinedOutput(); rerr != nil && err == nil {
				err = fmt.Errorf("docker rm -f: %v: %.200s", rerr, out)
			}
		}
		if err != nil {
			return fmt.Errorf("docker run: %w", err)
		}
		return nil
	})
}

// containerMemory sums the PSS of the processes in the given containers'
// cgroups and of the containerd shims serving them, from /proc (local
// engines; a nested engine's processes are host processes too).
func containerMemory(ids map[string]bool) (ctrPSS, shimPSS int64, shims int) {
	if len(ids) == 0 {
		return 0, 0, 0
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0, 0
	}
	for _, e := range ents {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + pid + "/cmdline")
		if err != nil {
			continue
		}
		if strings.Contains(string(cmd), "containerd-shim") {
			args := strings.Split(string(cmd), "\x00")
			for i, a := range args {
				if a == "-id" && i+1 < len(args) && ids[args[i+1]] {
					shimPSS += pss(pid)
					shims++
				}
			}
			continue
		}
		cg, err := os.ReadFile("/proc/" + pid + "/cgroup")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(cg), "\n") {
			if i := strings.LastIndexByte(line, '/'); i >= 0 {
				id := strings.TrimSuffix(strings.TrimPrefix(line[i+1:], "docker-"), ".scope")
				if ids[id] {
					ctrPSS += pss(pid)
					break
				}
			}
		}
	}
	return ctrPSS, shimPSS, shims
}

// pss is a process's proportional set size in bytes (0 when unreadable).
func pss(pid string) int64 {
	b, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pss:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
