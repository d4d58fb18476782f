package bench

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/bench/inferencebench"
	"github.com/rollout-rl/rollout/internal/devtools/bench/loopbench"
)

func runInference(ctx context.Context, r *runCtx) ([]Measure, error) {
	srv, err := sim.Start(ctx, sim.Config{Family: "hermes"})
	if err != nil {
		return nil, fmt.Errorf("start simulator: %w", err)
	}
	defer srv.Close()
	conc := 4096
	res, err := inferencebench.MeasureOverhead(ctx, inferencebench.Config{URL: srv.URL, Calls: r.n(3000, 300), Concurrency: conc})
	if err != nil {
		return nil, err
	}
	raw := "bare POST of the same pre-encoded body through the client's own transport, alternating with the client, same run"
	turns := r.n(2000, 200)
	vt, err := turnCost(ctx, r, inference.BackendVLLM, sim.EngineVLLM, turns)
	if err != nil {
		return nil, fmt.Errorf("vllm turn cost: %w", err)
	}
	lt, err := turnCost(ctx, r, inference.BackendLlamaCpp, sim.EngineLlamaCpp, turns)
	if err != nil {
		return nil, fmt.Errorf("llamacpp turn cost: %w", err)
	}
	vllmBase := "vllm tokens backend on the simulator, same workload, same run"
	am, err := asyncMeasures(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("policy updates: %w", err)
	}
	return append(am, []Measure{
		{Name: "inference.turn_vllm_p50_us", Value: ptr(toUS(vt.p50)),
			Note: fmt.Sprintf("%d turns, %.1f requests per turn", vt.turns, vt.reqPerTurn)},
		{Name: "inference.turn_llamacpp_p50_us", Value: ptr(toUS(lt.p50)), Baseline: ptr(toUS(vt.p50)), BaselineName: vllmBase,
			Note: fmt.Sprintf("%d turns, %.1f requests per turn", lt.turns, lt.reqPerTurn)},
		{Name: "inference.turn_llamacpp_p99_us", Value: ptr(toUS(lt.p99)), Baseline: ptr(toUS(vt.p99)), BaselineName: vllmBase},
		{Name: "inference.overhead_p50_us", Value: ptr(toUS(res.OverheadP50)),
			Note: fmt.Sprintf("%d calls of 512 prompt ids → 16 tokens; client p50 %.0f µs − raw p50 %.0f µs", res.Calls, toUS(res.ClientP50), toUS(res.RawP50))},
		{Name: "inference.client_p50_us", Value: ptr(toUS(res.ClientP50)), Baseline: ptr(toUS(res.RawP50)), BaselineName: raw},
		{Name: "inference.client_p99_us", Value: ptr(toUS(res.ClientP99)), Baseline: ptr(toUS(res.RawP99)), BaselineName: raw},
		{Name: "inference.burst_4096_errors", Value: ptr(float64(res.BurstErrors))},
		{Name: "inference.burst_4096_closed_conns", Value: ptr(float64(res.ClosedConns))},
		{Name: "inference.burst_4096_new_conns", Value: ptr(float64(res.NewConnsSecondBurst)),
			Note: fmt.Sprintf("first burst dialled %d", res.NewConnsFirstBurst)},
		{Name: "inference.burst_4096_requests_per_s", Value: ptr(sig(float64(conc) / res.SecondBurst.Seconds())),
			Note: fmt.Sprintf("second burst took %s", res.SecondBurst.Round(time.Millisecond))},
	}...), nil
}

