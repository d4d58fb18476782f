package bench

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/devtools/bench/loopbench"
)

// buildRollout builds the rollout binary (whose sim command the *_client_*
// loop measures run in a child process).
func buildRollout(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the rollout binary and runs it as a child process")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to build the rollout binary")
	}
	exe := filepath.Join(t.TempDir(), "rollout")
	out, err := exec.Command(goBin, "build", "-o", exe, "github.com/rollout-rl/rollout/cmd/rollout").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return exe
}

func TestSimBenchConfigParses(t *testing.T) {
	cfg := simBenchConfig(3, time.Second)
	for _, want := range []string{"family: hermes", "ttft: 1s", "tool: noop", "calls_per_turn: 1", "turns: 3"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
}

func TestSimBinaryInTestBinary(t *testing.T) {
	r := &runCtx{}
	if _, err := r.simBinary(); err == nil {
		t.Fatal("a test binary must not be used as the simulator")
	}
	r.opts.SimBinary = "/x/rollout"
	if exe, err := r.simBinary(); err != nil || exe != "/x/rollout" {
		t.Fatalf("got %q, %v", exe, err)
	}
	// Without a binary the client measures are listed as not measured and
	// the suite does not fail.
	ms, err := runLoopClient(context.Background(), &runCtx{}, 1, loopbench.ConcurrencyReport{})
	if err != nil || len(ms) != len(clientLoopNames) || ms[0].Measured() {
		t.Fatalf("got %v, %v", ms, err)
	}
	for _, n := range clientLoopNames {
		if _, ok := catalogByName[n]; !ok {
			t.Errorf("%s not in the catalogue", n)
		}
	}
}

func TestSimProcessClientLoops(t *testing.T) {
	exe := buildRollout(t)
	ctx := context.Background()
	sp, err := startSimProcess(ctx, exe, simBenchConfig(2, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	pid := sp.cmd.Process.Pid
	r := &runCtx{logger: slog.New(slog.DiscardHandler)}
	cr, st, err := clientLoops(ctx, sp, r, inference.Config{Backend: inference.BackendVLLM}, 16, 2)
	if err != nil {
		sp.Close()
		t.Fatal(err)
	}
	if cr.Loops != 16 || cr.Generations() != 48 || st.dials < 1 {
		t.Errorf("report %v, stats %+v", cr, st)
	}
	// Both vLLM tokens backends, with one or two renders per turn, run the
	// bench's loops (loop.cpu_per_turn_vllm*_one_render_us).
	for _, cfg := range []inference.Config{{Backend: inference.BackendVLLMGenerate}, {Backend: inference.BackendVLLMGenerate, TwoRenderSegments: true},
		{Backend: inference.BackendVLLM, TwoRenderSegments: true}} {
		if cr, _, err := clientLoops(ctx, sp, r, cfg, 8, 2); err != nil || cr.Generations() != 24 {
			sp.Close()
			t.Fatalf("%+v: %v, %v", cfg, cr, err)
		}
	}
	// The floor's minimal request is one the simulator serves.
	if _, err := httpFloor(ctx, inference.NewHTTPClient(4), sp.URL, 4, 2); err != nil {
		t.Errorf("bare HTTP floor against the simulator: %v", err)
	}
	if _, ok := sp.cpu(); !ok {
		t.Error("no CPU time for the simulator process")
	}
	if rss, ok := sp.peakRSS(); !ok || rss <= 0 {
		t.Errorf("simulator peak RSS %d, %v", rss, ok)
	}
	url, dir := sp.URL, sp.dir
	if err := sp.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	// Stopped (and reaped: Close waited), files removed, port closed.
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("simulator process %d still exists: %v", pid, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s not removed: %v", dir, err)
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	if resp, err := hc.Get(url + "/health"); err == nil {
		resp.Body.Close()
		t.Errorf("simulator still answers at %s", url)
	}

	// A config the simulator rejects: the child exits, and its output is
	// in the error.
	_, err = startSimProcess(ctx, exe, "family: nope\n")
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("want the simulator's complaint, got %v", err)
	}
}

// httpFloor sends every request it reports and fails on an answer other
// than 200, naming the status.
func TestHTTPFloor(t *testing.T) {
	var n atomic.Int64
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		n.Add(1)
		_, _ = io.WriteString(w, `{"choices":[]}`)
	}))
	defer ok.Close()
	rep, err := httpFloor(context.Background(), http.DefaultClient, ok.URL, 8, 2)
	if err != nil {
		t.Fatal(err)
	}
	if n.Load() != 24 || rep.Loops != 8 || rep.Generations() != 24 || rep.Wall <= 0 {
		t.Fatalf("%d requests served, report %+v", n.Load(), rep)
	}
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	}))
	defer bad.Close()
	if _, err := httpFloor(context.Background(), inference.NewHTTPClient(2), bad.URL, 2, 2); err == nil || !strings.Contains(err.Error(), "status 503") {
		t.Fatalf("error %v, want one naming status 503", err)
	}
}
