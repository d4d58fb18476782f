package agentloop

import (
	"context"
	"reflect"
	"testing"

	"github.com/rollout-rl/rollout/parsers"
)

// Every tool call's parse outcome is recorded per turn: ok, repaired
// (with what the parser fixed), malformed (with the parser's reason),
// in tokens mode (the loop's parser) and chat mode (the server's calls).
func TestCallStatuses(t *testing.T) {
	tokens := []step{
		rawTurn("stop", "<tool_call>\n{\"name\": \"look\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>\n"+
			"<tool_call>\n{\"name\": \"look\", \"arguments\": \"{\\\"path\\\": \\\"b\\\"}\"}\n</tool_call>\n"+
			"<tool_call>\n{\"name\": \"look\", \"arguments\": [1]}\n</tool_call>"),
		rawTurn("stop", "<tool_call>\n{\"name\": \"look\", \"arguments\": {\"path\": \"c\"}}"),
		final("done"),
	}
	res, err, _, _ := run(t, context.Background(), Config{Parser: "hermes"}, nil, tokens...)
	if err != nil || res.StopReason != StopFinished {
		t.Fatalf("stop %s: %v", res.StopReason, err)
	}
	want := []CallStatus{
		{Turn: 1, Index: 0, Name: "look", Status: parsers.StatusOK, SpanStart: -1, SpanEnd: -1},
		{Turn: 1, Index: 1, Name: "look", Status: parsers.StatusRepaired, Reason: parsers.RepairArgsString, SpanStart: -1, SpanEnd: -1},
		{Turn: 1, Index: 2, Name: "look", Status: parsers.StatusMalformed, Reason: "arguments: arguments are a JSON array, not an object", SpanStart: -1, SpanEnd: -1},
		{Turn: 2, Index: 0, Name: "look", Status: parsers.StatusRepaired, Reason: parsers.RepairCloseMissing, SpanStart: -1, SpanEnd: -1},
	}
	if !reflect.DeepEqual(res.CallStatuses, want) {
		t.Fatalf("tokens mode:\n got %+v\nwant %+v", res.CallStatuses, want)
	}

	chat := []step{chatTurn("tool_calls", "", [2]string{"look", `{"path":"a"}`}, [2]string{"", `{}`}), final("done")}
	res, err, _, _ = run(t, context.Background(), Config{}, nil, chat...)
	if err != nil || res.StopReason != StopFinished {
		t.Fatalf("stop %s: %v", res.StopReason, err)
	}
	want = []CallStatus{
		{Turn: 1, Index: 0, Name: "look", Status: parsers.StatusOK, SpanStart: -1, SpanEnd: -1},
		{Turn: 1, Index: 1, Status: parsers.StatusMalformed, Reason: "the call has no tool name", SpanStart: -1, SpanEnd: -1},
	}
	if !reflect.DeepEqual(res.CallStatuses, want) {
		t.Fatalf("chat mode:\n got %+v\nwant %+v", res.CallStatuses, want)
	}
}
