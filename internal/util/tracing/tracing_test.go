package tracing

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const tr = Tracer("github.com/rollout-rl/rollout/internal/util/tracing")

// TestOffThenOn is one test because the provider is process-global: the
// off path can only be observed before any provider is installed.
func TestOffThenOn(t *testing.T) {
	ctx := context.Background()
	// The global provider cannot be uninstalled: with go test -count > 1
	// the off path is only checkable in the first run.
	h := http.Header{}
	if !Enabled() {
		got, span := tr.Start(ctx, "x")
		if got != ctx || span.IsRecording() || span.SpanContext().IsValid() {
			t.Fatal("the off path changed the context or returned a live span")
		}
		errE := errors.New("e")
		if n := testing.AllocsPerRun(1000, func() {
			c, s := tr.Start(ctx, "x")
			if s.IsRecording() {
				t.Fatal("recording")
			}
			Fail(s, errE)
			s.End()
			_, s = tr.StartClient(c, "y")
			s.End()
		}); n != 0 {
			t.Fatalf("off path allocates %v times per span pair, want 0", n)
		}
		Inject(ctx, h)
		if len(h) != 0 {
			t.Fatalf("headers injected while off: %v", h)
		}
	}

	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer func() { _ = tp.Shutdown(ctx) }()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	if !Enabled() {
		t.Fatal("not enabled after SetTracerProvider")
	}
	pctx, parent := tr.Start(ctx, "parent")
	cctx, child := tr.StartClient(pctx, "child")
	Inject(cctx, h)
	if tp := h.Get("traceparent"); !strings.Contains(tp, child.SpanContext().SpanID().String()) {
		t.Errorf("traceparent %q does not name the child span", tp)
	}
	Fail(child, errors.New(strings.Repeat("é", 2000)))
	child.End()
	FailMsg(parent, "bad")
	parent.End()
	spans := sr.Ended()
	if len(spans) != 2 || spans[0].Name() != "child" || spans[0].Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("spans %v", spans)
	}
	st := spans[0].Status()
	if st.Code != codes.Error || len(st.Description) > maxText+len("…") || !utf8.ValidString(st.Description) || len(spans[0].Events()) != 1 {
		t.Errorf("child status %v (%d bytes), events %v", st.Code, len(st.Description), spans[0].Events())
	}
	if spans[1].Status().Code != codes.Error || spans[1].Status().Description != "bad" || len(spans[1].Events()) != 0 {
		t.Errorf("parent status %v events %v", spans[1].Status(), spans[1].Events())
	}
}

func TestCut(t *testing.T) {
	if Cut("short") != "short" {
		t.Fatal("cut a short string")
	}
	s := strings.Repeat("a", maxText-1) + "é" // the 2-byte rune straddles the limit
	if got := Cut(s); got != strings.Repeat("a", maxText-1)+"…" {
		t.Fatalf("Cut = …%q", got[len(got)-8:])
	}
}
