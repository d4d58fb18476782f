package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

func TestTracingConfig(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SDK_DISABLED"} {
		t.Setenv(k, "")
	}
	cases := []struct {
		name string
		f    tracingFlags
		env  map[string]string
		want tracingConfig
		err  string
	}{
		{name: "off by default"},
		{name: "flag URL", f: tracingFlags{endpoint: "http://c:4317"}, want: tracingConfig{Endpoint: "http://c:4317", Protocol: protoGRPC}},
		{name: "host:port insecure http", f: tracingFlags{endpoint: "c:4318", protocol: "http", insecure: true},
			want: tracingConfig{Endpoint: "c:4318", Protocol: protoHTTP, Insecure: true}},
		{name: "from env", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
			want: tracingConfig{FromEnv: true, Protocol: protoHTTP}},
		{name: "traces env wins", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, want: tracingConfig{FromEnv: true, Protocol: protoGRPC}},
		{name: "sdk disabled", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}},
		{name: "bad protocol", f: tracingFlags{endpoint: "c:1", protocol: "http/json"}, err: "want grpc or http/protobuf"},
		{name: "bad scheme", f: tracingFlags{endpoint: "ftp://c:1"}, err: "want http://host:port"},
		{name: "insecure https", f: tracingFlags{endpoint: "https://c:1", insecure: true}, err: "contradicts"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			got, err := c.f.config()
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("config %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

// collector is a stand-in OTLP trace receiver (gRPC and HTTP).
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans map[string]*tracepb.ResourceSpans // span name → its resource
}

func (c *collector) add(req *coltracepb.ExportTraceServiceRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.spans[s.Name] = rs
			}
		}
	}
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (c *collector) serviceOf(span string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rs, ok := c.spans[span]
	if !ok {
		return "", false
	}
	for _, kv := range rs.Resource.GetAttributes() {
		if kv.Key == "service.name" {
			return kv.Value.GetStringValue(), true
		}
	}
	return "", true
}

// TestTracingExports: with an endpoint, a span reaches the collector by
// the time the shutdown function returns (the batch is flushed), over
// either protocol, and nothing is left running.
func TestTracingExports(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "")
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	defer otel.SetTracerProvider(noop.NewTracerProvider())
	log := slog.New(slog.DiscardHandler)

	t.Run("grpc", func(t *testing.T) {
		col := &collector{spans: map[string]*tracepb.ResourceSpans{}}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		coltracepb.RegisterTraceServiceServer(gs, col)
		go func() { _ = gs.Serve(ln) }()
		defer gs.Stop()
		exportOne(t, tracingConfig{Endpoint: "http://" + ln.Addr().String(), Protocol: protoGRPC}, log, "grpc-span")
		if svc, ok := col.serviceOf("grpc-span"); !ok || svc != "rollout" {
			t.Fatalf("collector got span %v with service %q", ok, svc)
		}
	})
	t.Run("http", func(t *testing.T) {
		col := &collector{spans: map[string]*tracepb.ResourceSpans{}}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/traces" {
				http.NotFound(w, r)
				return
			}
			body, _ := io.ReadAll(r.Body)
			var req coltracepb.ExportTraceServiceRequest
			if err := proto.Unmarshal(body, &req); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			col.add(&req)
			w.Header().Set("Content-Type", "application/x-protobuf")
			b, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
			_, _ = w.Write(b)
		}))
		defer srv.Close()
		t.Setenv("OTEL_SERVICE_NAME", "collector-a")
		exportOne(t, tracingConfig{Endpoint: srv.URL, Protocol: protoHTTP}, log, "http-span")
		if svc, ok := col.serviceOf("http-span"); !ok || svc != "collector-a" {
			t.Fatalf("collector got span %v with service %q (OTEL_SERVICE_NAME must win)", ok, svc)
		}
	})
}

func exportOne(t *testing.T, cfg tracingConfig, log *slog.Logger, name string) {
	t.Helper()
	ctx := context.Background()
	shutdown, err := setupTracing(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("test").Start(ctx, name)
	span.End()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestTracingOffLeavesGlobalsAlone: without an endpoint nothing is
// installed (the instrumented packages stay on their no-op path).
func TestTracingOffLeavesGlobalsAlone(t *testing.T) {
	before := otel.GetTracerProvider()
	shutdown, err := setupTracing(context.Background(), tracingConfig{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if otel.GetTracerProvider() != before {
		t.Fatal("tracing off replaced the global tracer provider")
	}
}
