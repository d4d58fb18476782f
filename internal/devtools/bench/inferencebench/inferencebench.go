// Package inferencebench measures what the inference client adds to a
// generation call, against a bare HTTP exchange of the same bytes, and
// whether a burst of concurrent calls reuses its connections
// (`rollout bench inference`).
package inferencebench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollout-rl/rollout/inference"
)

// Config drives MeasureOverhead. URL should be a zero-latency server
// (the simulator with no latency model) so that what is measured is the
// client, not generation.
type Config struct {
	URL          string
	Model        string // empty: first of /v1/models
	Calls        int    // sequential calls per side (default 2000)
	PromptTokens int    // prompt length in ids (default 512)
	MaxTokens    int    // tokens per generation (default 16)
	Concurrency  int    // burst size for the connection-churn check (default 4096)
}

// RawPost sends body as JSON to url through c and reads the answer to its
// end, nothing more: the bare HTTP exchange that the client's overhead is
// measured against. An answer other than 200 is an error naming its status.
func RawPost(ctx context.Context, c *http.Client, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return fmt.Errorf("POST %s: status %d: %s", url, resp.StatusCode, b)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// Result is what `rollout bench inference` prints.
type Result struct {
	Calls int
	// Raw is a bare POST of the same pre-encoded body through the
	// client's own transport (inference/direct.go), the response read and discarded:
	// server time plus the irreducible transport cost. Client is the full
	// vllm tokens-mode generation path (encode, pool routing, metrics,
	// HTTP, decode, shape validation).
	RawP50, RawP99       time.Duration
	ClientP50, ClientP99 time.Duration
	// OverheadP50 = ClientP50 − RawP50: what this package adds per call.
	OverheadP50 time.Duration
	// Concurrency burst: Concurrency requests at once, twice. The first
	// burst warms the keep-alive pool; NewConnsSecondBurst counts dials in
	// the second (0 = no connection churn).
	Concurrency         int
	BurstErrors         int
	NewConnsFirstBurst  int64
	NewConnsSecondBurst int64
	// ClosedConns counts connections closed during both bursts: churn.
	ClosedConns int64
	SecondBurst time.Duration
}

func (r Result) String() string {
	return fmt.Sprintf("calls=%d raw p50=%v p99=%v | client p50=%v p99=%v | overhead p50=%v | burst %d: errors=%d dials first=%d second=%d closed=%d (%v)",
		r.Calls, r.RawP50, r.RawP99, r.ClientP50, r.ClientP99, r.OverheadP50, r.Concurrency, r.BurstErrors, r.NewConnsFirstBurst, r.NewConnsSecondBurst, r.ClosedConns, r.SecondBurst)
}

// MeasureOverhead measures the client-side cost of one generation call
// against cfg.URL and checks that a burst of concurrent calls reuses
// connections. Raw and client calls alternate so that server and machine
// noise hit both sides alike.
func MeasureOverhead(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Calls <= 0 {
		cfg.Calls = 2000
	}
	if cfg.PromptTokens <= 0 {
		cfg.PromptTokens = 512
	}
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = 16
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4096
	}
	pool, err := inference.NewPool(inference.PoolConfig{Endpoints: []string{cfg.URL}, Retries: -1, IdleConnsPerHost: 2 * cfg.Concurrency, Timeout: time.Minute})
	if err != nil {
		return Result{}, err
	}
	defer pool.Close()
	model := cfg.Model
	if model == "" {
		m, err := pool.Models(ctx)
		if err != nil {
			return Result{}, err
		}
		if len(m.Data) == 0 {
			return Result{}, fmt.Errorf("bench: %s serves no models", cfg.URL)
		}
		model = m.Data[0].ID
	}
	prompt := make([]int32, cfg.PromptTokens)
	for i := range prompt {
		prompt[i] = int32(32 + i%90) // printable bytes: valid in any vocabulary the simulator uses
	}
	temp := 1.0
	s := inference.Sampling{Temperature: &temp}
	generate := func() error {
		_, _, err := pool.GenerateTokens(ctx, model, prompt, cfg.MaxTokens, s)
		return err
	}

	// The raw side sends the exact bytes the client would.
	rawBody, err := json.Marshal(inference.TokensCompletionRequest(model, prompt, cfg.MaxTokens, s))
	if err != nil {
		return Result{}, err
	}
	rawClient := inference.NewHTTPClient(64)
	defer rawClient.CloseIdleConnections()
	rawURL := pool.Endpoints()[0] + "/v1/completions"
	raw := func() error { return RawPost(ctx, rawClient, rawURL, rawBody) }
	client := generate
	// Warm both connection pools and code paths.
	for range 50 {
		if err := raw(); err != nil {
			return Result{}, err
		}
		if err := client(); err != nil {
			return Result{}, err
		}
	}
	rawD := make([]time.Duration, 0, cfg.Calls)
	cliD := make([]time.Duration, 0, cfg.Calls)
	for range cfg.Calls {
		t0 := time.Now()
		if err := raw(); err != nil {
			return Result{}, err
		}
		t1 := time.Now()
		if err := client(); err != nil {
			return Result{}, err
		}
		t2 := time.Now()
		rawD = append(rawD, t1.Sub(t0))
		cliD = append(cliD, t2.Sub(t1))
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
	}
	res := Result{Calls: cfg.Calls, Concurrency: cfg.Concurrency}
	res.RawP50, res.RawP99 = quantile(rawD, .5), quantile(rawD, .99)
	res.ClientP50, res.ClientP99 = quantile(cliD, .5), quantile(cliD, .99)
	res.OverheadP50 = res.ClientP50 - res.RawP50

	burst := func() (int, time.Duration) {
		var wg sync.WaitGroup
		var errs atomic.Int64
		start := make(chan struct{})
		for range cfg.Concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if err := generate(); err != nil {
					errs.Add(1)
				}
			}()
		}
		t0 := time.Now()
		close(start)
		wg.Wait()
		return int(errs.Load()), time.Since(t0)
	}
	c0 := pool.ClosedConns()
	d0 := pool.NewConns()
	e1, _ := burst()
	d1 := pool.NewConns()
	e2, dur := burst()
	d2 := pool.NewConns()
	res.BurstErrors = e1 + e2
	res.NewConnsFirstBurst = d1 - d0
	res.NewConnsSecondBurst = d2 - d1
	res.SecondBurst = dur
	res.ClosedConns = pool.ClosedConns() - c0
	return res, nil
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
