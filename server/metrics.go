package server

import (
	"context"
	"errors"
	"net/http"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

// Rollout-level metrics are observed here, where finished rollouts and
// groups reach the service; the packages below (inference, agentloop,
// sandbox, trajectory) export their own. Env labels are env names, a
// bounded set.
var (
	metricRollouts = register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_rollouts_total",
		Help: "Finished rollouts (last attempt) by env and status (ok, infra_failed).",
	}, []string{"env", "status"}))
	metricFailures = register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_rollout_failures_total",
		Help: "Infra-failed rollouts by env and failure kind (runner taxonomy).",
	}, []string{"env", "kind"}))
	metricTurns = register(prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rollout_rollout_turns",
		Help:    "Turns used per finished rollout.",
		Buckets: []float64{1, 2, 3, 5, 8, 13, 21, 34, 55, 89},
	}, []string{"env"}))
	metricTokens = register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_rollout_tokens_total",
		Help: "Tokens of finished rollouts' sequences (tokens mode) by kind: prompt (before the first generation) or completion.",
	}, []string{"env", "kind"}))
	metricReward = register(prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rollout_reward",
		Help:    "Rewards of ok rollouts.",
		Buckets: []float64{-1, -0.5, 0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 2},
	}, []string{"env"}))
	metricPhase = register(prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rollout_rollout_phase_seconds",
		Help:    "Time per rollout spent in each phase: sandbox_start, generation, tools, reward, total.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 14),
	}, []string{"env", "phase"}))
	metricGroups = register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_groups_total",
		Help: "Finished groups by env and source (job, collect); dropped groups included.",
	}, []string{"env", "source"}))
	metricGroupsDropped = register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_groups_dropped_total",
		Help: "Groups whose ok rollouts all scored the same (advantage.drop_equal).",
	}, []string{"env"}))
	metricCollectStreams = register(prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rollout_collect_streams",
		Help: "Open CollectGroups streams.",
	}))
	metricUpdates = register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_policy_updates_total",
		Help: "BeginPolicyUpdate calls that paused the engines, by mode and fallback (drain-and-wait).",
	}, []string{"mode", "fallback"}))
	metricPauseSeconds = register(prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "rollout_policy_update_pause_seconds", Help: "Time BeginPolicyUpdate took to pause the engines.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	}))
	metricResumeSeconds = register(prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "rollout_policy_update_resume_seconds", Help: "Time EndPolicyUpdate took to resume the engines.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	}))
	metricStale = register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_groups_stale_total",
		Help: "Groups outside async.max_staleness by what was done (dropped, regenerated, marked).",
	}, []string{"action"}))
	metricCollectInFlight = register(prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rollout_collect_groups_in_flight",
		Help: "Groups started for CollectGroups streams and not yet sent.",
	}))
	metricGatewaySessions = register(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rollout_gateway_sessions_opened_total",
		Help: "Sessions opened on a standalone gateway (rollout gateway).",
	}))
	metricGatewayUnscored = register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_gateway_sessions_unscored_total",
		Help: "Standalone gateway sessions recorded without a reward, by how they ended (expired: idle expiry or shutdown; failed: their record could not be finished).",
	}, []string{"state"}))
	metricTenantHeld = register(prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "rollout_tenant_held",
		Help: "What each tenant holds against its quotas: resource jobs (jobs and collect streams running) or sandboxes (the sum of their limits.sandboxes).",
	}, []string{"tenant", "resource"}))
	metricTenantRejected = register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_tenant_rejected_total",
		Help: "Calls refused RESOURCE_EXHAUSTED by tenant and the quota they exceeded (jobs, sandboxes, rows, rate).",
	}, []string{"tenant", "quota"}))
	metricRPCs = register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rollout_grpc_requests_total",
		Help: "gRPC calls by method and status code.",
	}, []string{"method", "code"}))
	metricRPCSeconds = register(prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rollout_grpc_request_duration_seconds",
		Help:    "Duration of unary gRPC calls by method.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
	}, []string{"method"}))
)

// serviceCollectors are the metrics above, in declaration order; register
// adds one, so a new metric cannot be left out of MetricsHandler.
var serviceCollectors []prometheus.Collector

func register[C prometheus.Collector](c C) C {
	serviceCollectors = append(serviceCollectors, c)
	return c
}

var registerOnce sync.Once