func runLoop(ctx context.Context, r *runCtx) ([]Measure, error) {
	var out []Measure
	// Per-turn overhead with the real tokens-mode backend on the
	// in-process simulator at zero latency; model and HTTP time are
	// excluded by construction (gaps between generations).
	const perEpisode = 20
	srv, err := sim.Start(ctx, sim.Config{Family: "hermes",
		Bench: &sim.Bench{Tool: "noop", CallsPerTurn: 1, Turns: perEpisode, Arguments: map[string]any{"path": "a.txt"}}})
	if err != nil {
		return nil, fmt.Errorf("start simulator: %w", err)
	}
	pol, err := inference.New(inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, Logger: r.logger})
	if err != nil {
		srv.Close()
		return nil, err
	}
	rep, err := loopbench.TurnOverheadPolicy(ctx, pol, "hermes", r.n(5000, 500), perEpisode)
	if c, ok := pol.(interface{ Close() error }); ok {
		_ = c.Close()
	}
	srv.Close()
	if err != nil {
		return nil, fmt.Errorf("turn overhead: %w", err)
	}
	out = append(out,
		Measure{Name: "loop.overhead_p50_us", Value: ptr(toUS(rep.P50)), Note: fmt.Sprintf("%d turns, hermes parser, vllm tokens backend", rep.Turns)},
		Measure{Name: "loop.overhead_p99_us", Value: ptr(toUS(rep.P99))},
	)

	// Many loops waiting on a slow policy: process CPU and peak RSS.
	turns := r.n(3, 2)
	var fake4k loopbench.ConcurrencyReport
	for _, c := range []struct {
		loops int
		tag   string
	}{{1024, "1k"}, {4096, "4k"}} {
		runtime.GC()
		debug.FreeOSMemory()
		cr, err := loopbench.ConcurrentLoops(ctx, c.loops, turns, time.Second)
		if err != nil {
			return out, fmt.Errorf("%d concurrent loops: %w", c.loops, err)
		}
		fake4k = cr
		note := fmt.Sprintf("%d turns each, wall %s, CPU / wall %.3f cores, peak heap in use %.0f MiB, peak %d goroutines", cr.TurnsPerLoop,
			cr.Wall.Round(time.Millisecond), cr.CPUCores, float64(cr.HeapInuse)/(1<<20), cr.Goroutines)
		out = append(out,
			Measure{Name: "loop.cpu_" + c.tag + "_loops_cores", Value: ptr(sig(cr.CoresOnSchedule(time.Second))), Note: note},
			Measure{Name: "loop.rss_" + c.tag + "_loops_mb", Value: ptr(sig(float64(cr.PeakRSSBytes) / (1 << 20))),
				Note: "whole process, after returning freed memory to the OS"})
	}
	client, err := runLoopClient(ctx, r, turns, fake4k)
	return append(out, client...), err
}

// turnStats is the cost of one tokens-mode turn through a backend.
type turnStats struct {
	p50, p99   time.Duration
	turns      int
	reqPerTurn float64
}

// turnCost times Episode.Generate of a backend on the zero-latency
// in-process simulator of the matching engine, driven by the agent loop
// with the no-op bench workload: the client's whole per-turn path (the
// renders of the new segment, the generation, the decode) plus the
// simulator's own serving time, which is the same code for both engines.
func turnCost(ctx context.Context, r *runCtx, backend, engine string, turns int) (turnStats, error) {
	const perEpisode = 20
	srv, err := sim.Start(ctx, sim.Config{Family: "hermes", Engine: engine,
		Bench: &sim.Bench{Tool: "noop", CallsPerTurn: 1, Turns: perEpisode, Arguments: map[string]any{"path": "a.txt"}}})
	if err != nil {
		return turnStats{}, fmt.Errorf("start simulator: %w", err)
	}
	defer srv.Close()
	c, err := inference.Open(inference.Config{Backend: backend, Endpoints: []string{srv.URL}, Logger: r.logger,
		Sampling: inference.Sampling{MaxTokens: 256}})
	if err != nil {
		return turnStats{}, err
	}
	defer c.Close()
	gt := &genTimer{inner: c}
	if _, err := loopbench.TurnOverheadPolicy(ctx, gt, "hermes", turns, perEpisode); err != nil {
		return turnStats{}, err
	}
	gt.mu.Lock()
	d := slices.Clone(gt.d)
	gt.mu.Unlock()
	if len(d) == 0 {
		return turnStats{}, fmt.Errorf("no turns timed")
	}
	slices.Sort(d)
	q := func(f float64) time.Duration { return d[min(len(d)-1, int(f*float64(len(d))))] }
	return turnStats{p50: q(.5), p99: q(.99), turns: len(d), reqPerTurn: float64(srv.Stats().Requests) / float64(len(d))}, nil
}

// genTimer records how long each Episode.Generate takes.
type genTimer struct {
	inner inference.Policy
	mu    sync.Mutex
	d     []time.Duration
}

func (g *genTimer) Start(ctx context.Context, spec inference.EpisodeSpec) (inference.Episode, error) {
	ep, err := g.inner.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &timedEpisode{Episode: ep, g: g}, nil
}

type timedEpisode struct {
	inference.Episode
	g *genTimer
}

func (e *timedEpisode) Generate(ctx context.Context, msgs []openai.ChatCompletionMessage) (inference.Turn, error) {
	t0 := time.Now()
	t, err := e.Episode.Generate(ctx, msgs)
	d := time.Since(t0)
	if err == nil {
		e.g.mu.Lock()
		e.g.d = append(e.g.d, d)
		e.g.mu.Unlock()
	}
	return t, err
}
