package trajectory

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollout-rl/rollout/internal/version"
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
)

// Collectors returns the package's Prometheus collectors for the caller to
// register (the package never touches the default registry itself).
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{metricRows, metricFiles, metricBytes, metricErrors}
}

func serviceVersion() string { return version.Get().Version }