// MetricsHandler serves every rollout_* metric of the process (the
// service's, the trajectory writer's, and those the sandbox, inference and
// agent-loop packages register on the default registry) plus the Go
// runtime's, in the Prometheus text format.
func MetricsHandler() http.Handler {
	registerOnce.Do(func() {
		cs := append(slices.Clone(serviceCollectors), trajectory.Collectors()...)
		for _, c := range cs {
			if err := prometheus.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					// A foreign collector with the same name: keep serving the rest.
					continue
				}
			}
		}
	})
	return promhttp.Handler()
}

func observeRollout(env string, ro *runner.Rollout) {
	metricRollouts.WithLabelValues(env, ro.Status).Inc()
	if ro.Status != runner.StatusOK {
		kind := "unknown"
		if ro.Failure != nil {
			kind = ro.Failure.Kind
		}
		metricFailures.WithLabelValues(env, kind).Inc()
		return
	}
	res := &ro.Result
	metricTurns.WithLabelValues(env).Observe(float64(res.TurnsUsed))
	metricReward.WithLabelValues(env).Observe(ro.Score.Value)
	if seq := res.Sequence; len(seq.Tokens) > 0 {
		metricTokens.WithLabelValues(env, "prompt").Add(float64(seq.PromptLen))
		metricTokens.WithLabelValues(env, "completion").Add(float64(len(seq.Tokens) - seq.PromptLen))
	}
	t := ro.Timings
	for _, p := range []struct {
		name string
		d    time.Duration
	}{{"sandbox_start", t.SandboxStart}, {"generation", t.Generation}, {"tools", t.Tools}, {"reward", t.Reward}, {"total", t.Total}} {
		if p.d > 0 || p.name == "total" {
			metricPhase.WithLabelValues(env, p.name).Observe(p.d.Seconds())
		}
	}
}

func observeGroup(env, source string, g *runner.Group) {
	metricGroups.WithLabelValues(env, source).Inc()
	if g.Dropped {
		metricGroupsDropped.WithLabelValues(env).Inc()
	}
}

// rpcMetrics counts every call by method and code; unary calls are timed
// (streams live as long as their jobs, so their duration says nothing).
func rpcUnaryMetrics(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := next(ctx, req)
	m := path.Base(info.FullMethod)
	metricRPCSeconds.WithLabelValues(m).Observe(time.Since(start).Seconds())
	metricRPCs.WithLabelValues(m, status.Code(err).String()).Inc()
	return resp, err
}

func rpcStreamMetrics(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	err := next(srv, ss)
	metricRPCs.WithLabelValues(path.Base(info.FullMethod), status.Code(err).String()).Inc()
	return err
}

// jobsCollector reports the server's jobs by state at scrape time.
type jobsCollector struct {
	s    *Server
	desc *prometheus.Desc
}

// Collector returns a collector of the server's jobs by state
// (rollout_jobs{state}). Register it on the registry MetricsHandler serves.
func (s *Server) Collector() prometheus.Collector {
	return &jobsCollector{s: s, desc: prometheus.NewDesc("rollout_jobs", "Jobs known to the server by state.", []string{"state"}, nil)}
}

func (c *jobsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *jobsCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[rolloutv1.JobState]int{}
	c.s.mu.Lock()
	list := make([]*jobRun, 0, len(c.s.jobs))
	for _, jr := range c.s.jobs {
		list = append(list, jr)
	}
	c.s.mu.Unlock()
	for _, jr := range list {
		jr.mu.Lock()
		counts[jr.st.State]++
		jr.mu.Unlock()
	}
	for _, st := range []rolloutv1.JobState{rolloutv1.JobState_JOB_STATE_RUNNING, rolloutv1.JobState_JOB_STATE_SUCCEEDED,
		rolloutv1.JobState_JOB_STATE_FAILED, rolloutv1.JobState_JOB_STATE_CANCELLED} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[st]), jobStateName(st))
	}
}

func jobStateName(st rolloutv1.JobState) string {
	switch st {
	case rolloutv1.JobState_JOB_STATE_RUNNING:
		return "running"
	case rolloutv1.JobState_JOB_STATE_SUCCEEDED:
		return "succeeded"
	case rolloutv1.JobState_JOB_STATE_FAILED:
		return "failed"
	case rolloutv1.JobState_JOB_STATE_CANCELLED:
		return "cancelled"
	}
	return "unspecified"
}
