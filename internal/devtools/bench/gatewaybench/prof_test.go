package gatewaybench_test

import (
	"context"
	"os"
	"testing"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/bench/gatewaybench"
)

func TestProfOverhead(t *testing.T) {
	rep, err := gatewaybench.Overhead(context.Background(), gatewaybench.OverheadConfig{Engine: sim.EngineVLLM, Backend: inference.BackendVLLM, Conversations: 1500, Turns: 3, LocalRender: os.Getenv("LOCAL") != ""})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("clean %d/%d raw gw %v proxy %v | net gw %v proxy %v => net overhead %v raw %v; engine gw %v proxy %v; routes %v", rep.CleanSessions, rep.Sessions,
		rep.GatewayP50, rep.ProxyP50, rep.GatewayNetP50, rep.ProxyNetP50, rep.GatewayNetP50-rep.ProxyNetP50, rep.GatewayP50-rep.ProxyP50, rep.GatewayEngine, rep.ProxyEngine, rep.GatewayRoutes)
}
