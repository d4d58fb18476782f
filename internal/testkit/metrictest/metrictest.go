// Package metrictest reads the process's Prometheus metrics in tests.
package metrictest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Find returns the metric of the default registry called name that has a
// label called label with value (with label "", its first metric), or nil
// when it has none yet. The getters of a nil *dto.Metric read zero, so
// Find(…).GetCounter().GetValue() is 0 for a counter not yet incremented.
func Find(t testing.TB, name, label, value string) *dto.Metric {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" {
				return m
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m
				}
			}
		}
	}
	return nil
}
