package capture_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/gateway/capture"
	"github.com/rollout-rl/rollout/inference/sim"
)

// BenchmarkGatewayOverhead compares one call through the gateway (a new
// session's first call: render, generate from ids, decode, parse,
// record) with the same call through a plain httputil.ReverseProxy to
// the same simulator's chat route (the engine renders and parses
// itself). The difference is the gateway's per-call overhead, its extra
// engine round trips included (tokens mode renders and decodes through
// the engine: /tokenize, /v1/completions, /detokenize).
func BenchmarkGatewayOverhead(b *testing.B) {
	srv := newRig(b, sim.Config{}, capture.Options{MaxSessions: 1 << 20})
	msgs := []map[string]any{{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Say hello."}}
	body, _ := json.Marshal(map[string]any{"model": "rollout-sim", "messages": msgs})
	var lat []time.Duration
	call := func(b *testing.B, url string) {
		t0 := time.Now()
		defer func() { lat = append(lat, time.Since(t0)) }()
		resp, err := http.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	b.Run("reverse-proxy", func(b *testing.B) {
		u, _ := url.Parse(srv.srv.URL)
		ps := httptest.NewServer(httputil.NewSingleHostReverseProxy(u))
		defer ps.Close()
		lat = lat[:0]
		for b.Loop() {
			call(b, ps.URL+"/v1/chat/completions")
		}
		reportP50(b, lat)
	})
	b.Run("gateway", func(b *testing.B) {
		var open []*capture.Session
		lat = lat[:0]
		for b.Loop() {
			s, err := srv.gw.Open(context.Background(), srv.spec())
			if err != nil {
				b.Fatal(err)
			}
			open = append(open, s)
			call(b, srv.base(s)+"/chat/completions")
		}
		b.StopTimer()
		reportP50(b, lat)
		for _, s := range open {
			if _, err := s.Close(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// reportP50 adds the median call latency (the target is stated
// as a p50).
func reportP50(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2].Microseconds()), "p50-µs")
}

// BenchmarkSessionMemory holds b.N sessions, each after one tool-using
// call (one branch, its episode and record), and reports the live heap
// per session: what an idle session costs the gateway.
func BenchmarkSessionMemory(b *testing.B) {
	r := newRig(b, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{MaxSessions: 1 << 20})
	body, _ := json.Marshal(map[string]any{"model": "rollout-sim", "tools": terminalTool, "messages": []map[string]any{
		{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Please fix the bug in a.txt"}}})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	sessions := make([]*capture.Session, 0, b.N)
	for b.Loop() {
		s, err := r.gw.Open(context.Background(), r.spec())
		if err != nil {
			b.Fatal(err)
		}
		sessions = append(sessions, s)
		resp, err := http.Post(r.base(s)+"/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(len(sessions)), "heap-B/session")
	b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
	for _, s := range sessions {
		if _, err := s.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
