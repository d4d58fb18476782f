package bench

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/bench/gatewaybench"
)

// gatewayScaleNames are the measures of the scale run (not measured
// without a rollout binary to run the gateway and the simulator in).
// ProfileDirEnv names a directory: when it is set, the scale run's gateway
// and proxy processes write their CPU profiles there (gateway.cpu.pprof,
// proxy.cpu.pprof), for `go tool pprof`.
const ProfileDirEnv = "ROLLOUT_BENCH_PROFILE_DIR"

var gatewayScaleNames = []string{"gateway.cpu_10k_sessions_cores", "gateway.cpu_per_call_10k_us", "gateway.rss_10k_sessions_mb"}

// The scale run: sessions held at once, tool calls per conversation (plus
// the final answer), the engine's time to first token.
const (
	gatewayScaleTurns = 2
	gatewayScaleTTFT  = time.Second
)

func runGateway(ctx context.Context, r *runCtx) ([]Measure, error) {
	var out []Measure
	conv := r.n(300, 25)
	const turns = 3
	proxyBase := "a plain httputil.ReverseProxy to the same simulator's /v1/chat/completions (one engine request per call, the engine renders and parses), alternating conversation by conversation, same run"
	// The gateway as a deployment that has the model's files renders
	// (local_render: the simulator's Hugging Face model directory), then
	// rendering through the engine, on both engine flavours.
	// The last: a long history (20 tool calls, each result a 2.4 kB
	// directory listing: ~50 kB of messages re-sent by the last call).
	for _, c := range []struct {
		engine, backend, prefix string
		local                   bool
		conv, turns             int
		result                  string
	}{
		{sim.EngineVLLM, inference.BackendVLLM, "gateway.", true, conv, turns, ""},
		{sim.EngineVLLM, inference.BackendVLLM, "gateway.server_render_", false, conv, turns, ""},
		{sim.EngineLlamaCpp, inference.BackendLlamaCpp, "gateway.llamacpp_local_render_", true, conv, turns, ""},
		{sim.EngineLlamaCpp, inference.BackendLlamaCpp, "gateway.llamacpp_", false, conv, turns, ""},
		{sim.EngineVLLM, inference.BackendVLLM, "gateway.long_history_", true, r.n(40, 4), 20, longToolResult},
	} {
		conv, turns := c.conv, c.turns
		rep, err := gatewaybench.Overhead(ctx, gatewaybench.OverheadConfig{Engine: c.engine, Backend: c.backend, Conversations: conv, Turns: turns, LocalRender: c.local, ToolResult: c.result})
		if err != nil {
			return out, fmt.Errorf("%s overhead: %w", c.backend, err)
		}
		routes := slices.Sorted(maps.Keys(rep.GatewayRoutes))
		var rs []string
		for _, k := range routes {
			rs = append(rs, fmt.Sprintf("%s %.2f", k, rep.GatewayRoutes[k]))
		}
		render := "the engine renders"
		if c.local {
			render = "the gateway renders in-process from the simulator's model directory (local_render)"
		}
		if c.result != "" {
			render += fmt.Sprintf("; every tool result %d bytes", len(c.result))
		}
		note := fmt.Sprintf("%s; %d conversations × %d calls (%d tool calls + final answer, hermes) each way, zero-latency in-process simulator (%s flavour); "+
			"each call less the engine's own time within it (the simulator's handler time: %.0f µs per gateway call, %.0f per proxy call): "+
			"gateway p50 %.0f µs − proxy p50 %.0f µs; engine requests per gateway call %.2f (%s), per proxy call %.2f; %d of %d sessions closed as one clean branch",
			render, conv, turns+1, turns, c.engine, toUS(rep.GatewayEngine), toUS(rep.ProxyEngine), toUS(rep.GatewayNetP50), toUS(rep.ProxyNetP50),
			rep.GatewayRequestsPerCall, strings.Join(rs, ", "), rep.ProxyRequestsPerCall, rep.CleanSessions, rep.Sessions)
		if rep.CleanSessions != rep.Sessions {
			return out, fmt.Errorf("%s overhead: only %d of %d sessions closed as one clean branch", c.backend, rep.CleanSessions, rep.Sessions)
		}
		out = append(out,
			Measure{Name: c.prefix + "overhead_p50_us", Value: ptr(toUS(rep.GatewayNetP50 - rep.ProxyNetP50)), Note: note},
			Measure{Name: c.prefix + "overhead_raw_p50_us", Value: ptr(toUS(rep.GatewayP50 - rep.ProxyP50)),
				Note: fmt.Sprintf("engine time included: gateway p50 %.0f µs − proxy p50 %.0f µs", toUS(rep.GatewayP50), toUS(rep.ProxyP50))},
			Measure{Name: c.prefix + "call_p50_us", Value: ptr(toUS(rep.GatewayP50)), Baseline: ptr(toUS(rep.ProxyP50)), BaselineName: proxyBase},
			Measure{Name: c.prefix + "call_p90_us", Value: ptr(toUS(rep.GatewayP90)), Baseline: ptr(toUS(rep.ProxyP90)), BaselineName: proxyBase},
			Measure{Name: c.prefix + "engine_requests_per_call", Value: ptr(sig(rep.GatewayRequestsPerCall)), Baseline: ptr(sig(rep.ProxyRequestsPerCall)),
				BaselineName: "the reverse proxy's engine requests per call, same run", Note: strings.Join(rs, ", ")},
		)
	}
	scale, err := runGatewayScale(ctx, r)
	return append(out, scale...), err
}

