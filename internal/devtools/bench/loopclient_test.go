package bench

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/inference"
)

// TestProfileLoopClient profiles the 4,096-loop run of
// loop.cpu_4k_loops_client_cores: CPU and allocation profiles of this
// process (the loops and the client; the simulator is a child process and
// not in them). It is a tool, not a check, and runs only when asked:
//
//	make build
//	ROLLOUT_PROFILE_DIR=/tmp/prof ROLLOUT_SIM_BINARY=$PWD/bin/rollout \
//	  go test -run TestProfileLoopClient -v ./internal/devtools/bench
//	go tool pprof -top /tmp/prof/cpu.pprof
//
// ROLLOUT_PROFILE_LOOPS overrides the number of loops (default 4096).
func TestProfileLoopClient(t *testing.T) {
	dir, exe := os.Getenv("ROLLOUT_PROFILE_DIR"), os.Getenv("ROLLOUT_SIM_BINARY")
	if dir == "" || exe == "" {
		t.Skip("set ROLLOUT_PROFILE_DIR and ROLLOUT_SIM_BINARY to profile the client loops")
	}
	loops := 4096
	if s := os.Getenv("ROLLOUT_PROFILE_LOOPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("ROLLOUT_PROFILE_LOOPS=%q: want a positive integer", s)
		}
		loops = n
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const turns = 3
	ctx := context.Background()
	sp, err := startSimProcess(ctx, exe, simBenchConfig(turns, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	r := &runCtx{logger: slog.New(slog.DiscardHandler)}
	cpuf, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err != nil {
		t.Fatal(err)
	}
	defer cpuf.Close()
	runtime.MemProfileRate = 64 << 10
	if err := pprof.StartCPUProfile(cpuf); err != nil {
		t.Fatal(err)
	}
	cr, st, err := clientLoops(ctx, sp, r, inference.Config{Backend: inference.BackendVLLM}, loops, turns)
	pprof.StopCPUProfile()
	if err != nil {
		t.Fatal(err)
	}
	memf, err := os.Create(filepath.Join(dir, "alloc.pprof"))
	if err != nil {
		t.Fatal(err)
	}
	defer memf.Close()
	if err := pprof.Lookup("allocs").WriteTo(memf, 0); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d loops × %d turns: wall %s, %.3f cores, %s CPU per generation, peak heap in use %d MiB, peak %d goroutines, %d dials, %d closes; simulator %.2f cores",
		cr.Loops, turns, cr.Wall.Round(time.Millisecond), cr.CPUCores, cr.CPUPerGeneration().Round(time.Microsecond), cr.HeapInuse>>20,
		cr.Goroutines, st.dials, st.closes, st.simCPU.Seconds()/cr.Wall.Seconds())
}
