package inference

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are process-wide and labelled by endpoint, so several pools (one
// per model) share the collectors.
type metricSet struct {
	inFlight *prometheus.GaugeVec
	latency  *prometheus.HistogramVec
	tokens   *prometheus.CounterVec
	errors   *prometheus.CounterVec
	retries  *prometheus.CounterVec
	healthy  *prometheus.GaugeVec
	// hintVotes counts distillation hint judge votes by verdict
	// (positive, negative, unreadable); hinted counts turns rescored.
	hintVotes *prometheus.CounterVec
	hinted    prometheus.Counter
	// localRenders counts tokens-mode renders under local_render by
	// result: local (used unchecked), verified (checked equal to the
	// server's), mismatch, fallback (the local template failed; the
	// server rendered).
	localRenders *prometheus.CounterVec
}

var (
	metricsOnce sync.Once
	metrics     *metricSet
)

func getMetrics() *metricSet {
	metricsOnce.Do(func() {
		m := &metricSet{
			inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Name: "rollout_inference_in_flight",
				Help: "Requests in flight per inference endpoint.",
			}, []string{"endpoint"}),
			latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Name:    "rollout_inference_request_duration_seconds",
				Help:    "Duration of one HTTP attempt per endpoint and operation.",
				Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
			}, []string{"endpoint", "op"}),
			tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "rollout_inference_tokens_total",
				Help: "Prompt (in) and generated (out) tokens per endpoint.",
			}, []string{"endpoint", "direction"}),
			errors: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "rollout_inference_errors_total",
				Help: "Failed attempts per endpoint by class (infra, request, context_length).",
			}, []string{"endpoint", "class"}),
			retries: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "rollout_inference_retries_total",
				Help: "Attempts re-sent after a connection error or 5xx.",
			}, []string{"endpoint"}),
			healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Name: "rollout_inference_endpoint_healthy",
				Help: "1 while the endpoint's circuit breaker is closed, 0 while it is ejected.",
			}, []string{"endpoint"}),
			hintVotes: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "rollout_distill_hint_votes_total",
				Help: "Distillation hint judge votes by verdict: positive, negative, unreadable (no \\boxed verdict).",
			}, []string{"verdict"}),
			hinted: prometheus.NewCounter(prometheus.CounterOpts{
				Name: "rollout_distill_hinted_turns_total",
				Help: "Turns the distillation teacher scored again under a judge's hint.",
			}),
			localRenders: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "rollout_inference_local_renders_total",
				Help: "Tokens-mode renders made in-process (local_render) by result: local, verified (checked equal to the server's), mismatch (local rendering then turned off), fallback (rendered by the server).",
			}, []string{"result"}),
		}
		for _, c := range []prometheus.Collector{m.inFlight, m.latency, m.tokens, m.errors, m.retries, m.healthy, m.hintVotes, m.hinted, m.localRenders} {
			if err := prometheus.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					// A name clash with a foreign collector: keep the
					// unregistered vector so the code still works.
					continue
				}
			}
		}
		metrics = m
	})
	return metrics
}

// localRenders is the local-render counter for result.
func localRenders(result string) prometheus.Counter {
	return getMetrics().localRenders.WithLabelValues(result)
}

// endpointMetrics caches label-bound children so the hot path does no map
// lookups.
type endpointMetrics struct {
	inFlight  prometheus.Gauge
	tokensIn  prometheus.Counter
	tokensOut prometheus.Counter
	errInfra  prometheus.Counter
	errReq    prometheus.Counter
	errCtx    prometheus.Counter
	retries   prometheus.Counter
	healthy   prometheus.Gauge
	latency   prometheus.ObserverVec
	mu        sync.Mutex
	byOp      map[string]prometheus.Observer
}

func newEndpointMetrics(base string) *endpointMetrics {
	m := getMetrics()
	em := &endpointMetrics{
		inFlight:  m.inFlight.WithLabelValues(base),
		tokensIn:  m.tokens.WithLabelValues(base, "in"),
		tokensOut: m.tokens.WithLabelValues(base, "out"),
		errInfra:  m.errors.WithLabelValues(base, "infra"),
		errReq:    m.errors.WithLabelValues(base, "request"),
		errCtx:    m.errors.WithLabelValues(base, "context_length"),
		retries:   m.retries.WithLabelValues(base),
		healthy:   m.healthy.WithLabelValues(base),
		latency:   m.latency.MustCurryWith(prometheus.Labels{"endpoint": base}),
		byOp:      map[string]prometheus.Observer{},
	}
	em.healthy.Set(1)
	return em
}

func (em *endpointMetrics) observer(op string) prometheus.Observer {
	em.mu.Lock()
	o, ok := em.byOp[op]
	if !ok {
		o = em.latency.WithLabelValues(op)
		em.byOp[op] = o
	}
	em.mu.Unlock()
	return o
}

func (em *endpointMetrics) countError(err error) {
	switch {
	case errors.Is(err, ErrContextLength):
		em.errCtx.Inc()
	case errors.Is(err, ErrRequest):
		em.errReq.Inc()
	default:
		em.errInfra.Inc()
	}
}
