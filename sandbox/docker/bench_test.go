package docker

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/devtools/bench/sandboxbench"
	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

func reportStats(b *testing.B, prefix string, s sandboxbench.Stats) {
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
	s := newSandbox(b, sandbox.Spec{})
	ctx := context.Background()
	for b.Loop() {
		ch, err := sandboxbench.MeasureExec(ctx, s, benchN("ROLLOUT_BENCH_EXEC_N", 500))
		if err != nil {
			b.Fatal(err)
		}
		cli, err := sandboxbench.MeasureDockerExecCLI(ctx, s.ID(), benchN("ROLLOUT_BENCH_CLI_N", 50))
		if err != nil {
			b.Fatal(err)
		}
		cs, bs := sandboxbench.Summarize(ch), sandboxbench.Summarize(cli)
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
		cr, err := sandboxbench.MeasureCreate(ctx, d, sandbox.Spec{Image: sandboxtest.Image}, n)
		if err != nil {
			b.Fatal(err)
		}
		run, err := sandboxbench.MeasureDockerRun(ctx, d.Client(), sandboxtest.Image, d.BaseLabels(), n)
		if err != nil {
			b.Fatal(err)
		}
		cs, rs := sandboxbench.Summarize(cr), sandboxbench.Summarize(run)
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
		p := sandbox.NewPool(d, sandbox.PoolOptions{})
		acq, err := sandboxbench.MeasurePoolAcquire(ctx, p, sandbox.Spec{Image: sandboxtest.Image}, n)
		if cerr := p.Close(ctx); err == nil {
			err = cerr
		}
		if err != nil {
			b.Fatal(err)
		}
		cold, err := sandboxbench.MeasureCreate(ctx, d, sandbox.Spec{Image: sandboxtest.Image}, 3)
		if err != nil {
			b.Fatal(err)
		}
		as, cs := sandboxbench.Summarize(acq), sandboxbench.Summarize(cold)
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
		d, err := New(ctx, Options{Options: host.Options{Instance: "peak-" + sandbox.RandomID(4), ReapInterval: -1, MaxContainers: target + 8}})
		if err != nil {
			b.Fatal(err)
		}
		res := sandboxbench.MeasurePeak(ctx, d, sandbox.Spec{Image: sandboxtest.Image, Limits: sandbox.Limits{MemoryBytes: 256 << 20, CPUs: 0.5, PIDs: 64}}, target, 8)
		_ = d.Close(ctx)
		b.ReportMetric(float64(res.Alive), "alive")
		b.ReportMetric(res.Elapsed.Seconds(), "create_all_s")
		b.Logf("peak: %d/%d alive and usable, created in %s, err %v", res.Alive, res.Target, res.Elapsed.Round(time.Millisecond), res.Err)
		if res.Alive < target {
			b.Errorf("only %d of %d sandboxes alive", res.Alive, target)
		}
	}
}

// BenchmarkAgentDelivery compares placing the agent by bind mount with
// copying it into the container (CopyToContainer) before start.
func BenchmarkAgentDelivery(b *testing.B) {
	needDocker(b)
	ctx := context.Background()
	n := benchN("ROLLOUT_BENCH_CREATE_N", 8)
	for b.Loop() {
		stats := map[string]sandboxbench.Stats{}
		for _, mode := range []string{DeliveryBind, DeliveryCopy} {
			d, err := New(ctx, Options{Options: host.Options{Instance: "delivery-" + sandbox.RandomID(4), ReapInterval: -1}, Delivery: mode})
			if err != nil {
				b.Fatal(err)
			}
			cr, err := sandboxbench.MeasureCreate(ctx, d, sandbox.Spec{Image: sandboxtest.Image}, n)
			_ = d.Close(ctx)
			if err != nil {
				b.Fatal(err)
			}
			stats[mode] = sandboxbench.Summarize(cr)
			reportStats(b, mode+"_", stats[mode])
		}
		b.ReportMetric(float64(stats[DeliveryCopy].P50)/float64(stats[DeliveryBind].P50), "copy_over_bind_p50")
	}
}

