package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/demo"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/sandbox/host"
	"github.com/rollout-rl/rollout/sandbox/image"
	"github.com/rollout-rl/rollout/trajectory"
)

// phases accumulates per-rollout phase timings from progress events.
type phases struct {
	mu                                        sync.Mutex
	n, infra, turns                           int
	sandbox, generation, tools, reward, total time.Duration
	// spans holds each rollout's start (its event's arrival minus its
	// total), sandbox acquisition and total, and firstEnd the arrival of
	// the first rollout's event: for the steady state of a run with reuse.
	spans    []rolloutSpan
	firstEnd time.Time
}

type rolloutSpan struct {
	start          time.Time
	sandbox, total time.Duration
}

// steadySandboxShare is the sandbox share over the rollouts that started
// after the first one ended: only they could find a sandbox another
// rollout had given back. It returns the share and how many rollouts it
// covers.
func (p *phases) steadySandboxShare() (float64, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var sb, tot time.Duration
	n := 0
	for _, e := range p.spans {
		if e.start.Before(p.firstEnd) {
			continue
		}
		sb += e.sandbox
		tot += e.total
		n++
	}
	if tot <= 0 {
		return 0, 0
	}
	return float64(sb) / float64(tot), n
}

func (p *phases) event(_ string, e runner.Event) {
	if e.Rollout == nil {
		return
	}
	ro := e.Rollout
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	if ro.Status != runner.StatusOK {
		p.infra++
	}
	t := ro.Timings
	now := time.Now()
	if p.firstEnd.IsZero() {
		p.firstEnd = now
	}
	p.spans = append(p.spans, rolloutSpan{start: now.Add(-t.Total), sandbox: t.SandboxStart, total: t.Total})
	p.sandbox += t.SandboxStart
	p.generation += t.Generation
	p.tools += t.Tools
	p.reward += t.Reward
	p.total += t.Total
	p.turns += ro.Result.TurnsUsed
}

func (p *phases) mean(d time.Duration) float64 {
	if p.n == 0 {
		return 0
	}
	return toMS(d / time.Duration(p.n))
}

// runnerRun is one end-to-end run of terminal-tasks.
type runnerRun struct {
	groups     int
	rollouts   int
	elapsed    time.Duration
	cpu        time.Duration
	daemonCPU  time.Duration
	daemonSeen bool
	ph         *phases
}

// ttRun is how runTerminalTasks runs: groups of 4, 8 at a time.
type ttRun struct {
	groups    int
	lat       sim.Latency
	noJournal bool
	reuse     bool   // read-only root, sandbox.reuse
	backend   string // sandbox.backend ("": docker)
	// serveWarm > -1 runs the job through rollout serve's shared Docker
	// backend (assemble.Shared) with --warm-sandboxes serveWarm, instead of a
	// backend of its own.
	serveWarm int
}

func runTerminalTasks(ctx context.Context, r *runCtx, ref string, o ttRun) (runnerRun, error) {
	dir, err := os.MkdirTemp("", "rollout-bench-runner-*")
	if err != nil {
		return runnerRun{}, err
	}
	defer os.RemoveAll(dir)
	ph := &phases{}
	do := demo.Options{Out: dir, Specs: []demo.Spec{{Env: "terminal-tasks", Groups: o.groups, GroupSize: 4, Image: ref}},
		Seed: 1, Latency: o.lat, Logger: r.logger, Progress: ph.event, SandboxInstance: "bench-runner-" + randomSuffix(),
		NoJournal: o.noJournal, Reuse: o.reuse, SandboxBackend: o.backend}
	if o.serveWarm > -1 {
		do.Shared = assemble.NewShared(docker.Options{Options: host.Options{Logger: r.logger, Instance: do.SandboxInstance}}, o.serveWarm)
		defer do.Shared.Close(context.WithoutCancel(ctx))
	}
	cpu0 := processCPU()
	d0, ok0 := daemonCPU()
	res, err := demo.Run(ctx, do)
	cpu := processCPU() - cpu0
	d1, ok1 := daemonCPU()
	if err != nil {
		return runnerRun{}, err
	}
	out := runnerRun{cpu: cpu, ph: ph, daemonCPU: d1 - d0, daemonSeen: ok0 && ok1}
	for _, x := range res {
		out.groups += x.Summary.Groups
		out.rollouts += x.Summary.Rollouts
		out.elapsed += x.Summary.Elapsed
	}
	if out.rollouts == 0 {
		return out, fmt.Errorf("terminal-tasks ran no rollouts")
	}
	return out, nil
}

