package loopbench

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTurnOverheadRuns(t *testing.T) {
	rep, err := TurnOverhead(context.Background(), 50, 10)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Turns < 50 || rep.P50 <= 0 {
		t.Fatalf("report %v", rep)
	}
}

func TestConcurrentLoopsRuns(t *testing.T) {
	rep, err := ConcurrentLoops(context.Background(), 32, 2, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Loops != 32 || rep.PeakRSSBytes <= 0 {
		t.Fatalf("report %v", rep)
	}
}

// BenchmarkTurnOverhead reports the per-turn orchestration overhead and,
// as a machine-independent figure, its ratio to a baseline measured in the
// same run: one JSON round trip of an assistant message with a tool call.
func BenchmarkTurnOverhead(b *testing.B) {
	msg := openai.ChatCompletionMessage{Role: "assistant", ToolCalls: []openai.ToolCall{{ID: "c", Type: "function",
		Function: openai.FunctionCall{Name: "noop", Arguments: `{"path":"a.txt"}`}}}}
	const n = 2000
	t0 := time.Now()
	for i := 0; i < n; i++ {
		raw, _ := json.Marshal(msg)
		var back openai.ChatCompletionMessage
		_ = json.Unmarshal(raw, &back)
	}
	baseline := time.Since(t0) / n
	for b.Loop() {
		rep, err := TurnOverhead(context.Background(), 200, 20)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(rep.P50.Nanoseconds())/1e3, "p50-µs/turn")
		b.ReportMetric(float64(rep.P99.Nanoseconds())/1e3, "p99-µs/turn")
		b.ReportMetric(float64(rep.P50)/float64(baseline), "p50/json-roundtrip")
	}
}

// BenchmarkConcurrentLoops4096 is the 4,096-loop, 1 s latency measurement.
func BenchmarkConcurrentLoops4096(b *testing.B) {
	for b.Loop() {
		rep, err := ConcurrentLoops(context.Background(), 4096, 3, time.Second)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(rep.CPUCores*100, "cpu-%core")
		b.ReportMetric(float64(rep.PeakRSSBytes)/(1<<20), "peak-rss-MiB")
	}
}

func simPolicy(t testing.TB, turns int) (inference.Policy, func()) {
	srv, err := sim.Start(context.Background(), sim.Config{Family: "hermes",
		Bench: &sim.Bench{Tool: "noop", CallsPerTurn: 1, Turns: turns, Arguments: map[string]any{"path": "a.txt"}}})
	if err != nil {
		t.Fatal(err)
	}
	pol, err := inference.New(inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	return pol, func() {
		if c, ok := pol.(interface{ Close() error }); ok {
			c.Close()
		}
		srv.Close()
	}
}

func TestTurnOverheadWithSimulator(t *testing.T) {
	pol, done := simPolicy(t, 5)
	defer done()
	rep, err := TurnOverheadPolicy(context.Background(), pol, "hermes", 10, 5)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Turns < 10 {
		t.Fatalf("%v", rep)
	}
}

func TestConcurrentLoopsPolicyWithSimulator(t *testing.T) {
	pol, done := simPolicy(t, 2)
	defer done()
	rep, err := ConcurrentLoopsPolicy(context.Background(), pol, 16, 2)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Loops != 16 || rep.Generations() != 48 || rep.PeakRSSBytes <= 0 || rep.Goroutines < 1 || rep.HeapInuse == 0 {
		t.Fatalf("report %v", rep)
	}
	// A policy that stops calling the tool before the expected number of
	// turns is an error, not a silently cheaper measurement.
	if _, err := ConcurrentLoopsPolicy(context.Background(), pol, 4, 3); err == nil || !strings.Contains(err.Error(), "want 3") {
		t.Fatalf("want a call-count error, got %v", err)
	}
}

// BenchmarkTurnOverheadSimulator: the same measurement with the real
// tokens-mode backend on the in-process simulator at zero latency; model
// and HTTP time are excluded, so this is loop + parsing + dispatch.
func BenchmarkTurnOverheadSimulator(b *testing.B) {
	pol, done := simPolicy(b, 20)
	defer done()
	for b.Loop() {
		rep, err := TurnOverheadPolicy(context.Background(), pol, "hermes", 200, 20)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(rep.P50.Nanoseconds())/1e3, "p50-µs/turn")
		b.ReportMetric(float64(rep.P99.Nanoseconds())/1e3, "p99-µs/turn")
	}
}

// On schedule, the cores are the CPU per generation times the loops'
// generations per second: a wall stretched tenfold does not lower them.
func TestCoresOnSchedule(t *testing.T) {
	r := ConcurrencyReport{Loops: 4, TurnsPerLoop: 1, CPU: 8 * time.Millisecond, Wall: 20 * time.Second}
	if got := r.CoresOnSchedule(time.Second); got < 0.0039 || got > 0.0041 {
		t.Errorf("on schedule %.5f cores, want 0.004 (1 ms per generation × 4 loops per second)", got)
	}
	if got := r.CoresOnSchedule(0); got != 0 {
		t.Errorf("zero latency: %v, want 0", got)
	}
}
