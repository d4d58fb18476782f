package gatewaybench_test

import (
	"context"
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
	for _, c := range []struct{ engine, backend string }{{sim.EngineVLLM, inference.BackendVLLM}, {sim.EngineLlamaCpp, inference.BackendLlamaCpp}} {
		t.Run(c.backend, func(t *testing.T) {
			rep, err := gatewaybench.Overhead(context.Background(), gatewaybench.OverheadConfig{Engine: c.engine, Backend: c.backend, Conversations: 5, Turns: 3})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Calls != 5*4 || rep.Sessions != 5 || rep.CleanSessions != 5 {
				t.Fatalf("calls %d, sessions %d (clean %d); want 20 calls, 5 clean sessions", rep.Calls, rep.Sessions, rep.CleanSessions)
			}
			if rep.ProxyRequestsPerCall != 1 || rep.GatewayRequestsPerCall <= 1 {
				t.Fatalf("engine requests per call: proxy %.2f, gateway %.2f (%v)", rep.ProxyRequestsPerCall, rep.GatewayRequestsPerCall, rep.GatewayRoutes)
			}
			t.Logf("%+v", rep)
		})
	}
}

// TestServeScale serves a gateway on a slow simulator and runs sessions
// through it with Scale.
func TestServeScale(t *testing.T) {
	srv := simtest.Start(t, sim.Config{Family: "hermes", Bench: gatewaybench.SimBench(2), Latency: sim.Latency{TTFT: 50 * time.Millisecond}})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- gatewaybench.Serve(ctx, gatewaybench.ServeConfig{Engine: srv.URL, Backend: inference.BackendVLLM, Addr: addr, Sessions: 100})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	base := "http://" + addr
	for range 100 {
		if resp, err := http.Get(base + "/health"); err == nil {
			resp.Body.Close()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	rep, err := gatewaybench.Scale(ctx, base, 20, gatewaybench.Harness{Client: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Calls != 20*3 || rep.CleanSessions != 20 {
		t.Fatalf("%+v: want 60 calls, 20 clean sessions", rep)
	}
}
