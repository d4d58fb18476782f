// Package loopbench measures the agent loop's own cost: the orchestration
// overhead of one turn (parsing, dispatch, budgets, bookkeeping) with a
// zero-latency in-process policy and a no-op tool, and the CPU and memory
// of thousands of concurrent loops waiting on a slow policy (a fake timer
// policy, or any real one such as the tokens-mode client on a simulator in
// another process). `rollout bench loop` and the package benchmarks call
// these functions.
package loopbench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/tools"
)

// callText is a Hermes-format generation with one call of the no-op tool;
// the loop parses it with the "hermes" parser as in tokens mode.
const callText = "<tool_call>\n{\"name\": \"noop\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>"

// policy answers instantly (or after Latency) with callText for Turns
// turns, then a final answer. Entry times of Generate are recorded so that
// the time between two generations is exactly one turn of orchestration.
type policy struct {
	turns   int
	latency time.Duration
	record  bool
	mu      sync.Mutex
	stamps  []time.Time
}

type episode struct {
	p *policy
	n int
}

func (p *policy) Start(context.Context, inference.EpisodeSpec) (inference.Episode, error) {
	return &episode{p: p}, nil
}

func (e *episode) Generate(ctx context.Context, _ []openai.ChatCompletionMessage) (inference.Turn, error) {
	if e.p.record {
		now := time.Now()
		e.p.mu.Lock()
		e.p.stamps = append(e.p.stamps, now)
		e.p.mu.Unlock()
	}
	if e.p.latency > 0 {
		t := time.NewTimer(e.p.latency)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return inference.Turn{}, ctx.Err()
		}
	}
	e.n++
	if e.n > e.p.turns {
		return inference.Turn{Text: "done", CompletionIDs: []int32{1}, Logprobs: []float32{-0.1}}, nil
	}
	return inference.Turn{Text: callText, CompletionIDs: []int32{1, 2, 3}, Logprobs: []float32{-0.1, -0.2, -0.3}}, nil
}

func (e *episode) Finish(context.Context, []openai.ChatCompletionMessage) (inference.Sequence, error) {
	return inference.Sequence{}, nil
}

