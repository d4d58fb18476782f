package inferencebench

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/simtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The burst check is functional, not a timing assertion: after a warm-up
// burst, a second burst of 4,096 concurrent calls must dial no new
// connection.
func TestConcurrentBurstReusesConnections(t *testing.T) {
	conc := 4096
	if testing.Short() || raceEnabled {
		conc = 512
	}
	srv := simtest.Start(t, sim.Config{Family: "hermes"})
	res, err := MeasureOverhead(context.Background(), Config{URL: srv.URL, Calls: 50, PromptTokens: 64, MaxTokens: 4, Concurrency: conc})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.BurstErrors != 0 {
		t.Fatalf("%d burst errors", res.BurstErrors)
	}
	if res.ClosedConns != 0 {
		t.Fatalf("%d connections closed during the bursts (churn)", res.ClosedConns)
	}
	// New dials in the second burst only grow the pool past the first
	// burst's peak concurrency (scheduling-dependent); they are logged,
	// not asserted. Closed connections are the churn that matters.
}

// BenchmarkGenerationOverhead reports the client path and the raw net/http
// baseline measured in the same run; overhead-p50-ns is their difference.
func BenchmarkGenerationOverhead(b *testing.B) {
	srv := simtest.Start(b, sim.Config{Family: "hermes"})
	res, err := MeasureOverhead(context.Background(), Config{URL: srv.URL, Calls: max(b.N, 200), Concurrency: 4096})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(res.ClientP50.Nanoseconds()), "client-p50-ns")
	b.ReportMetric(float64(res.RawP50.Nanoseconds()), "raw-p50-ns")
	b.ReportMetric(float64(res.OverheadP50.Nanoseconds()), "overhead-p50-ns")
	b.ReportMetric(float64(res.NewConnsSecondBurst), "burst-new-conns")
	b.ReportMetric(float64(res.ClosedConns), "burst-closed-conns")
	b.ReportMetric(float64(res.ClientP50)/float64(max(res.RawP50, 1)), "client/raw")
}
