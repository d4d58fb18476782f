package runner

import (
	"context"
	"fmt"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/tracingtest"
	"github.com/rollout-rl/rollout/rewards"
)

// spanTree indexes ended spans by id and by parent.
type spanTree struct {
	byID     map[trace.SpanID]sdktrace.ReadOnlySpan
	children map[trace.SpanID][]sdktrace.ReadOnlySpan
	roots    []sdktrace.ReadOnlySpan
}

func newSpanTree(spans []sdktrace.ReadOnlySpan) *spanTree {
	t := &spanTree{byID: map[trace.SpanID]sdktrace.ReadOnlySpan{}, children: map[trace.SpanID][]sdktrace.ReadOnlySpan{}}
	for _, s := range spans {
		t.byID[s.SpanContext().SpanID()] = s
	}
	for _, s := range spans {
		if p := s.Parent(); p.IsValid() {
			t.children[p.SpanID()] = append(t.children[p.SpanID()], s)
		} else {
			t.roots = append(t.roots, s)
		}
	}
	return t
}

// String draws the tree, for failure messages.
func (t *spanTree) String() string {
	var b strings.Builder
	var walk func(s sdktrace.ReadOnlySpan, depth int)
	walk = func(s sdktrace.ReadOnlySpan, depth int) {
		fmt.Fprintf(&b, "%s%s %v %v\n", strings.Repeat("  ", depth), s.Name(), s.Status(), s.Attributes())
		for _, c := range t.children[s.SpanContext().SpanID()] {
			walk(c, depth+1)
		}
	}
	for _, r := range t.roots {
		walk(r, 0)
	}
	return b.String()
}

// kids returns the children of s named name.
func (t *spanTree) kids(s sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, c := range t.children[s.SpanContext().SpanID()] {
		if c.Name() == name {
			out = append(out, c)
		}
	}
	return out
}

func attrString(s sdktrace.ReadOnlySpan, key string) string {
	v, _ := tracingtest.Attr(s, key)
	return v.Emit()
}

func attrInt(s sdktrace.ReadOnlySpan, key string) int64 {
	v, _ := tracingtest.Attr(s, key)
	return v.AsInt64()
}

// callEnv offers one call-only tool (recorded, never executed), so that an
// episode has tool calls without a sandbox.
type callEnv struct{}

func (callEnv) Name() string            { return "trace" }
func (callEnv) Defaults() envs.Defaults { return envs.Defaults{GroupSize: 2, MaxTurns: 4} }
func (callEnv) Items(context.Context, string) ([]datasets.Item, error) {
	return []datasets.Item{{ID: "item-0", Data: map[string]any{"q": "look it up"}}}, nil
}
func (callEnv) Task(context.Context, datasets.Item) (envs.Task, error) {
	return envs.Task{
		Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "look it up"}},
		CallOnly: []openai.Tool{{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
			Name: "lookup", Parameters: map[string]any{"type": "object", "properties": map[string]any{"key": map[string]any{"type": "string"}}}}}},
	}, nil
}
func (callEnv) Reward(_ context.Context, _ datasets.Item, out envs.Outcome, _ envs.Sandbox) (rewards.Score, error) {
	if strings.Contains(out.Final, "found") {
		return rewards.Score{Value: 1}, nil
	}
	return rewards.Score{}, nil
}

