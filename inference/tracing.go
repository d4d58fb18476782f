package inference

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rollout-rl/rollout/internal/util/tracing"
)

const tracer = tracing.Tracer("github.com/rollout-rl/rollout/inference")

// Span attributes of this package (gen_ai.* keys follow OpenTelemetry's
// semantic conventions for generative AI).
const (
	attrBackend      = attribute.Key("rollout.inference.backend")
	attrEndpoint     = attribute.Key("rollout.inference.endpoint") // base URL that served the call
	attrRequestID    = attribute.Key("rollout.inference.request_id")
	attrAttempt      = attribute.Key("rollout.inference.attempt")
	attrInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	attrOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
	attrFinish       = attribute.Key("gen_ai.response.finish_reasons")
	attrHTTPStatus   = attribute.Key("http.response.status_code")
)

// startGeneration starts the span of one Episode.Generate. Its children
// are the HTTP requests of the turn (render, generate, detokenize).
func startGeneration(ctx context.Context, spec *EpisodeSpec, backend string) (context.Context, trace.Span) {
	ctx, span := tracer.Start(ctx, "inference.generate")
	if span.IsRecording() {
		span.SetAttributes(tracing.Rollout.String(spec.ID), tracing.Model.String(spec.Model), attrBackend.String(backend))
	}
	return ctx, span
}

// endGeneration records the outcome of a generation and ends its span.
func endGeneration(span trace.Span, t Turn, err error) {
	if span.IsRecording() {
		if err != nil {
			var e *Error
			if errors.As(err, &e) && e.Endpoint != "" {
				span.SetAttributes(attrEndpoint.String(e.Endpoint))
			}
			tracing.Fail(span, err)
		} else {
			span.SetAttributes(
				attrEndpoint.String(t.Endpoint),
				attrInputTokens.Int(t.PromptTokens),
				attrOutputTokens.Int(t.CompletionTokens),
				attrFinish.StringSlice([]string{t.FinishReason}),
			)
		}
	}
	span.End()
}

// startRequest starts the span of one HTTP attempt through the pool
// (attempt counts from 0; the attribute from 1, as rollout.attempt does).
func startRequest(ctx context.Context, op, base, reqID string, attempt int) (context.Context, trace.Span) {
	ctx, span := tracer.StartClient(ctx, op)
	if span.IsRecording() {
		span.SetAttributes(attrEndpoint.String(base), attrAttempt.Int(attempt+1))
		if reqID != "" {
			span.SetAttributes(attrRequestID.String(reqID))
		}
	}
	return ctx, span
}

func endRequest(span trace.Span, err error) {
	if span.IsRecording() && err != nil {
		var e *Error
		if errors.As(err, &e) && e.Status != 0 {
			span.SetAttributes(attrHTTPStatus.Int(e.Status))
		}
		tracing.Fail(span, err)
	}
	span.End()
}