func BenchmarkChurnVsDockerRun(b *testing.B) {
	d := needDocker(b)
	ctx := context.Background()
	n := benchN("ROLLOUT_BENCH_CHURN_N", 16)
	c := benchN("ROLLOUT_BENCH_CHURN_C", 4)
	for b.Loop() {
		var ours, theirs sandboxbench.ChurnResult
		for range 2 {
			r, err := sandboxbench.MeasureChurn(ctx, d, sandbox.Spec{Image: sandboxtest.Image}, n/2, c)
			if err != nil {
				b.Fatal(err)
			}
			ours = ours.Add(r)
			r, err = sandboxbench.MeasureDockerRunChurn(ctx, sandboxtest.Image, d.BaseLabels(), n/2, c)
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

// MeasureChurn completes every lifecycle, never holds more sandboxes than
// its concurrency, leaves no container behind, and reports a failure
// (an image that does not exist) instead of counting it.
func TestMeasureChurn(t *testing.T) {
	d := ownBackend(t, Options{})
	ctx := context.Background()
	stop := make(chan struct{})
	peak := peakContainers(t, d, stop)
	res, err := sandboxbench.MeasureChurn(ctx, d, sandbox.Spec{Image: sandboxtest.Image}, 6, 2)
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
	res, err = sandboxbench.MeasureChurn(ctx, d, sandbox.Spec{Image: "rollout-no-such-image:missing"}, 4, 2)
	if err == nil || res.Ops != 0 {
		t.Fatalf("churn of a missing image = %+v, %v; want an error and no ops", res, err)
	}
}

// BenchmarkTunnelDial measures the host reaching a server in the sandbox
// through the tunnel's dial direction (an env server's traffic): a 64-byte
// round trip on one connection to an echo server (busybox nc -e cat), and
// a dial plus round trip per request (a fresh connection), against the
// exec channel's `true` in the same sandbox as the baseline.
func BenchmarkTunnelDial(b *testing.B) {
	s := newSandbox(b, sandbox.Spec{})
	ctx := context.Background()
	if _, err := s.Start(ctx, sandbox.ExecRequest{Command: "nc -ll -p 9125 -e cat"}); err != nil {
		b.Fatal(err)
	}
	dial := func() net.Conn {
		for {
			c, err := sandbox.Dial(ctx, s, 9125)
			if err == nil {
				return c
			}
			if !errors.Is(err, sandbox.ErrFailed) {
				b.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond) // nc not listening yet
		}
	}
	msg, buf := make([]byte, 64), make([]byte, 64)
	roundTrip := func(c net.Conn) time.Duration {
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	n := benchN("ROLLOUT_BENCH_DIAL_N", 300)
	for b.Loop() {
		c := dial()
		var rtt, fresh []time.Duration
		for range n {
			rtt = append(rtt, roundTrip(c))
		}
		_ = c.Close()
		for range n / 10 {
			start := time.Now()
			fc := dial()
			roundTrip(fc)
			fresh = append(fresh, time.Since(start))
			_ = fc.Close()
		}
		ex, err := sandboxbench.MeasureExec(ctx, s, n)
		if err != nil {
			b.Fatal(err)
		}
		rs, fs, es := sandboxbench.Summarize(rtt), sandboxbench.Summarize(fresh), sandboxbench.Summarize(ex)
		reportStats(b, "dial_rtt_", rs)
		reportStats(b, "dial_fresh_", fs)
		reportStats(b, "exec_", es)
		b.ReportMetric(float64(rs.P50)/float64(es.P50), "rtt_over_exec_p50")
		b.ReportMetric(float64(fs.P50)/float64(es.P50), "fresh_over_exec_p50")
	}
}
