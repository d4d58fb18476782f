package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/rollout-rl/rollout/internal/util/version"
)

// tracingFlags configure OpenTelemetry tracing (off unless an endpoint is
// given by flag or by the standard OTEL_EXPORTER_OTLP_* variables). The
// instrumented packages use the global tracer provider, which is a no-op
// until startTracing installs the SDK's.
type tracingFlags struct {
	endpoint string
	protocol string
	insecure bool
}

func (f *tracingFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&f.endpoint, "otel-endpoint", "", "send OpenTelemetry traces (a span per rollout, turn, generation and tool call) to this OTLP collector: URL (http://host:4317) or host:port (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT; none: tracing off)")
	fl.StringVar(&f.protocol, "otel-protocol", "", "OTLP protocol: grpc or http/protobuf (default: $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or $OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)")
	fl.BoolVar(&f.insecure, "otel-insecure", false, "plaintext to a host:port --otel-endpoint (a URL's scheme decides by itself)")
}

// start installs tracing for the life of a command and returns the
// function that flushes and stops it (a no-op when tracing is off). The
// flush runs on a context of its own: the command's may be cancelled by
// then, and the spans of the shutdown are the ones worth keeping.
func (f *tracingFlags) start(ctx context.Context, log *slog.Logger) (stop func(), err error) {
	cfg, err := f.config()
	if err != nil {
		return nil, err
	}
	shutdown, err := setupTracing(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("flush traces", "error", err)
		}
	}, nil
}

// tracingConfig is what setupTracing needs; an empty Endpoint with
// FromEnv false means tracing is off.
type tracingConfig struct {
	Endpoint string // URL or host:port; "" = from the environment
	FromEnv  bool   // the exporter reads OTEL_EXPORTER_OTLP_* itself
	Protocol string // "grpc" or "http/protobuf"
	Insecure bool
}

const (
	protoGRPC = "grpc"
	protoHTTP = "http/protobuf"
)

// config resolves the flags against the standard environment variables.
func (f *tracingFlags) config() (tracingConfig, error) {
	c := tracingConfig{Endpoint: f.endpoint, Insecure: f.insecure, Protocol: f.protocol}
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") && c.Endpoint == "" {
		return tracingConfig{}, nil
	}
	if c.Endpoint == "" {
		c.FromEnv = os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
		if !c.FromEnv {
			return tracingConfig{}, nil
		}
	}
	if c.Protocol == "" {
		c.Protocol = cmp.Or(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), protoGRPC)
	}
	switch c.Protocol {
	case protoGRPC:
	case "http", protoHTTP:
		c.Protocol = protoHTTP
	default:
		return tracingConfig{}, fmt.Errorf("OTLP protocol %q: want grpc or http/protobuf", c.Protocol)
	}
	if c.Endpoint != "" && strings.Contains(c.Endpoint, "://") {
		u, err := url.Parse(c.Endpoint)
		if err != nil {
			return tracingConfig{}, fmt.Errorf("--otel-endpoint: %w", err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return tracingConfig{}, fmt.Errorf("--otel-endpoint %q: want http://host:port, https://host:port or host:port", c.Endpoint)
		}
		if c.Insecure && u.Scheme == "https" {
			return tracingConfig{}, errors.New("--otel-insecure contradicts an https --otel-endpoint")
		}
	}
	return c, nil
}

// setupTracing installs a batching SDK tracer provider exporting over OTLP
// and the W3C trace-context propagator, and returns the provider's
// shutdown (which flushes the spans still queued). It changes nothing when
// tracing is off.
func setupTracing(ctx context.Context, c tracingConfig, log *slog.Logger) (func(context.Context) error, error) {
	if c.Endpoint == "" && !c.FromEnv {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := newExporter(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("start OTLP trace exporter: %w", err)
	}
	// Later detectors win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override the defaults.
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithAttributes(attribute.String("service.name", "rollout"), attribute.String("service.version", version.Get().Version)),
		resource.WithFromEnv(),
	)
	if err != nil && res == nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	otel.SetErrorHandler(&otelErrors{log: log})
	where := c.Endpoint
	if where == "" {
		where = "from OTEL_EXPORTER_OTLP_* environment"
	}
	log.Info("tracing on", "endpoint", where, "protocol", c.Protocol)
	return func(ctx context.Context) error {
		if err := tp.Shutdown(ctx); err != nil {
			return fmt.Errorf("shut down tracer provider: %w", err)
		}
		return nil
	}, nil
}

func newExporter(ctx context.Context, c tracingConfig) (sdktrace.SpanExporter, error) {
	isURL := strings.Contains(c.Endpoint, "://")
	if c.Protocol == protoHTTP {
		var opts []otlptracehttp.Option
		switch {
		case c.Endpoint == "":
		case isURL:
			u, _ := url.Parse(c.Endpoint) // validated by config
			if u.Path == "" || u.Path == "/" {
				u.Path = "/v1/traces" // a base URL, as in OTEL_EXPORTER_OTLP_ENDPOINT
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
		default:
			opts = append(opts, otlptracehttp.WithEndpoint(c.Endpoint))
			if c.Insecure {
				opts = append(opts, otlptracehttp.WithInsecure())
			}
		}
		return otlptracehttp.New(ctx, opts...)
	}
	var opts []otlptracegrpc.Option
	switch {
	case c.Endpoint == "":
	case isURL:
		opts = append(opts, otlptracegrpc.WithEndpointURL(c.Endpoint))
	default:
		opts = append(opts, otlptracegrpc.WithEndpoint(c.Endpoint))
		if c.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
	}
	return otlptracegrpc.New(ctx, opts...)
}

// otelErrors logs the SDK's errors (a collector that is down fails every
// batch) at most once a minute, with the count of those left out.
type otelErrors struct {
	log        *slog.Logger
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (h *otelErrors) Handle(err error) {
	h.mu.Lock()
	now := time.Now()
	if !h.last.IsZero() && now.Sub(h.last) < time.Minute {
		h.suppressed++
		h.mu.Unlock()
		return
	}
	n := h.suppressed
	h.last, h.suppressed = now, 0
	h.mu.Unlock()
	h.log.Warn("opentelemetry", "error", err, "suppressed", n)
}