// NoopTools is a tool set with one read-only tool that does nothing.
func NoopTools() (*tools.Set, error) {
	r := tools.NewRegistry()
	err := r.Register(tools.Tool{Name: "noop", Toolset: "bench", Class: tools.ReadOnly,
		Parameters: []byte(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`),
		Handler: func(context.Context, *tools.Runtime, tools.Args) (string, error) {
			return `{"ok":true}`, nil
		}})
	if err != nil {
		return nil, err
	}
	return r.Resolve(nil, nil)
}

// OverheadReport is the per-turn orchestration overhead distribution.
type OverheadReport struct {
	Turns int
	P50   time.Duration
	P90   time.Duration
	P99   time.Duration
	Mean  time.Duration
}

func (r OverheadReport) String() string {
	return fmt.Sprintf("turns=%d p50=%s p90=%s p99=%s mean=%s", r.Turns, r.P50, r.P90, r.P99, r.Mean)
}

// TurnOverhead runs episodes of turnsPerEpisode turns until at least turns
// turns were measured and returns the per-turn overhead distribution.
func TurnOverhead(ctx context.Context, turns, turnsPerEpisode int) (OverheadReport, error) {
	if turnsPerEpisode <= 0 {
		turnsPerEpisode = 20
	}
	set, err := NoopTools()
	if err != nil {
		return OverheadReport{}, err
	}
	var samples []time.Duration
	for len(samples) < turns {
		p := &policy{turns: turnsPerEpisode, record: true, stamps: make([]time.Time, 0, turnsPerEpisode+1)}
		cfg := agentloop.Config{ID: "bench", Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "bench"}},
			Tools: set, Parser: "hermes", MaxTurns: turnsPerEpisode + 1}
		res, err := agentloop.Run(ctx, cfg, agentloop.Deps{Policy: p, Runtime: tools.NewRuntime(nil, "bench")})
		if err != nil {
			return OverheadReport{}, err
		}
		if res.StopReason != agentloop.StopFinished || res.Counters.ToolCalls != turnsPerEpisode {
			return OverheadReport{}, fmt.Errorf("bench episode ended with %s after %d calls", res.StopReason, res.Counters.ToolCalls)
		}
		for i := 1; i < len(p.stamps); i++ {
			samples = append(samples, p.stamps[i].Sub(p.stamps[i-1]))
		}
	}
	return summarize(samples), nil
}

func summarize(s []time.Duration) OverheadReport {
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	q := func(f float64) time.Duration { return s[min(len(s)-1, int(f*float64(len(s))))] }
	return OverheadReport{Turns: len(s), P50: q(0.5), P90: q(0.9), P99: q(0.99), Mean: sum / time.Duration(len(s))}
}

// ConcurrencyReport is the cost of many loops waiting on a slow policy.
type ConcurrencyReport struct {
	Loops        int
	TurnsPerLoop int
	// Latency is the generation latency of the fake policy (ConcurrentLoops);
	// zero for ConcurrentLoopsPolicy, whose latency is the server's.
	Latency time.Duration
	Wall    time.Duration
	// CPU is the process CPU time (user + system) spent while the loops ran.
	CPU time.Duration
	// CPUCores is process CPU time over wall time (1.0 = one full core).
	CPUCores     float64
	PeakRSSBytes int64
	// HeapInuse is the peak of the heap in use (live and not yet swept
	// objects plus fragmentation) while the loops ran.
	HeapInuse uint64
	// Goroutines is the peak goroutine count while the loops ran.
	Goroutines int
}

func (r ConcurrencyReport) String() string {
	return fmt.Sprintf("loops=%d turns=%d latency=%s wall=%s cpu=%.1f%% of a core peak_rss=%.0f MiB heap=%.0f MiB goroutines=%d",
		r.Loops, r.TurnsPerLoop, r.Latency, r.Wall.Round(time.Millisecond), r.CPUCores*100, float64(r.PeakRSSBytes)/(1<<20), float64(r.HeapInuse)/(1<<20), r.Goroutines)
}

// Generations is the number of policy calls the loops made: each loop's
// tool-calling turns plus its final answer.
func (r ConcurrencyReport) Generations() int { return r.Loops * (r.TurnsPerLoop + 1) }

// CPUPerGeneration is the process CPU time per policy call (per loop turn),
// which unlike CPUCores does not depend on how far the wall time stretched.
func (r ConcurrencyReport) CPUPerGeneration() time.Duration {
	if r.Generations() == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.Generations())
}

// CoresOnSchedule is the CPU the loops need to keep to their schedule,
// one generation per latency each: CPU per generation × loops / latency.
// It equals CPUCores when every generation took latency, and is larger
// when the machine fell behind and the wall stretched (CPU over a longer
// wall reads lower than what the schedule needs).
func (r ConcurrencyReport) CoresOnSchedule(latency time.Duration) float64 {
	if latency <= 0 {
		return 0
	}
	return r.CPUPerGeneration().Seconds() * float64(r.Loops) / latency.Seconds()
}

// ConcurrentLoops runs loops episodes at once, each turnsPerLoop turns with
// a latency-long generation from a fake in-process policy (a timer; no
// HTTP, JSON or tokens), and measures process CPU and peak RSS: the loop's
// own cost with the inference client left out.
func ConcurrentLoops(ctx context.Context, loops, turnsPerLoop int, latency time.Duration) (ConcurrencyReport, error) {
	rep, err := concurrentLoops(ctx, loops, turnsPerLoop, "hermes", func() inference.Policy {
		return &policy{turns: turnsPerLoop, latency: latency}
	})
	rep.Latency = latency
	return rep, err
}

// ConcurrentLoopsPolicy runs loops episodes at once through one shared
// policy, e.g. the real tokens-mode client (inference.New with backend
// vllm) on a simulator with Bench{Tool: "noop", CallsPerTurn: 1, Turns:
// turnsPerLoop} and a generation latency, and measures this process's CPU
// and peak RSS. With the simulator in another process, that is the cost of
// the loops plus the inference client (HTTP, JSON, /tokenize, token
// sequences). Every loop must make exactly turnsPerLoop no-op calls
// (Hermes format) and then finish.
func ConcurrentLoopsPolicy(ctx context.Context, pol inference.Policy, loops, turnsPerLoop int) (ConcurrencyReport, error) {
	return concurrentLoops(ctx, loops, turnsPerLoop, "hermes", func() inference.Policy { return pol })
}

// concurrentLoops runs the loops, each with the policy newPolicy returns,
// while a sampler records peak RSS, heap and goroutines every 100 ms.
func concurrentLoops(ctx context.Context, loops, turnsPerLoop int, parser string, newPolicy func() inference.Policy) (ConcurrencyReport, error) {
	set, err := NoopTools()
	if err != nil {
		return ConcurrencyReport{}, err
	}
	rep := ConcurrencyReport{Loops: loops, TurnsPerLoop: turnsPerLoop}
	runtime.GC()
	cpu0 := cpuTime()
	start := time.Now()
	stop := make(chan struct{})
	var peak peaks
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			peak.sample()
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, loops)
	for i := 0; i < loops; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := agentloop.Config{ID: "bench-" + strconv.Itoa(i), Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "bench"}},
				Tools: set, Parser: parser, MaxTurns: turnsPerLoop + 1}
			res, err := agentloop.Run(ctx, cfg, agentloop.Deps{Policy: newPolicy(), Runtime: tools.NewRuntime(nil, cfg.ID)})
			switch {
			case err != nil:
			case res.StopReason != agentloop.StopFinished:
				err = fmt.Errorf("loop %d ended with %s after %d calls", i, res.StopReason, res.Counters.ToolCalls)
			case res.Counters.ToolCalls != turnsPerLoop || res.Counters.ToolErrors > 0:
				err = fmt.Errorf("loop %d made %d calls (%d failed), want %d; is the policy calling the noop tool?",
					i, res.Counters.ToolCalls, res.Counters.ToolErrors, turnsPerLoop)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	rep.Wall = time.Since(start)
	close(stop)
	sampler.Wait()
	rep.CPU = cpuTime() - cpu0
	rep.CPUCores = rep.CPU.Seconds() / rep.Wall.Seconds()
	rep.PeakRSSBytes = peak.rss
	rep.HeapInuse = peak.heap
	rep.Goroutines = peak.goroutines
	close(errs)
	if n := len(errs); n > 0 {
		return rep, fmt.Errorf("%d of %d loops failed, first: %w", n, loops, <-errs)
	}
	return rep, nil
}

// peaks tracks the highest RSS, heap in use and goroutine count seen.
// runtime/metrics is read rather than runtime.ReadMemStats, which stops
// the world.
type peaks struct {
	rss        int64
	heap       uint64
	goroutines int
	samples    []metrics.Sample
}

func (p *peaks) sample() {
	if p.samples == nil {
		p.samples = []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"},
			{Name: "/sched/goroutines:goroutines"}}
	}
	if r := rss(); r > p.rss {
		p.rss = r
	}
	metrics.Read(p.samples)
	var heap uint64
	for _, s := range p.samples[:2] {
		if s.Value.Kind() == metrics.KindUint64 {
			heap += s.Value.Uint64()
		}
	}
	p.heap = max(p.heap, heap)
	if s := p.samples[2]; s.Value.Kind() == metrics.KindUint64 {
		p.goroutines = max(p.goroutines, int(s.Value.Uint64()))
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rss reads the resident set size from /proc/self/statm (Linux).
func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// timedPolicy wraps a policy and records when each Generate is entered
// and left, so the gaps between generations are the loop's own time.
type timedPolicy struct {
	inner inference.Policy
	mu    sync.Mutex
	in    []time.Time
	out   []time.Time
}

type timedEpisode struct {
	inference.Episode
	p *timedPolicy
}

func (p *timedPolicy) Start(ctx context.Context, spec inference.EpisodeSpec) (inference.Episode, error) {
	ep, err := p.inner.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &timedEpisode{Episode: ep, p: p}, nil
}

func (e *timedEpisode) Generate(ctx context.Context, m []openai.ChatCompletionMessage) (inference.Turn, error) {
	t0 := time.Now()
	t, err := e.Episode.Generate(ctx, m)
	t1 := time.Now()
	e.p.mu.Lock()
	e.p.in, e.p.out = append(e.p.in, t0), append(e.p.out, t1)
	e.p.mu.Unlock()
	return t, err
}

// TurnOverheadPolicy measures the loop's own per-turn time (from the end
// of one generation to the start of the next: parsing, validation,
// dispatch of the no-op tool, budgets, bookkeeping) against a real policy,
// e.g. inference.New on the in-process simulator with zero latency and
// Bench{Tool: "noop"}. Model time is excluded by construction.
func TurnOverheadPolicy(ctx context.Context, pol inference.Policy, parser string, turns, turnsPerEpisode int) (OverheadReport, error) {
	set, err := NoopTools()
	if err != nil {
		return OverheadReport{}, err
	}
	var samples []time.Duration
	for len(samples) < turns {
		tp := &timedPolicy{inner: pol}
		cfg := agentloop.Config{ID: "bench-sim", Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "bench"}},
			Tools: set, Parser: parser, MaxTurns: turnsPerEpisode + 1}
		res, err := agentloop.Run(ctx, cfg, agentloop.Deps{Policy: tp, Runtime: tools.NewRuntime(nil, "bench-sim")})
		if err != nil {
			return OverheadReport{}, err
		}
		if res.Counters.ToolCalls == 0 || res.Counters.ToolErrors > 0 {
			return OverheadReport{}, fmt.Errorf("bench episode made %d calls with %d errors (stop %s); is the policy calling the noop tool?",
				res.Counters.ToolCalls, res.Counters.ToolErrors, res.StopReason)
		}
		for i := 1; i < len(tp.in); i++ {
			samples = append(samples, tp.in[i].Sub(tp.out[i-1]))
		}
	}
	return summarize(samples), nil
}
