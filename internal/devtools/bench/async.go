package bench

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

// asyncMeasures times in-flight policy updates (issue 17) on the
// simulator, in one run: the pause→resume cost the service adds per update
// (BeginUpdate + EndUpdate through the client's gate, beside the engine's
// own /pause + /resume called directly), and the generation throughput of
// concurrent episodes while updates happen every 250 ms, relative to the
// same workload without updates.
func asyncMeasures(ctx context.Context, r *runCtx) ([]Measure, error) {
	srv, err := sim.Start(ctx, sim.Config{Family: "hermes", Seed: 5, Latency: sim.Latency{TTFT: 5 * time.Millisecond, PerToken: time.Millisecond}})
	if err != nil {
		return nil, fmt.Errorf("start simulator: %w", err)
	}
	defer srv.Close()
	c, err := inference.Open(inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, Logger: r.logger})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	conc := r.n(64, 16)
	window := time.Duration(r.n(4, 1)) * time.Second
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()

	// One phase: conc episodes generate one turn each, over and over, for
	// window; with updates, a trainer updates every 250 ms meanwhile.
	phase := func(updates bool) (turnsPerS float64, svc, raw []time.Duration, cuts int64, err error) {
		pctx, cancel := context.WithTimeout(ctx, window)
		defer cancel()
		var turns, cutN atomic.Int64
		var wg sync.WaitGroup
		var firstErr error
		var mu sync.Mutex
		for w := range conc {
			wg.Go(func() {
				for i := 0; pctx.Err() == nil; i++ {
					ep, err := c.Start(pctx, inference.EpisodeSpec{ID: fmt.Sprintf("b%d-%d", w, i), Sampling: inference.Sampling{MaxTokens: 64}})
					if err != nil {
						return
					}
					t, err := ep.Generate(pctx, []openai.ChatCompletionMessage{{Role: "user", Content: fmt.Sprintf("task %d of worker %d", i, w)}})
					if err != nil {
						if pctx.Err() == nil {
							mu.Lock()
							firstErr = err
							mu.Unlock()
						}
						return
					}
					turns.Add(1)
					cutN.Add(int64(t.Cuts))
				}
			})
		}
		t0 := time.Now()
		if updates {
			v := c.PolicyVersion()
			tick := time.NewTicker(250 * time.Millisecond)
			for done := false; !done; {
				select {
				case <-pctx.Done():
					done = true
					continue
				case <-tick.C:
				}
				v++
				s0 := time.Now()
				if _, err := c.BeginUpdate(ctx, inference.PauseAbort); err != nil {
					tick.Stop()
					return 0, nil, nil, 0, err
				}
				srv.SetPolicyVersion(v)
				if _, err := c.EndUpdate(ctx, v); err != nil {
					tick.Stop()
					return 0, nil, nil, 0, err
				}
				svc = append(svc, time.Since(s0))
				// The engine's own cost, same load: /pause + /resume direct.
				s1 := time.Now()
				for _, path := range []string{"/pause?mode=abort&clear_cache=false", "/resume"} {
					resp, err := hc.Post(srv.URL+path, "application/json", nil)
					if err != nil {
						tick.Stop()
						return 0, nil, nil, 0, err
					}
					resp.Body.Close()
				}
				raw = append(raw, time.Since(s1))
			}
			tick.Stop()
		}
		wg.Wait()
		el := time.Since(t0)
		if firstErr != nil {
			return 0, nil, nil, 0, firstErr
		}
		return float64(turns.Load()) / el.Seconds(), svc, raw, cutN.Load(), nil
	}
	base, _, _, _, err := phase(false)
	if err != nil {
		return nil, fmt.Errorf("throughput without updates: %w", err)
	}
	with, svc, raw, cuts, err := phase(true)
	if err != nil {
		return nil, fmt.Errorf("throughput with updates: %w", err)
	}
	if len(svc) == 0 {
		return nil, fmt.Errorf("no update happened in %s", window)
	}
	p50 := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds()) / 1000
	}
	return []Measure{
		{Name: "inference.update_pause_resume_p50_ms", Value: ptr(sig(p50(svc))), Baseline: ptr(sig(p50(raw))),
			BaselineName: "the simulator's own POST /pause?mode=abort + POST /resume, called directly under the same load, same run",
			Note:         fmt.Sprintf("%d updates (abort mode) with %d concurrent episodes", len(svc), conc)},
		{Name: "inference.throughput_during_updates_turns_per_s", Value: ptr(sig(with)), Baseline: ptr(sig(base)),
			BaselineName: "the same workload without updates, same run",
			Note:         fmt.Sprintf("%d concurrent episodes, 64-token turns at 1 ms/token, an update every 250 ms for %s; %d generations cut and continued", conc, window, cuts)},
	}, nil
}
