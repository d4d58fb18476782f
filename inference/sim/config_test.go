package sim

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestConfigYAML(t *testing.T) {
	const doc = `
family: qwen3_coder
template: qwen3
max_model_len: 8192
seed: 5
success_prob: 0.25
reasoning: true
latency: {ttft: 150ms, per_token: 2ms, jitter: 10ms}
faults: {error_rate: 0.01, drop_rate: 0.02}
scripts:
  - match: "fix the bug"
    steps:
      - tool_calls: [{name: read_file, arguments: {path: a.py}}]
      - final: "Fixed."
    wrong:
      - final: "No."
bench: {tool: terminal, calls_per_turn: 4, turns: 3}
`
	var c Config
	if err := yaml.Unmarshal([]byte(doc), &c); err != nil {
		t.Fatal(err)
	}
	if c.Latency.TTFT != 150*time.Millisecond || c.Latency.PerToken != 2*time.Millisecond || c.Faults.DropRate != 0.02 ||
		c.SuccessProb != 0.25 || len(c.Scripts) != 1 || c.Scripts[0].Steps[0].ToolCalls[0].Arguments["path"] != "a.py" ||
		c.Bench == nil || c.Bench.CallsPerTurn != 4 {
		t.Fatalf("decoded %+v", c)
	}
	if _, err := NewHandler(c); err != nil {
		t.Fatalf("valid YAML config rejected: %v", err)
	}
}

// TestEmbeddedHandler serves the simulator from a caller's own server.
func TestEmbeddedHandler(t *testing.T) {
	h, err := NewHandler(Config{})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	defer ts.Close()
	if status, _ := post(t, ts.URL+"/v1/completions", `{"prompt":"hi","max_tokens":2}`); status != 200 {
		t.Fatalf("status %d", status)
	}
}

// TestStartStopsWithContext: cancelling Start's context closes the server.
func TestStartStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := Start(ctx, Config{})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	<-srv.done
	_ = srv.Close() // waits for the close started by the context; idempotent
	if _, err := http.Get(srv.URL + "/health"); err == nil {
		t.Fatal("server still answers after its context ended")
	}
}

// A mixture-of-experts shape that cannot route is refused with the reason;
// a valid one routes every position to topk distinct experts.
func TestExpertsConfig(t *testing.T) {
	for _, x := range []Experts{{Layers: 0, TopK: 2, Num: 8}, {Layers: 2, TopK: 0, Num: 8}, {Layers: 2, TopK: 9, Num: 8}, {Layers: 1, TopK: 1, Num: 1 << 16}} {
		if _, err := NewHandler(Config{Experts: &x}); err == nil {
			t.Fatalf("%+v accepted", x)
		}
	}
	x := &Experts{Layers: 3, TopK: 4, Num: 6}
	seq := []int{5, 9, 9, 2, 7}
	got := x.ExpertsFor(seq)
	if len(got) != (len(seq)-1)*3*4 {
		t.Fatalf("%d experts for %d positions", len(got), len(seq)-1)
	}
	for row := 0; row < len(got); row += 4 {
		seen := map[int32]bool{}
		for _, e := range got[row : row+4] {
			if e < 0 || e >= 6 || seen[e] {
				t.Fatalf("row %d: %v", row/4, got[row:row+4])
			}
			seen[e] = true
		}
	}
	if again := x.ExpertsFor(seq); !slices.Equal(got, again) {
		t.Fatal("routing is not deterministic")
	}
}
