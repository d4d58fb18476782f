package agentloop

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

type loopMetrics struct {
	episodes  *prometheus.CounterVec
	active    prometheus.Gauge
	turns     prometheus.Counter
	calls     *prometheus.CounterVec
	toolDur   *prometheus.HistogramVec
	parallelT prometheus.Counter
	events    *prometheus.CounterVec
}

var (
	metricsOnce sync.Once
	lm          *loopMetrics
)

// metrics registers the loop's collectors on the default registry once.
// Tool labels are registered tool names only (invalid calls use "-"), so a
// model inventing names cannot grow the label set.
func metrics() *loopMetrics {
	metricsOnce.Do(func() {
		m := &loopMetrics{
			episodes: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "rollout_agentloop_episodes_total",
				Help: "Finished episodes by stop reason.",
			}, []string{"stop_reason"}),
			active: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "rollout_agentloop_active_episodes",
				Help: "Episodes currently running.",
			}),
			turns: prometheus.NewCounter(prometheus.CounterOpts{
				Name: "rollout_agentloop_turns_total",
				Help: "Generations made by agent loops.",
			}),
			calls: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "rollout_agentloop_tool_calls_total",
				Help: "Tool calls by tool and outcome (ok, error, invalid).",
			}, []string{"tool", "outcome"}),
			toolDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Name:    "rollout_agentloop_tool_duration_seconds",
				Help:    "Duration of tool executions (budget spill included).",
				Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 180, 600},
			}, []string{"tool"}),
			parallelT: prometheus.NewCounter(prometheus.CounterOpts{
				Name: "rollout_agentloop_parallel_turns_total",
				Help: "Turns whose tool calls ran concurrently.",
			}),
			events: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "rollout_agentloop_events_total",
				Help: "Interventions of the loop in conversations by kind (arguments_replaced, tool_name_repaired, message_inserted, budget_warning, call_not_executed).",
			}, []string{"kind"}),
		}
		for _, c := range []prometheus.Collector{m.episodes, m.active, m.turns, m.calls, m.toolDur, m.parallelT, m.events} {
			if err := prometheus.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					continue // foreign collector with our name: keep ours unregistered
				}
			}
		}
		lm = m
	})
	return lm
}