func runRunner(ctx context.Context, r *runCtx) ([]Measure, error) {
	ref, err := image.EnsureBusybox(ctx)
	if err != nil {
		return nil, fmt.Errorf("busybox image: %w", err)
	}
	var out []Measure
	zero, err := runTerminalTasks(ctx, r, ref, ttRun{groups: r.n(8, 2), serveWarm: -1})
	if err != nil {
		return nil, fmt.Errorf("zero latency: %w", err)
	}
	n := float64(zero.rollouts)
	ph := zero.ph
	note := fmt.Sprintf("%d rollouts (groups of 4, %d infra-failed), %.1f turns/rollout, wall %s", zero.rollouts, ph.infra,
		float64(ph.turns)/float64(max(ph.n, 1)), zero.elapsed.Round(time.Millisecond))
	out = append(out,
		Measure{Name: "runner.rollouts_per_s", Value: ptr(sig(n / zero.elapsed.Seconds())), Note: note},
		Measure{Name: "runner.cpu_s_per_rollout", Value: ptr(sig(zero.cpu.Seconds() / n))},
	)
	if zero.daemonSeen {
		out = append(out, Measure{Name: "runner.docker_cpu_s_per_rollout", Value: ptr(sig(zero.daemonCPU.Seconds() / n)),
			Note: "container processes and shims not included"})
	} else {
		out = append(out, NotMeasured("runner.docker_cpu_s_per_rollout", "dockerd/containerd not visible in /proc"))
	}
	out = append(out, phaseMeasures("runner.phase_", "zero latency", ph)...)
	if tot := ph.mean(ph.total); tot > 0 {
		out = append(out, Measure{Name: "runner.phase_sandbox_share", Value: ptr(sig(ph.mean(ph.sandbox) / tot))})
	} else {
		out = append(out, NotMeasured("runner.phase_sandbox_share", "no rollout finished"))
	}

	// The same run on the runc backend: single-use sandboxes that runc
	// starts without the engine daemon.
	out = append(out, runcRunnerMeasures(ctx, r, ref, zero)...)

	// The same env with a read-only root and sandboxes reset in place
	// (sandbox.reuse), over more groups than run at once (8), so that
	// most rollouts find a reset sandbox, as in a long run.
	reuse, err := runTerminalTasks(ctx, r, ref, ttRun{groups: r.n(32, 4), reuse: true, serveWarm: -1})
	if err != nil {
		return out, fmt.Errorf("zero latency with reuse: %w", err)
	}
	rph := reuse.ph
	out = append(out, Measure{Name: "runner.reuse_rollouts_per_s", Value: ptr(sig(float64(reuse.rollouts) / reuse.elapsed.Seconds())),
		Baseline: ptr(sig(n / zero.elapsed.Seconds())), BaselineName: "runner.rollouts_per_s (single-use sandboxes), same bench run",
		Note: fmt.Sprintf("%d rollouts in %d groups of 4, 8 groups at a time, %d infra-failed, wall %s", reuse.rollouts, reuse.groups, rph.infra,
			reuse.elapsed.Round(time.Millisecond))})
	out = append(out, phaseMeasures("runner.reuse_phase_", "zero latency, sandboxes reset in place", rph)...)
	if tot := rph.mean(rph.total); tot > 0 {
		out = append(out, Measure{Name: "runner.reuse_phase_sandbox_share", Value: ptr(sig(rph.mean(rph.sandbox) / tot))})
	} else {
		out = append(out, NotMeasured("runner.reuse_phase_sandbox_share", "no rollout finished"))
	}
	if share, n := rph.steadySandboxShare(); n > 0 {
		out = append(out, Measure{Name: "runner.reuse_steady_sandbox_share", Value: ptr(sig(share)),
			Note: fmt.Sprintf("%d of %d rollouts started after the first one ended", n, rph.n)})
	} else {
		out = append(out, NotMeasured("runner.reuse_steady_sandbox_share", "no rollout started after the first one ended"))
	}

	// The reuse run's groups through rollout serve's shared backend: first
	// without a warm pool (every sandbox created on demand and single-use,
	// as serve ran them before it had one), then with its pool and reuse.
	cold, err := runTerminalTasks(ctx, r, ref, ttRun{groups: r.n(32, 4), serveWarm: 0})
	if err != nil {
		return out, fmt.Errorf("through serve's shared backend without a pool: %w", err)
	}
	served, err := runTerminalTasks(ctx, r, ref, ttRun{groups: r.n(32, 4), reuse: true, serveWarm: 64})
	if err != nil {
		return out, fmt.Errorf("through serve's shared backend with reuse: %w", err)
	}
	coldRate := float64(cold.rollouts) / cold.elapsed.Seconds()
	out = append(out,
		Measure{Name: "runner.serve_cold_rollouts_per_s", Value: ptr(sig(coldRate)),
			Note: fmt.Sprintf("%d rollouts, %d infra-failed, wall %s", cold.rollouts, cold.ph.infra, cold.elapsed.Round(time.Millisecond))},
		Measure{Name: "runner.serve_reuse_rollouts_per_s", Value: ptr(sig(float64(served.rollouts) / served.elapsed.Seconds())),
			Baseline: ptr(sig(coldRate)), BaselineName: "runner.serve_cold_rollouts_per_s, same bench run",
			Note: fmt.Sprintf("%d rollouts, %d infra-failed, wall %s", served.rollouts, served.ph.infra, served.elapsed.Round(time.Millisecond))},
	)
	if tot := served.ph.mean(served.ph.total); tot > 0 {
		out = append(out, Measure{Name: "runner.serve_reuse_sandbox_share", Value: ptr(sig(served.ph.mean(served.ph.sandbox) / tot)),
			Baseline: ptr(sig(cold.ph.mean(cold.ph.sandbox) / max(cold.ph.mean(cold.ph.total), 1e-9))), BaselineName: "the same share without the pool, same bench run"})
	} else {
		out = append(out, NotMeasured("runner.serve_reuse_sandbox_share", "no rollout finished"))
	}

	// Durability end to end: the same run with the journal off, then on,
	// alternating; groups/s from the runner's own elapsed time. Each run's
	// wall is mostly the engine creating and removing sandboxes, which
	// moves by ±10 % from run to run here: four pairs, so that the medians
	// hold the 5 % the target allows (two pairs and the suite's first run
	// read 0.892 and 0.994 in two full runs of the same code).
	// The writer also times every group's wait for its fsync: the cost
	// itself, free of the engine's run-to-run spread.
	var on, off []float64
	var waited, onWall time.Duration
	var waits int64
	for range r.n(4, 1) {
		for _, noJournal := range []bool{true, false} {
			g0, w0 := trajectory.DurableWaits()
			x, err := runTerminalTasks(ctx, r, ref, ttRun{groups: r.n(8, 2), noJournal: noJournal, serveWarm: -1})
			if err != nil {
				return out, fmt.Errorf("durability on/off: %w", err)
			}
			rate := float64(x.groups) / x.elapsed.Seconds()
			if noJournal {
				off = append(off, rate)
			} else {
				on = append(on, rate)
				g1, w1 := trajectory.DurableWaits()
				waits, waited, onWall = waits+g1-g0, waited+w1-w0, onWall+x.elapsed
			}
		}
	}
	out = append(out,
		Measure{Name: "runner.durable_groups_per_s", Value: ptr(sig(median(on))), Baseline: ptr(sig(median(off))),
			BaselineName: "the same run with durability off (no journal), same bench run",
			Note:         fmt.Sprintf("terminal-tasks on busybox, zero-latency simulator, median of %d runs on and %d off", len(on), len(off))},
		Measure{Name: "runner.durable_throughput_ratio", Value: ptr(sig(median(on) / median(off)))},
	)
	if waits > 0 {
		mean := waited / time.Duration(waits)
		wall := onWall / time.Duration(len(on))
		out = append(out, Measure{Name: "runner.durable_wait_ms_mean", Value: ptr(sig(toMS(mean))),
			Note: fmt.Sprintf("%d groups in %d runs with durability on, mean run wall %s", waits, len(on), wall.Round(time.Millisecond))})
	} else {
		out = append(out, NotMeasured("runner.durable_wait_ms_mean", "no group was written with durability on"))
	}

	real, err := runTerminalTasks(ctx, r, ref, ttRun{groups: r.n(4, 1), lat: sim.Latency{TTFT: 200 * time.Millisecond, PerToken: 30 * time.Millisecond},
		serveWarm: -1})
	if err != nil {
		return out, fmt.Errorf("realistic latency: %w", err)
	}
	n = float64(real.rollouts)
	out = append(out,
		Measure{Name: "runner.realistic_rollouts_per_s", Value: ptr(sig(n / real.elapsed.Seconds())),
			Note: fmt.Sprintf("%d rollouts, %d infra-failed, wall %s", real.rollouts, real.ph.infra, real.elapsed.Round(time.Millisecond))},
		Measure{Name: "runner.realistic_cpu_s_per_rollout", Value: ptr(sig(real.cpu.Seconds() / n))},
	)
	out = append(out, phaseMeasures("runner.realistic_phase_", "TTFT 200 ms + 30 ms/token", real.ph)...)
	return out, nil
}

