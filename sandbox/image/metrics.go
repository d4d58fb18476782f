package image

import "github.com/prometheus/client_golang/prometheus"

// Metrics are registered with prometheus.DefaultRegisterer at init.
var (
	metricBuilds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_image_builds_total",
		Help: "Image ensure/build requests by kind (base, task) and outcome (built, current, cached, shared, failed).",
	}, []string{"kind", "outcome"})
	metricBuildSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rollout_image_build_seconds",
		Help:    "Duration of engine image builds that ran, by kind (base, task).",
		Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
	}, []string{"kind"})
)

func init() { prometheus.MustRegister(metricBuilds, metricBuildSeconds) }
