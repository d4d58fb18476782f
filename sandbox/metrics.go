package sandbox

import "github.com/prometheus/client_golang/prometheus"

// Metrics are registered with prometheus.DefaultRegisterer at init.
var (
	MetricLive = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rollout_sandbox_containers",
		Help: "Sandbox containers currently owned by this process (in use or warm).",
	})
	metricPoolIdle = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "rollout_sandbox_pool_idle",
		Help: "Started, never-used sandboxes waiting in the warm pool, by image.",
	}, []string{"image"})
	MetricAcquire = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rollout_sandbox_acquire_seconds",
		Help:    "Time to hand out a sandbox, by source (pool or create).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"source"})
	MetricDaemon = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rollout_sandbox_daemon_seconds",
		Help:    "Latency of Docker Engine API calls and runc commands, by operation.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	}, []string{"op"})
	MetricCreates = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rollout_sandbox_creates_total",
		Help: "Sandboxes created and started.",
	})
	MetricFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_sandbox_failures_total",
		Help: "Sandbox failures by stage (create, start, handshake, remove, channel).",
	}, []string{"stage"})
	MetricReaped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_sandbox_reaped_total",
		Help: "Containers removed by the reaper, by reason (orphan, leaked, idle, lifetime).",
	}, []string{"reason"})
	metricResets = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_sandbox_resets_total",
		Help: "Used sandboxes reset in place for their next holder (pool reuse), by result (ok, failed: the container was removed instead).",
	}, []string{"result"})
	metricExec = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "rollout_sandbox_exec_seconds",
		Help:    "Round trip of Exec through the agent channel.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 20),
	})
)

func init() {
	prometheus.MustRegister(MetricLive, metricPoolIdle, MetricAcquire, MetricDaemon, MetricCreates, MetricFailures, MetricReaped, metricResets, metricExec)
}