// TestTracingSpanTree runs one group of two rollouts in tokens mode against
// the simulator and checks the span tree: group > rollout > turn >
// generation > HTTP request, turn > tool call, rollout > reward.
func TestTracingSpanTree(t *testing.T) {
	sr := tracingtest.Record(t)
	srv, err := sim.Start(context.Background(), sim.Config{Family: "hermes", Scripts: []sim.Script{{Match: "look it up", Steps: []sim.Step{
		{ToolCalls: []sim.Call{{Name: "lookup", Arguments: map[string]any{"key": "x"}}}},
		{Final: "found it"},
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	pol, err := inference.Open(inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer pol.Close()
	cfg := baseConfig()
	cfg.Env, cfg.Parser = "trace", "hermes"
	sink := &memSink{}
	r, err := New(cfg, Deps{Logger: quiet, Env: callEnv{}, Policy: pol, Sinks: []Sink{sink}, RunID: "run_trace"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(sink.groups) != 1 || sink.groups[0].OK != 2 {
		t.Fatalf("groups %+v", sink.groups)
	}
	ids := map[string]bool{}
	for _, ro := range sink.groups[0].Rollouts {
		ids[ro.ID] = true
	}

	tree := newSpanTree(sr.Ended())
	defer func() {
		if t.Failed() {
			t.Log("spans:\n" + tree.String())
		}
	}()
	if len(tree.roots) != 1 || tree.roots[0].Name() != "runner.group" {
		var names []string
		for _, s := range tree.roots {
			names = append(names, s.Name())
		}
		t.Fatalf("root spans %v, want one runner.group", names)
	}
	group := tree.roots[0]
	if got := attrString(group, "rollout.group_id"); got != "item-0" {
		t.Errorf("group_id %q", got)
	}
	if attrString(group, "rollout.run_id") != "run_trace" || attrString(group, "rollout.env") != "trace" || attrInt(group, "rollout.group.ok") != 2 {
		t.Errorf("group attributes %v", group.Attributes())
	}
	rollouts := tree.kids(group, "runner.rollout")
	if len(rollouts) != 2 {
		t.Fatalf("%d rollout spans, want 2", len(rollouts))
	}
	for _, ro := range rollouts {
		id := attrString(ro, "rollout.id")
		if !ids[id] {
			t.Errorf("rollout span id %q is not a rollout of the group %v", id, ids)
		}
		if ro.SpanContext().TraceID() != group.SpanContext().TraceID() {
			t.Error("rollout span in another trace")
		}
		if attrString(ro, "rollout.status") != StatusOK || attrInt(ro, "rollout.attempt") != 1 || attrInt(ro, "rollout.turns") != 2 ||
			attrString(ro, "rollout.stop_reason") != "finished" || ro.Status().Code == codes.Error {
			t.Errorf("rollout %s: attributes %v status %v", id, ro.Attributes(), ro.Status())
		}
		if v, ok := tracingtest.Attr(ro, "rollout.reward"); !ok || v.AsFloat64() != 1 {
			t.Errorf("rollout %s: reward %v", id, v.Emit())
		}
		if rw := tree.kids(ro, "runner.reward"); len(rw) != 1 {
			t.Errorf("rollout %s: %d reward spans", id, len(rw))
		}
		turns := tree.kids(ro, "agentloop.turn")
		if len(turns) != 2 {
			t.Fatalf("rollout %s: %d turn spans, want 2", id, len(turns))
		}
		for _, turn := range turns {
			n := attrInt(turn, "rollout.turn")
			if attrString(turn, "rollout.id") != id {
				t.Errorf("turn %d: rollout.id %q", n, attrString(turn, "rollout.id"))
			}
			gens := tree.kids(turn, "inference.generate")
			if len(gens) != 1 {
				t.Fatalf("turn %d: %d generation spans", n, len(gens))
			}
			g := gens[0]
			if attrString(g, "rollout.inference.endpoint") != srv.URL || attrInt(g, "gen_ai.usage.input_tokens") <= 0 ||
				attrInt(g, "gen_ai.usage.output_tokens") <= 0 || attrString(g, "rollout.inference.backend") != inference.BackendVLLM {
				t.Errorf("turn %d generation attributes %v", n, g.Attributes())
			}
			if reqs := tree.kids(g, "POST /v1/completions"); len(reqs) != 1 || reqs[0].SpanKind() != trace.SpanKindClient {
				t.Errorf("turn %d: completion request spans %v", n, reqs)
			}
			calls := tree.kids(turn, "tools.execute")
			switch n {
			case 1:
				if len(calls) != 1 || attrString(calls[0], "gen_ai.tool.name") != "lookup" || calls[0].Status().Code == codes.Error ||
					attrString(calls[0], "gen_ai.tool.call.id") == "" {
					t.Errorf("turn 1 tool spans %v", calls)
				}
				if attrInt(turn, "agentloop.tool_calls") != 1 {
					t.Errorf("turn 1 attributes %v", turn.Attributes())
				}
			case 2:
				if len(calls) != 0 || attrString(turn, "agentloop.stop_reason") != "finished" {
					t.Errorf("turn 2: %d tool spans, attributes %v", len(calls), turn.Attributes())
				}
			default:
				t.Errorf("turn number %d", n)
			}
		}
	}
}

// TestTracingFailedAttempts: each attempt of a retried rollout is a span of
// its own, marked failed with the failure kind, as are its turn and (here
// fake) generation.
func TestTracingFailedAttempts(t *testing.T) {
	sr := tracingtest.Record(t)
	env := &scoreEnv{items: items(1), reward: func(envs.Outcome) (rewards.Score, error) { return rewards.Score{Value: 1}, nil }}
	pol := &scriptPolicy{fail: func(string) error { return fmt.Errorf("generate: %w", inference.ErrInfra) }}
	cfg := baseConfig()
	cfg.GroupSize, cfg.Retries = 1, 1
	r, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: pol, Sinks: []Sink{&memSink{}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	tree := newSpanTree(sr.Ended())
	if len(tree.roots) != 1 {
		t.Fatalf("%d roots", len(tree.roots))
	}
	rollouts := tree.kids(tree.roots[0], "runner.rollout")
	if len(rollouts) != 2 {
		t.Fatalf("%d rollout spans, want one per attempt (2)", len(rollouts))
	}
	seen := map[int64]bool{}
	for _, ro := range rollouts {
		seen[attrInt(ro, "rollout.attempt")] = true
		if ro.Status().Code != codes.Error || attrString(ro, "rollout.status") != StatusInfraFailed || attrString(ro, "rollout.failure_kind") != FailInference {
			t.Errorf("attempt span: status %v attributes %v", ro.Status(), ro.Attributes())
		}
		if _, ok := tracingtest.Attr(ro, "rollout.reward"); ok {
			t.Error("a failed rollout carries a reward")
		}
		turns := tree.kids(ro, "agentloop.turn")
		if len(turns) != 1 || turns[0].Status().Code != codes.Error || attrString(turns[0], "agentloop.stop_reason") != "inference_error" {
			t.Errorf("turn spans %v", turns)
		} else if ev := turns[0].Events(); len(ev) == 0 || !strings.Contains(fmt.Sprint(ev[0].Attributes), "inference infrastructure failure") {
			t.Errorf("turn span events %v", ev)
		}
	}
	if !seen[1] || !seen[2] {
		t.Errorf("attempts %v", seen)
	}
}
