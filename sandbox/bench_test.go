package sandbox

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Run with: go test -run '^$' -bench . -benchtime 1x ./sandbox/
// Each benchmark measures the candidate and its baseline side by side and
// reports percentiles (ms) and the ratio.

func reportStats(b *testing.B, prefix string, s Stats) {
	b.ReportMetric(float64(s.P50)/1e6, prefix+"p50_ms")
	b.ReportMetric(float64(s.P90)/1e6, prefix+"p90_ms")
	b.ReportMetric(float64(s.P99)/1e6, prefix+"p99_ms")
	b.Logf("%s %s", prefix, s)
}

func benchN(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func BenchmarkExecVsDockerExec(b *testing.B) {
	s := newSandbox(b, Spec{})
	ctx := context.Background()
	for b.Loop() {
		ch, err := MeasureExec(ctx, s, benchN("ROLLOUT_BENCH_EXEC_N", 500))
		if err != nil {
			b.Fatal(err)
		}
		cli, err := MeasureDockerExecCLI(ctx, s.ID(), benchN("ROLLOUT_BENCH_CLI_N", 50))
		if err != nil {
			b.Fatal(err)
		}
		cs, bs := Summarize(ch), Summarize(cli)
		reportStats(b, "channel_", cs)
		reportStats(b, "docker_exec_", bs)
		b.ReportMetric(float64(bs.P50)/float64(cs.P50), "speedup_p50")
	}
}

func BenchmarkCreateVsDockerRun(b *testing.B) {
	d := needDocker(b)
	ctx := context.Background()
	n := benchN("ROLLOUT_BENCH_CREATE_N", 10)
	for b.Loop() {
		cr, err := MeasureCreate(ctx, d, Spec{Image: testImage}, n)
		if err != nil {
			b.Fatal(err)
		}
		run, err := MeasureDockerRun(ctx, d.Client(), testImage, d.BaseLabels(), n)
		if err != nil {
			b.Fatal(err)
		}
		cs, rs := Summarize(cr), Summarize(run)
		reportStats(b, "create_", cs)
		reportStats(b, "docker_run_", rs)
		b.ReportMetric(float64(cs.P50)/float64(rs.P50), "create_over_run_p50")
	}
}

func BenchmarkPoolAcquire(b *testing.B) {
	d := needDocker(b)
	ctx := context.Background()
	n := benchN("ROLLOUT_BENCH_POOL_N", 20)
	for b.Loop() {
		p := NewPool(d, PoolOptions{})
		acq, err := MeasurePoolAcquire(ctx, p, Spec{Image: testImage}, n)
		if cerr := p.Close(ctx); err == nil {
			err = cerr
		}
		if err != nil {
			b.Fatal(err)
		}
		cold, err := MeasureCreate(ctx, d, Spec{Image: testImage}, 3)
		if err != nil {
			b.Fatal(err)
		}
		as, cs := Summarize(acq), Summarize(cold)
		reportStats(b, "acquire_", as)
		reportStats(b, "cold_", cs)
		b.ReportMetric(float64(cs.P50)/float64(as.P50), "speedup_p50")
	}
}

func BenchmarkPeakConcurrent(b *testing.B) {
	needDocker(b)
	ctx := context.Background()
	target := benchN("ROLLOUT_BENCH_PEAK", 200)
	for b.Loop() {
		d, err := NewDocker(ctx, Options{Instance: "peak-" + randomID(4), ReapInterval: -1, MaxContainers: target + 8})
		if err != nil {
			b.Fatal(err)
		}
		res := MeasurePeak(ctx, d, Spec{Image: testImage, Limits: Limits{MemoryBytes: 256 << 20, CPUs: 0.5, PIDs: 64}}, target, 8)
		_ = d.Close(ctx)
		b.ReportMetric(float64(res.Alive), "alive")
		b.ReportMetric(res.Elapsed.Seconds(), "create_all_s")
		b.Logf("peak: %d/%d alive and usable, created in %s, err %v", res.Alive, res.Target, res.Elapsed.Round(time.Millisecond), res.Err)
		if res.Alive < target {
			b.Errorf("only %d of %d sandboxes alive", res.Alive, target)
		}
	}
}

func TestSummarize(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	st := Summarize(s)
	if st.P50 != 50*time.Millisecond || st.P90 != 90*time.Millisecond || st.P99 != 99*time.Millisecond || st.Max != 100*time.Millisecond || st.N != 100 {
		t.Fatalf("%+v", st)
	}
	if (Summarize(nil) != Stats{}) {
		t.Fatal("empty")
	}
}

func TestChannelShare(t *testing.T) {
	ms := time.Millisecond
	got := ChannelShare([]time.Duration{3 * ms, 2 * ms, ms, 5 * ms}, []time.Duration{2 * ms, 2 * ms, 3 * ms})
	want := []time.Duration{ms, 0, 0} // clamped at zero; the unpaired round trip is left out
	if !slices.Equal(got, want) {
		t.Fatalf("ChannelShare = %v, want %v", got, want)
	}
}

// MeasureHostSpawn times real spawns and calls a failing command an error,
// with its output.
func TestMeasureHostSpawn(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	d, err := MeasureHostSpawn(context.Background(), 3, sh, "sh", "-c", "exit 0")
	if err != nil || len(d) != 3 || d[0] <= 0 {
		t.Fatalf("MeasureHostSpawn = %v, %v", d, err)
	}
	d, err = MeasureHostSpawn(context.Background(), 3, sh, "sh", "-c", "echo broken >&2; exit 3")
	if err == nil || len(d) != 0 || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("a failing command: %v, %v", d, err)
	}
}

