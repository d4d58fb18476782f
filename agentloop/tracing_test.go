package agentloop

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/rollout-rl/rollout/internal/testkit/tracingtest"
)

func spanAttr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	v, _ := tracingtest.Attr(s, key)
	return v
}

// childrenOf returns the spans whose parent is p, by name.
func childrenOf(spans []sdktrace.ReadOnlySpan, p interface{ SpanContext() trace.SpanContext }, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Parent().SpanID() == p.SpanContext().SpanID() && s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// TestTurnAndToolSpans: turns nest under the caller's span, tool calls
// (also those run in parallel goroutines) under their turn; a tool error
// and a sandbox failure mark their spans failed.
func TestTurnAndToolSpans(t *testing.T) {
	sr := tracingtest.Record(t)
	ctx, root := otel.Tracer("test").Start(context.Background(), "caller")
	res, err, _, _ := run(t, ctx, Config{}, nil,
		calls([2]string{"look", `{"path":"a"}`}, [2]string{"look", `{"path":"b"}`}),
		calls([2]string{"boom", `{}`}),
		calls([2]string{"dead", `{}`}))
	root.End()
	if res.StopReason != StopSandboxErr || err == nil {
		t.Fatalf("stop %s err %v", res.StopReason, err)
	}
	spans := sr.Ended()
	turns := childrenOf(spans, root, "agentloop.turn")
	if len(turns) != 3 {
		t.Fatalf("%d turn spans under the caller's span, want 3 (%d spans in all)", len(turns), len(spans))
	}
	byTurn := map[int64]sdktrace.ReadOnlySpan{}
	for _, s := range turns {
		byTurn[spanAttr(s, "rollout.turn").AsInt64()] = s
		if spanAttr(s, "rollout.id").AsString() != "r1" {
			t.Errorf("turn span attributes %v", s.Attributes())
		}
	}

	t1 := byTurn[1]
	looks := childrenOf(spans, t1, "tools.execute")
	if len(looks) != 2 || !spanAttr(t1, "agentloop.parallel").AsBool() || spanAttr(t1, "agentloop.tool_calls").AsInt64() != 2 {
		t.Fatalf("turn 1: %d tool spans, attributes %v", len(looks), t1.Attributes())
	}
	for _, s := range looks {
		if spanAttr(s, "gen_ai.tool.name").AsString() != "look" || s.Status().Code == codes.Error {
			t.Errorf("look span %v %v", s.Attributes(), s.Status())
		}
	}

	t2 := byTurn[2]
	booms := childrenOf(spans, t2, "tools.execute")
	if len(booms) != 1 || booms[0].Status().Code != codes.Error ||
		!strings.Contains(spanAttr(booms[0], "rollout.tool.error").AsString(), "disk on fire") {
		t.Fatalf("turn 2 tool spans %v", booms)
	}
	if t2.Status().Code == codes.Error {
		t.Error("a tool error failed the turn; only infrastructure failures do")
	}

	t3 := byTurn[3]
	deads := childrenOf(spans, t3, "tools.execute")
	if len(deads) != 1 || deads[0].Status().Code != codes.Error || len(deads[0].Events()) == 0 {
		t.Fatalf("turn 3 tool spans %v", deads)
	}
	if t3.Status().Code != codes.Error || spanAttr(t3, "agentloop.stop_reason").AsString() != string(StopSandboxErr) {
		t.Fatalf("turn 3: status %v attributes %v", t3.Status(), t3.Attributes())
	}
}
