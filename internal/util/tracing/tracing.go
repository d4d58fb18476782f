// Package tracing is the project's thin layer over the OpenTelemetry trace
// API. Instrumented packages start spans through Tracer.Start, which does nothing
// (no allocation, no context copy) until a tracer provider is installed
// with otel.SetTracerProvider — cmd/rollout does that for --otel-endpoint.
// The SDK and exporters are not imported here, so instrumented packages
// stay light; the attribute keys shared by several packages live here too.
package tracing

import (
	"context"
	"errors"
	"net/http"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// unset is the global provider before anyone installs one: otel hands out
// the same delegating provider until SetTracerProvider replaces it.
var unset = otel.GetTracerProvider()

// off is returned while tracing is disabled. noop.Span is zero-sized, so
// returning it as a trace.Span allocates nothing.
var off trace.Span = noop.Span{}

// Enabled reports whether a tracer provider has been installed. It costs
// one atomic load, which is why the hot paths ask it first instead of
// letting the global no-op tracer allocate a span and a context per call.
func Enabled() bool { return otel.GetTracerProvider() != unset }

// Tracer names the instrumentation scope of a package (its import path).
// Spans are started through the provider installed at the time, never
// through a tracer kept from before: otel's global delegation binds
// tracers to the first provider ever installed, which would pin them to a
// test's provider after that test replaced it.
type Tracer string

// Start starts an internal span as a child of the span in ctx. While
// tracing is disabled it returns ctx unchanged and a no-op span; callers
// that build attributes check span.IsRecording() first so that the off
// path stays free. (No variadic options: the slice would escape through
// the interface call and cost an allocation even when tracing is off.)
func (t Tracer) Start(ctx context.Context, name string) (context.Context, trace.Span) {
	if !Enabled() {
		return ctx, off
	}
	return otel.GetTracerProvider().Tracer(string(t)).Start(ctx, name)
}

var clientKind = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}

// StartClient is Start for a span of an outgoing request (kind client).
func (t Tracer) StartClient(ctx context.Context, name string) (context.Context, trace.Span) {
	if !Enabled() {
		return ctx, off
	}
	return otel.GetTracerProvider().Tracer(string(t)).Start(ctx, name, clientKind...)
}

// Fail records err on span and marks it failed. A nil err does nothing.
func Fail(span trace.Span, err error) {
	if err == nil || !span.IsRecording() {
		return
	}
	msg := Cut(err.Error())
	span.RecordError(errors.New(msg))
	span.SetStatus(codes.Error, msg)
}

// FailMsg marks span failed with a message and no error event (an outcome
// that is a failure but not a Go error, e.g. a tool that reported one).
func FailMsg(span trace.Span, msg string) {
	if span.IsRecording() {
		span.SetStatus(codes.Error, Cut(msg))
	}
}

// Attribute keys shared by several packages. Where OpenTelemetry's
// semantic conventions name the quantity (gen_ai.*, server.*, http.*),
// their key is used; the rest are prefixed with "rollout.".
const (
	RunID    = attribute.Key("rollout.run_id")
	Env      = attribute.Key("rollout.env")
	GroupID  = attribute.Key("rollout.group_id")
	Rollout  = attribute.Key("rollout.id")
	Turn     = attribute.Key("rollout.turn")
	ToolName = attribute.Key("gen_ai.tool.name")
	ToolCall = attribute.Key("gen_ai.tool.call.id")
	Model    = attribute.Key("gen_ai.request.model")
)

// Inject writes the span context of ctx into outgoing HTTP headers (W3C
// traceparent with the propagator cmd/rollout installs), so that a model
// server that traces (vLLM --otlp-traces-endpoint) nests its spans under
// ours. It does nothing while tracing is disabled.
func Inject(ctx context.Context, h http.Header) {
	if Enabled() {
		otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// maxText bounds error texts put on spans: a tool's error can quote
// megabytes of output, and an exporter would ship it for every span.
const maxText = 1024

// Cut shortens s to at most maxText bytes on a UTF-8 boundary.
func Cut(s string) string {
	if len(s) <= maxText {
		return s
	}
	i := maxText
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}
