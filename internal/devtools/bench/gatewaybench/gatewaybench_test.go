package gatewaybench_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/bench/gatewaybench"
	"github.com/rollout-rl/rollout/internal/testkit/simtest"
)

// TestOverhead runs a few conversations each way and checks what the
// report says about them: every call timed, every session one clean
// branch, the gateway's engine requests more than the proxy's one.
func TestOverhead(t *testing.T) {
	for _, c := range []struct {
		engine, backend string
		local           bool
	}{{sim.EngineVLLM, inference.BackendVLLM, false}, {sim.EngineLlamaCpp, inference.BackendLlamaCpp, false},
		{sim.EngineVLLM, inference.BackendVLLM, true}, {sim.EngineLlamaCpp, inference.BackendLlamaCpp, true}} {
		t.Run(fmt.Sprintf("%s/local=%v", c.backend, c.local), func(t *testing.T) {
			rep, err := gatewaybench.Overhead(context.Background(), gatewaybench.OverheadConfig{Engine: c.engine, Backend: c.backend, Conversations: 5, Turns: 3, LocalRender: c.local})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Calls != 5*4 || rep.Sessions != 5 || rep.CleanSessions != 5 {
				t.Fatalf("calls %d, sessions %d (clean %d); want 20 calls, 5 clean sessions", rep.Calls, rep.Sessions, rep.CleanSessions)
			}
			// Rendering through the engine costs requests of their own;
			// rendering locally, the first calls are checked against the
			// engine and the rest generate only.
			if rep.ProxyRequestsPerCall != 1 || !c.local && rep.GatewayRequestsPerCall <= 1 || c.local && rep.GatewayRequestsPerCall >= 1.5 {
				t.Fatalf("engine requests per call: proxy %.2f, gateway %.2f (%v)", rep.ProxyRequestsPerCall, rep.GatewayRequestsPerCall, rep.GatewayRoutes)
			}
			// The engine's time is measured on both sides and taken out of
			// the net latencies.
			if rep.ProxyEngine <= 0 || rep.GatewayEngine <= 0 || rep.ProxyNetP50 >= rep.ProxyP50 || rep.GatewayNetP50 >= rep.GatewayP50 {
				t.Fatalf("engine time per call: proxy %v, gateway %v; net p50 proxy %v (raw %v), gateway %v (raw %v)",
					rep.ProxyEngine, rep.GatewayEngine, rep.ProxyNetP50, rep.ProxyP50, rep.GatewayNetP50, rep.GatewayP50)
			}
			t.Logf("%+v", rep)
		})
	}
}

// TestServeScale serves a gateway on a slow simulator and runs sessions
// through it with Scale; then the same conversations through Serve's
// reverse proxy (the scale run's baseline).
func TestServeScale(t *testing.T) {
	srv := simtest.Start(t, sim.Config{Family: "hermes", Bench: gatewaybench.SimBench(2), Latency: sim.Latency{TTFT: 50 * time.Millisecond}})
	for _, proxy := range []bool{false, true} {
		before := srv.Stats().Requests
		rep := serveScale(t, gatewaybench.ServeConfig{Engine: srv.URL, Backend: inference.BackendVLLM, Sessions: 100, Proxy: proxy}, 20)
		if rep.Calls != 20*3 {
			t.Fatalf("proxy %v: %+v: want 60 calls", proxy, rep)
		}
		if !proxy && rep.CleanSessions != 20 {
			t.Fatalf("%+v: want 20 clean sessions", rep)
		}
		// The proxy forwards each call as one engine request.
		if got := srv.Stats().Requests - before; proxy && got != 60 {
			t.Fatalf("proxy: %d engine requests, want 60", got)
		}
	}
}

// serveScale runs Serve(cfg) on a free port and Scale against it.
func serveScale(t *testing.T, cfg gatewaybench.ServeConfig, sessions int) gatewaybench.ScaleReport {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gatewaybench.Serve(ctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	base := "http://" + cfg.Addr
	for range 100 {
		if resp, err := http.Get(base + "/health"); err == nil {
			resp.Body.Close()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	rep, err := gatewaybench.Scale(ctx, base, sessions, gatewaybench.Harness{Client: &http.Client{Transport: tr}}, cfg.Proxy)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}
