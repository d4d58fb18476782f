package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"runtime"
	"testing"
	"time"
)

const genBody = `{"prompt":"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n","max_tokens":20}`

// outcome classifies what a client sees for one request.
func outcome(ctx context.Context, url string) string {
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", bytes.NewBufferString(genBody))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return "canceled"
		}
		return "conn_error"
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "read_error"
	}
	if resp.StatusCode != 200 {
		return http.StatusText(resp.StatusCode)
	}
	var v map[string]any
	if json.Unmarshal(b, &v) != nil {
		return "bad_json"
	}
	return "ok"
}

func TestFaultKinds(t *testing.T) {
	cases := []struct {
		name   string
		faults Faults
		want   string
	}{
		{"error", Faults{ErrorRate: 1}, "Internal Server Error"},
		{"drop", Faults{DropRate: 1}, "conn_error"},
		{"malformed", Faults{MalformedRate: 1}, "bad_json"},
		{"truncate", Faults{TruncateRate: 1}, "read_error"},
		{"none", Faults{}, "ok"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := startSim(t, Config{Faults: tc.faults})
			if got := outcome(context.Background(), srv.URL); got != tc.want {
				t.Fatalf("outcome %q, want %q", got, tc.want)
			}
			// Non-generation routes are never faulted.
			if status, _ := get(t, srv.URL+"/health"); status != 200 {
				t.Fatalf("/health status %d", status)
			}
		})
	}
}

// waitInFlight polls until n requests are being served (no timing
// assertion: it only orders the test's steps).
func waitInFlight(t *testing.T, srv *Server, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for srv.Stats().InFlight < n {
		if time.Now().After(deadline) {
			t.Fatalf("never saw %d requests in flight", n)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

func TestHangEndsWithClient(t *testing.T) {
	srv := startSim(t, Config{Faults: Faults{HangRate: 1}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan string)
	go func() { done <- outcome(ctx, srv.URL) }()
	waitInFlight(t, srv, 1)
	cancel()
	if got := <-done; got != "canceled" {
		t.Fatalf("hung request ended with %q, want canceled", got)
	}
}

func TestCloseReleasesHangsAndLatency(t *testing.T) {
	for name, cfg := range map[string]Config{
		"hang":    {Faults: Faults{HangRate: 1}},
		"latency": {Latency: Latency{TTFT: time.Hour}},
	} {
		t.Run(name, func(t *testing.T) {
			srv, err := Start(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan string)
			go func() { done <- outcome(context.Background(), srv.URL) }()
			waitInFlight(t, srv, 1)
			if err := srv.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			if got := <-done; got != "Service Unavailable" {
				t.Fatalf("request during close ended with %q, want 503", got)
			}
		})
	}
}

func TestLatencyHonoursCancel(t *testing.T) {
	srv := startSim(t, Config{Latency: Latency{TTFT: time.Hour, PerToken: time.Second}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan string)
	go func() { done <- outcome(ctx, srv.URL) }()
	waitInFlight(t, srv, 1)
	cancel()
	if got := <-done; got != "canceled" {
		t.Fatalf("got %q", got)
	}
}

func TestFaultRates(t *testing.T) {
	cfg := Config{Seed: 42, Faults: Faults{ErrorRate: 0.2, MalformedRate: 0.1, TruncateRate: 0.1}}
	srv := startSim(t, cfg)
	const n = 400
	counts := map[string]int{}
	var seq []string
	for range n {
		o := outcome(context.Background(), srv.URL)
		counts[o]++
		seq = append(seq, o)
	}
	// Loose binomial bounds (about ±5 standard deviations).
	check := func(kind string, p float64) {
		mean := p * n
		sd := mean * (1 - p)
		lo, hi := mean-5*sqrt(sd), mean+5*sqrt(sd)
		if c := float64(counts[kind]); c < lo || c > hi {
			t.Errorf("%s: %v of %d, want within [%.0f, %.0f]", kind, c, n, lo, hi)
		}
	}
	check("Internal Server Error", 0.2)
	check("bad_json", 0.1)
	check("read_error", 0.1)
	check("ok", 0.6)
	st := srv.Stats()
	if int(st.Faults["error"]) != counts["Internal Server Error"] || int(st.Faults["malformed"]) != counts["bad_json"] || int(st.Faults["truncate"]) != counts["read_error"] {
		t.Errorf("Stats().Faults %v disagrees with client view %v", st.Faults, counts)
	}
	// Same seed, same sequential traffic: the same faults.
	again := startSim(t, cfg)
	for i := range 50 {
		if o := outcome(context.Background(), again.URL); o != seq[i] {
			t.Fatalf("request %d: %q, first server gave %q", i, o, seq[i])
		}
	}
}

func sqrt(x float64) float64 {
	// Newton is plenty for test bounds and keeps math out of the imports.
	z := x
	for range 30 {
		if z == 0 {
			return 0
		}
		z -= (z*z - x) / (2 * z)
	}
	return z
}

func TestStats(t *testing.T) {
	srv := startSim(t, Config{})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	defer client.CloseIdleConnections()
	for range 10 {
		resp, err := client.Post(srv.URL+"/v1/completions", "application/json", bytes.NewBufferString(genBody))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp, err := client.Post(srv.URL+"/v1/completions", "application/json", bytes.NewBufferString(`{"prompt":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	st := srv.Stats()
	if st.Requests != 11 || st.ByRoute["POST /v1/completions"] != 11 || st.ByStatus[200] != 10 || st.ByStatus[400] != 1 {
		t.Fatalf("stats %+v", st)
	}
	if st.NewConns != 1 || st.ActiveConns != 1 {
		t.Fatalf("keep-alive client should reuse one connection: new=%d active=%d", st.NewConns, st.ActiveConns)
	}
	if st.GeneratedTokens != 200 || st.PromptTokens == 0 {
		t.Fatalf("token counters: %+v", st)
	}
}