// BenchmarkAgentDelivery compares placing the agent by bind mount with
// copying it into the container (CopyToContainer) before start.
func BenchmarkAgentDelivery(b *testing.B) {
	needDocker(b)
	ctx := context.Background()
	n := benchN("ROLLOUT_BENCH_CREATE_N", 8)
	for b.Loop() {
		stats := map[string]Stats{}
		for _, mode := range []string{DeliveryBind, DeliveryCopy} {
			d, err := NewDocker(ctx, Options{Instance: "delivery-" + randomID(4), ReapInterval: -1, Delivery: mode})
			if err != nil {
				b.Fatal(err)
			}
			cr, err := MeasureCreate(ctx, d, Spec{Image: testImage}, n)
			_ = d.Close(ctx)
			if err != nil {
				b.Fatal(err)
			}
			stats[mode] = Summarize(cr)
			reportStats(b, mode+"_", stats[mode])
		}
		b.ReportMetric(float64(stats[DeliveryCopy].P50)/float64(stats[DeliveryBind].P50), "copy_over_bind_p50")
	}
}

// MeasureChurn completes every lifecycle, never holds more sandboxes than
// its concurrency, leaves no container behind, and reports a failure
// (an image that does not exist) instead of counting it.
func TestMeasureChurn(t *testing.T) {
	d := ownBackend(t, Options{})
	ctx := context.Background()
	stop := make(chan struct{})
	peak := peakContainers(t, d, stop)
	res, err := MeasureChurn(ctx, d, Spec{Image: testImage}, 6, 2)
	close(stop)
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops != 6 || res.Concurrency != 2 || res.PerSecond() <= 0 {
		t.Fatalf("churn = %+v (%.2f/s), want 6 ops at concurrency 2", res, res.PerSecond())
	}
	if got := <-peak; got > 2 {
		t.Errorf("peak containers %d, want <= 2", got)
	}
	if n := countContainers(ctx, d.cli, d.opts.Instance); n != 0 {
		t.Errorf("%d containers left after churn", n)
	}
	res, err = MeasureChurn(ctx, d, Spec{Image: "rollout-no-such-image:missing"}, 4, 2)
	if err == nil || res.Ops != 0 {
		t.Fatalf("churn of a missing image = %+v, %v; want an error and no ops", res, err)
	}
}

func BenchmarkChurnVsDockerRun(b *testing.B) {
	d := needDocker(b)
	ctx := context.Background()
	n := benchN("ROLLOUT_BENCH_CHURN_N", 16)
	c := benchN("ROLLOUT_BENCH_CHURN_C", 4)
	for b.Loop() {
		var ours, theirs ChurnResult
		for range 2 {
			r, err := MeasureChurn(ctx, d, Spec{Image: testImage}, n/2, c)
			if err != nil {
				b.Fatal(err)
			}
			ours = ours.Add(r)
			r, err = MeasureDockerRunChurn(ctx, testImage, d.BaseLabels(), n/2, c)
			if err != nil {
				b.Fatal(err)
			}
			theirs = theirs.Add(r)
		}
		b.ReportMetric(ours.PerSecond(), "sandbox_per_s")
		b.ReportMetric(theirs.PerSecond(), "docker_run_rm_per_s")
		b.ReportMetric(ours.PerSecond()/theirs.PerSecond(), "ratio")
	}
}