// longToolResult is the tool result of the long-history overhead: a
// directory listing of 40 lines (2.4 kB, a newline escape per line).
var longToolResult = strings.Repeat("drwxr-xr-x  2 root root  4096 Nov 28 23:11 some-directory-name\n", 40)

// runGatewayScale holds many sessions at once on a gateway in a child
// process (`rollout bench gateway-serve`), the simulator in another
// (`rollout sim`, 1 s time to first token), this process generating the
// load: the gateway's CPU and peak RSS are its own.
func runGatewayScale(ctx context.Context, r *runCtx) ([]Measure, error) {
	notMeasured := func(reason string) []Measure {
		var out []Measure
		for _, n := range gatewayScaleNames {
			out = append(out, NotMeasured(n, reason))
		}
		return out
	}
	exe, err := r.simBinary()
	if err != nil {
		return notMeasured(err.Error()), nil
	}
	sessions := r.n(10000, 500)
	// Every call in flight holds a connection from the gateway to the
	// simulator (HTTP/1.1): the gateway and the simulator need a
	// descriptor per session and some. The harnesses reach the gateway
	// over a few cleartext HTTP/2 connections (gatewaybench.H2CClient).
	if want := uint64(sessions) + 1024; true {
		if lim, err := raiseNoFile(want); lim < want {
			return notMeasured(fmt.Sprintf("open-file limit %d is below the %d that %d sessions need and cannot be raised: %v", lim, want, sessions, err)), nil
		}
	}
	sp, err := startSimProcess(ctx, exe, simBenchConfig(gatewayScaleTurns, gatewayScaleTTFT))
	if err != nil {
		return nil, fmt.Errorf("simulator process: %w", err)
	}
	defer sp.Close()
	// The gateway renders in-process, as the overhead's headline
	// configuration does.
	model, err := os.MkdirTemp("", "rollout-bench-model-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(model)
	if err := sim.WriteHFModel(model, "hermes"); err != nil {
		return nil, fmt.Errorf("write the simulator's model directory: %w", err)
	}
	// The baseline first: a plain reverse proxy in the same kind of
	// process under the same load, then the gateway.
	proxy, err := scaleRun(ctx, exe, sp, sessions, "")
	if err != nil {
		return notMeasured("reverse proxy: " + err.Error()), fmt.Errorf("reverse proxy, %d conversations: %w", sessions, err)
	}
	gw, err := scaleRun(ctx, exe, sp, sessions, model)
	if err != nil {
		return notMeasured(err.Error()), fmt.Errorf("%d sessions: %w", sessions, err)
	}
	if !gw.ok || !proxy.ok {
		return notMeasured("the gateway or proxy process is not visible in /proc"), nil
	}
	if gw.rep.CleanSessions != gw.rep.Sessions {
		return notMeasured(fmt.Sprintf("only %d of %d sessions closed as one clean branch", gw.rep.CleanSessions, gw.rep.Sessions)), nil
	}
	perCall, proxyPerCall := gw.cpu/time.Duration(gw.rep.Calls), proxy.cpu/time.Duration(proxy.rep.Calls)
	// On schedule every session makes one call per TTFT: sessions calls
	// per second at 1 s.
	onSchedule := func(perCall time.Duration) float64 {
		return perCall.Seconds() * float64(sessions) / gatewayScaleTTFT.Seconds()
	}
	ideal := time.Duration(gatewayScaleTurns+1) * gatewayScaleTTFT
	note := fmt.Sprintf("%d sessions opened, then all at once %d calls each (%d tool calls + final answer, hermes, vllm tokens backend), then closed (records built); "+
		"simulator at TTFT %s in a child process, the gateway (`rollout bench gateway-serve`, rendering in-process: local_render) in another, this process the harnesses "+
		"(over cleartext HTTP/2, a few connections; the gateway to the simulator HTTP/1.1, a connection per call in flight): "+
		"wall of the calls %s (ideal %s), call p50 %s p90 %s; gateway CPU %.1f s over the run (opens, calls, closes) = %.0f µs per call, CPU / wall %.2f cores; "+
		"simulator CPU (not counted) %.1f s; baseline: the same conversations through a plain reverse proxy process (`rollout bench gateway-serve --proxy`, "+
		"the inference client's transport) to the same simulator, same run: CPU %.1f s = %.0f µs per call, wall %s, call p50 %s",
		sessions, gatewayScaleTurns+1, gatewayScaleTurns, gatewayScaleTTFT, gw.rep.Wall.Round(time.Millisecond), ideal,
		gw.rep.CallP50.Round(time.Millisecond), gw.rep.CallP90.Round(time.Millisecond), gw.cpu.Seconds(), toUS(perCall),
		gw.cpu.Seconds()/gw.rep.Wall.Seconds(), gw.simCPU.Seconds(), proxy.cpu.Seconds(), toUS(proxyPerCall),
		proxy.rep.Wall.Round(time.Millisecond), proxy.rep.CallP50.Round(time.Millisecond))
	proxyName := "a plain reverse proxy process under the same load, same run"
	return []Measure{
		{Name: "gateway.cpu_10k_sessions_cores", Value: ptr(sig(onSchedule(perCall))), Baseline: ptr(sig(onSchedule(proxyPerCall))), BaselineName: proxyName, Note: note},
		{Name: "gateway.cpu_per_call_10k_us", Value: ptr(toUS(perCall)), Baseline: ptr(toUS(proxyPerCall)), BaselineName: proxyName},
		{Name: "gateway.rss_10k_sessions_mb", Value: ptr(sig(float64(gw.rss) / (1 << 20))), Baseline: ptr(sig(float64(proxy.rss) / (1 << 20))), BaselineName: proxyName,
			Note: fmt.Sprintf("VmHWM of the gateway process; %.0f MiB idle before the sessions opened", float64(gw.idleRSS)/(1<<20))},
	}, nil
}

// scaleResult is one process's side of the scale run.
type scaleResult struct {
	rep          gatewaybench.ScaleReport
	cpu, simCPU  time.Duration
	rss, idleRSS int64
	ok           bool // the process's CPU and RSS were readable
}

// scaleRun starts `rollout bench gateway-serve` rendering from the model
// at localRender (the reverse proxy when it is "") against the simulator
// sp and drives sessions conversations through it at once.
func scaleRun(ctx context.Context, exe string, sp *childProcess, sessions int, localRender string) (scaleResult, error) {
	var res scaleResult
	proxy := localRender == ""
	gp, err := startGatewayProcess(ctx, exe, sp.URL, sessions, localRender)
	if err != nil {
		return res, fmt.Errorf("gateway process: %w", err)
	}
	defer gp.Close()
	res.idleRSS, _ = gp.peakRSS()
	hc := gatewaybench.H2CClient()
	defer hc.CloseIdleConnections()
	runtime.GC()
	cpu0, ok0 := gp.cpu()
	scpu0, _ := sp.cpu()
	res.rep, err = gatewaybench.Scale(ctx, gp.URL, sessions, gatewaybench.Harness{Client: hc}, proxy)
	cpu1, ok1 := gp.cpu()
	scpu1, _ := sp.cpu()
	rss, ok2 := gp.peakRSS()
	if err != nil {
		return res, err
	}
	res.cpu, res.simCPU, res.rss, res.ok = cpu1-cpu0, scpu1-scpu0, rss, ok0 && ok1 && ok2
	return res, nil
}

// startGatewayProcess runs `exe bench gateway-serve` on a free port
// against the engine at engine and waits until it answers /health.
func startGatewayProcess(ctx context.Context, exe, engine string, sessions int, localRender string) (_ *childProcess, err error) {
	dir, err := os.MkdirTemp("", "rollout-bench-gateway-*")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	return startChildOnFreePort(ctx, exe, dir, "gateway.log", "gateway", func(port int) []string {
		args := []string{"bench", "gateway-serve", "--engine", engine, "--backend", inference.BackendVLLM,
			"--addr", "127.0.0.1:" + strconv.Itoa(port), "--sessions", strconv.Itoa(sessions)}
		if localRender == "" {
			args = append(args, "--proxy")
		} else {
			args = append(args, "--local-render", localRender)
		}
		if d := os.Getenv(ProfileDirEnv); d != "" {
			name := "gateway.cpu.pprof"
			if localRender == "" {
				name = "proxy.cpu.pprof"
			}
			args = append(args, "--cpuprofile", filepath.Join(d, name))
		}
		return args
	})
}