// runcRunnerMeasures runs the zero-latency run again with sandbox.backend
// runc (baseline: the Docker run zero, same bench run); without root or
// runc the measures say why.
func runcRunnerMeasures(ctx context.Context, r *runCtx, ref string, zero runnerRun) []Measure {
	names := []string{"runner.runc_rollouts_per_s", "runner.runc_phase_sandbox_share"}
	rr, err := runTerminalTasks(ctx, r, ref, ttRun{groups: r.n(8, 2), serveWarm: -1, backend: sandbox.BackendRunc})
	if err == nil && rr.ph.mean(rr.ph.total) <= 0 {
		err = errors.New("no rollout finished")
	}
	if err != nil {
		return []Measure{NotMeasured(names[0], firstLine(err.Error())), NotMeasured(names[1], firstLine(err.Error()))}
	}
	zph, ph := zero.ph, rr.ph
	return []Measure{
		{Name: names[0], Value: ptr(sig(float64(rr.rollouts) / rr.elapsed.Seconds())),
			Baseline: ptr(sig(float64(zero.rollouts) / zero.elapsed.Seconds())), BaselineName: "runner.rollouts_per_s (the Docker backend), same bench run",
			Note: fmt.Sprintf("%d rollouts (groups of 4, %d infra-failed), wall %s; mean sandbox acquisition %.0f ms vs %.0f ms on Docker",
				rr.rollouts, ph.infra, rr.elapsed.Round(time.Millisecond), ph.mean(ph.sandbox), zph.mean(zph.sandbox))},
		{Name: names[1], Value: ptr(sig(ph.mean(ph.sandbox) / ph.mean(ph.total))),
			Baseline: ptr(sig(zph.mean(zph.sandbox) / max(zph.mean(zph.total), 1e-9))), BaselineName: "runner.phase_sandbox_share (the Docker backend), same bench run"},
	}
}

// phaseMeasures reports where a rollout's wall time went, per rollout
// (phases overlap nothing: they are sequential within a rollout).
func phaseMeasures(prefix, what string, p *phases) []Measure {
	desc := func(phase string) string { return "mean " + phase + " per rollout, " + what }
	return []Measure{
		{Name: prefix + "sandbox_start_ms", Unit: "ms", Value: ptr(p.mean(p.sandbox)), Description: desc("sandbox acquisition")},
		{Name: prefix + "generation_ms", Unit: "ms", Value: ptr(p.mean(p.generation)), Description: desc("time in the policy (all turns)")},
		{Name: prefix + "tools_ms", Unit: "ms", Value: ptr(p.mean(p.tools)), Description: desc("time in tool calls")},
		{Name: prefix + "reward_ms", Unit: "ms", Value: ptr(p.mean(p.reward)), Description: desc("reward computation")},
		{Name: prefix + "total_ms", Unit: "ms", Value: ptr(p.mean(p.total)), Description: desc("total")},
	}
}
