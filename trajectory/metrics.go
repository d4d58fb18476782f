package trajectory

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/rollout-rl/rollout/internal/util/version"
)

var (
	metricRows = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rollout_trajectory_rows_written_total",
		Help: "Trajectory records in finished Parquet part files.",
	})
	metricFiles = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rollout_trajectory_files_written_total",
		Help: "Trajectory Parquet part files finished (fsynced and renamed).",
	})
	metricBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rollout_trajectory_bytes_written_total",
		Help: "Bytes of finished trajectory Parquet part files.",
	})
	metricErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rollout_trajectory_write_errors_total",
		Help: "Trajectory writers stopped by a write error (intake stopped).",
	})
	metricDurableWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "rollout_trajectory_group_durable_seconds",
		Help:    "How long WriteGroup waited for a group to be durable (its journal frame written and fsynced), journal on.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5 ms to 16 s
	})
)

// DurableWaits returns how many groups WriteGroup made durable in this
// process so far and the total time they waited for it (journal on): the
// count and sum of rollout_trajectory_group_durable_seconds.
func DurableWaits() (groups int64, total time.Duration) {
	var m dto.Metric
	if err := metricDurableWait.Write(&m); err != nil {
		return 0, 0
	}
	h := m.GetHistogram()
	return int64(h.GetSampleCount()), time.Duration(h.GetSampleSum() * float64(time.Second))
}

// Collectors returns the package's Prometheus collectors for the caller to
// register (the package never touches the default registry itself).
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{metricRows, metricFiles, metricBytes, metricErrors, metricDurableWait}
}

func serviceVersion() string { return version.Get().Version }
