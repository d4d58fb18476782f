package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/devtools/bench/inferencebench"
	"github.com/rollout-rl/rollout/internal/devtools/bench/loopbench"
)

// clientLoopNames are the measures of runLoopClient.
var clientLoopNames = []string{"loop.cpu_1k_loops_client_cores", "loop.rss_1k_loops_client_mb",
	"loop.cpu_4k_loops_client_cores", "loop.rss_4k_loops_client_mb", "loop.cpu_per_turn_client_us",
	"loop.cpu_4k_http_floor_cores", "loop.cpu_per_request_http_floor_us", "loop.cpu_per_request_direct_floor_us",
	"loop.cpu_per_turn_vllm_one_render_us", "loop.cpu_per_turn_vllm_generate_one_render_us"}

// runLoopClient runs the concurrent loops of loop.cpu_*_loops_cores again,
// but through the real tokens-mode client (backend vllm: /tokenize,
// /v1/completions with id prompts, JSON, token sequences) against `rollout
// sim` in a child process at 1 s time to first token, so that this
// process's CPU and RSS are the loops' and the client's only. fake is the
// 4,096-loop run with the fake policy, the baseline of the per-turn CPU.
func runLoopClient(ctx context.Context, r *runCtx, turns int, fake loopbench.ConcurrencyReport) ([]Measure, error) {
	exe, err := r.simBinary()
	if err != nil {
		var out []Measure
		for _, n := range clientLoopNames {
			out = append(out, NotMeasured(n, err.Error()))
		}
		return out, nil
	}
	const ttft = time.Second
	sp, err := startSimProcess(ctx, exe, simBenchConfig(turns, ttft))
	if err != nil {
		return nil, fmt.Errorf("simulator process: %w", err)
	}
	var out []Measure
	var last loopbench.ConcurrencyReport
	for _, c := range []struct {
		loops int
		tag   string
	}{{r.n(1024, 128), "1k"}, {r.n(4096, 512), "4k"}} {
		runtime.GC()
		debug.FreeOSMemory()
		cr, st, err := clientLoops(ctx, sp, r, inference.Config{Backend: inference.BackendVLLM}, c.loops, turns)
		if err != nil {
			return out, errors.Join(fmt.Errorf("%d concurrent loops through the client: %w", c.loops, err), sp.Close())
		}
		last = cr
		ideal := time.Duration(turns+1) * ttft
		simNote := "simulator process not visible in /proc"
		if st.simSeen {
			simNote = fmt.Sprintf("simulator process (not counted) %.2f cores, peak RSS %.0f MiB", st.simCPU.Seconds()/cr.Wall.Seconds(),
				float64(st.simPeakRSS)/(1<<20))
		}
		note := fmt.Sprintf("%d loops × %d turns + final answer, TTFT %s: wall %s (%.1f× the ideal %s), %.0f µs CPU per turn, "+
			"CPU / wall %.3f cores; peak heap in use %.0f MiB, peak %d goroutines, "+
			"%d connections dialled, %d closed; %s",
			cr.Loops, cr.TurnsPerLoop, ttft, cr.Wall.Round(time.Millisecond), cr.Wall.Seconds()/ideal.Seconds(), ideal,
			float64(cr.CPUPerGeneration())/1e3, cr.CPUCores,
			float64(cr.HeapInuse)/(1<<20), cr.Goroutines, st.dials, st.closes, simNote)
		out = append(out,
			Measure{Name: "loop.cpu_" + c.tag + "_loops_client_cores", Value: ptr(sig(cr.CoresOnSchedule(ttft))), Note: note},
			Measure{Name: "loop.rss_" + c.tag + "_loops_client_mb", Value: ptr(sig(float64(cr.PeakRSSBytes) / (1 << 20))),
				Note: "after returning freed memory to the OS"})
	}
	m := Measure{Name: "loop.cpu_per_turn_client_us", Value: ptr(toUS(last.CPUPerGeneration())),
		Note: fmt.Sprintf("%d loops; ratio: the client's cost over the loop's own", last.Loops)}
	if fake.Loops > 0 {
		m.Baseline = ptr(toUS(fake.CPUPerGeneration()))
		m.BaselineName = fmt.Sprintf("the same %d loops with the fake in-process timer policy (no client), same run", fake.Loops)
	}
	out = append(out, m)
	// The floor under any client that sends an HTTP request per turn: as
	// many loops, each turn one minimal POST through bare net/http; then
	// the same through the client's own transport.
	floor := func(hc *http.Client) (loopbench.ConcurrencyReport, error) {
		defer hc.CloseIdleConnections()
		runtime.GC()
		return httpFloor(ctx, hc, sp.URL, last.Loops, last.TurnsPerLoop)
	}
	std := http.DefaultTransport.(*http.Transport).Clone()
	std.MaxIdleConns, std.MaxIdleConnsPerHost = last.Loops, last.Loops
	fl, err := floor(&http.Client{Transport: std})
	if err != nil {
		return out, errors.Join(fmt.Errorf("bare HTTP floor: %w", err), sp.Close())
	}
	dfl, err := floor(inference.NewHTTPClient(last.Loops))
	if err != nil {
		return out, errors.Join(fmt.Errorf("HTTP floor through the client's transport: %w", err), sp.Close())
	}
	floorNote := fmt.Sprintf("%d goroutines × %d sequential POST /v1/completions (3 prompt ids, max_tokens 1, body read and discarded; no JSON encoding or decoding) "+
		"through net/http with keep-alive on the same simulator at TTFT %s: wall %s, CPU / wall %.3f cores, %.0f µs CPU per request; "+
		"the real client sends two requests per later turn (/tokenize once, /v1/completions)",
		fl.Loops, fl.TurnsPerLoop+1, ttft, fl.Wall.Round(time.Millisecond), fl.CPUCores, float64(fl.CPUPerGeneration())/1e3)
	out = append(out,
		Measure{Name: "loop.cpu_4k_http_floor_cores", Value: ptr(sig(fl.CoresOnSchedule(ttft))), Note: floorNote},
		Measure{Name: "loop.cpu_per_request_http_floor_us", Value: ptr(toUS(fl.CPUPerGeneration())),
			Note: "of loop.cpu_4k_http_floor_cores; against loop.cpu_per_turn_client_us, a turn of the real client"},
		Measure{Name: "loop.cpu_per_request_direct_floor_us", Value: ptr(toUS(dfl.CPUPerGeneration())),
			Baseline: ptr(toUS(fl.CPUPerGeneration())), BaselineName: "loop.cpu_per_request_http_floor_us (bare net/http), same run",
			Note: fmt.Sprintf("the same %d goroutines × %d requests right after: wall %s, CPU / wall %.3f cores", dfl.Loops, dfl.TurnsPerLoop+1,
				dfl.Wall.Round(time.Millisecond), dfl.CPUCores)})
	// Requests per turn: one render per later turn (the closing count
	// learned per assistant shape) against the two renders of before, for
	// both vLLM tokens backends, the same loops in the same run.
	for _, be := range []struct{ backend, name, reqs string }{
		{inference.BackendVLLM, "loop.cpu_per_turn_vllm_one_render_us", "/tokenize + /v1/completions per later turn (3 with two renders)"},
		{inference.BackendVLLMGenerate, "loop.cpu_per_turn_vllm_generate_one_render_us", "/tokenize + /inference/v1/generate + /detokenize per later turn (4 with two renders)"},
	} {
		n := r.n(1024, 128)
		var reps [2]loopbench.ConcurrencyReport
		for i, two := range []bool{true, false} {
			runtime.GC()
			debug.FreeOSMemory()
			cr, _, err := clientLoops(ctx, sp, r, inference.Config{Backend: be.backend, TwoRenderSegments: two}, n, turns)
			if err != nil {
				return out, errors.Join(fmt.Errorf("%s loops (two renders %v): %w", be.backend, two, err), sp.Close())
			}
			reps[i] = cr
		}
		out = append(out, Measure{Name: be.name, Value: ptr(toUS(reps[1].CPUPerGeneration())),
			Baseline: ptr(toUS(reps[0].CPUPerGeneration())), BaselineName: "two renders per later turn (two_render_segments), same loops, same run",
			Note: fmt.Sprintf("backend %s, %d loops × %d turns + final answer at TTFT %s: %s; wall %s vs %s",
				be.backend, n, turns, ttft, be.reqs, reps[1].Wall.Round(time.Millisecond), reps[0].Wall.Round(time.Millisecond))})
	}
	if err := sp.Close(); err != nil {
		return out, fmt.Errorf("stop simulator process: %w", err)
	}
	return out, nil
}

// httpFloor runs loops goroutines that each send turns+1 minimal
// completions requests (as many as a loop's generations: its turns and
// final answer) to the simulator at url one after the other, through cl
// (keep-alive, one connection per goroutine at most), and measures this
// process's CPU: the cost of the HTTP exchange alone, under any client of
// an HTTP inference API, reported as the loops' is. A request that fails
// or answers other than 200 is an error.
func httpFloor(ctx context.Context, cl *http.Client, url string, loops, turns int) (loopbench.ConcurrencyReport, error) {
	body := []byte(`{"model":"rollout-sim","prompt":[1,2,3],"max_tokens":1}`)
	post := func() error { return inferencebench.RawPost(ctx, cl, url+"/v1/completions", body) }
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ferr error
	)
	cpu0, start := processCPU(), time.Now()
	for range loops {
		wg.Go(func() {
			for range turns + 1 {
				if err := post(); err != nil {
					mu.Lock()
					ferr = cmp.Or(ferr, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	rep := loopbench.ConcurrencyReport{Loops: loops, TurnsPerLoop: turns, Wall: time.Since(start), CPU: processCPU() - cpu0}
	rep.CPUCores = rep.CPU.Seconds() / rep.Wall.Seconds()
	return rep, ferr
}

// clientStats is what clientLoops sees besides the loops' report.
type clientStats struct {
	dials, closes int64
	simCPU        time.Duration
	simPeakRSS    int64
	simSeen       bool
}

// clientLoops runs loops loops through a fresh tokens-mode client on sp,
// configured by cfg (backend and options; endpoint and logger are set here).
func clientLoops(ctx context.Context, sp *childProcess, r *runCtx, cfg inference.Config, loops, turns int) (loopbench.ConcurrencyReport, clientStats, error) {
	cfg.Endpoints, cfg.Logger = []string{sp.URL}, r.logger
	pol, err := inference.New(cfg)
	if err != nil {
		return loopbench.ConcurrencyReport{}, clientStats{}, err
	}
	cl, ok := pol.(*inference.Client)
	if !ok {
		return loopbench.ConcurrencyReport{}, clientStats{}, fmt.Errorf("inference.New returned %T, want *inference.Client", pol)
	}
	defer cl.Close()
	var st clientStats
	cpu0, ok0 := sp.cpu()
	cr, err := loopbench.ConcurrentLoopsPolicy(ctx, pol, loops, turns)
	cpu1, ok1 := sp.cpu()
	rss, ok2 := sp.peakRSS()
	st.simCPU, st.simPeakRSS, st.simSeen = cpu1-cpu0, rss, ok0 && ok1 && ok2
	st.dials, st.closes = cl.Pool().NewConns(), cl.Pool().ClosedConns()
	return cr, st, err
}
