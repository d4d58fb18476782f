package agentloop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/tools"
)

// sent records the histories the policy received, to check that every
// re-sent history is one a chat template accepts.
type sent struct {
	mu    sync.Mutex
	hists [][]openai.ChatCompletionMessage
}

func (s *sent) wrap(st step) step {
	return func(ctx context.Context, msgs []openai.ChatCompletionMessage) (inference.Turn, error) {
		s.mu.Lock()
		s.hists = append(s.hists, append([]openai.ChatCompletionMessage(nil), msgs...))
		s.mu.Unlock()
		return st(ctx, msgs)
	}
}

// checkArgsValid fails when a tool call's arguments in any re-sent
// history are not a JSON object.
func (s *sent) checkArgsValid(t *testing.T) {
	t.Helper()
	for i, h := range s.hists {
		for _, m := range h {
			for _, tc := range m.ToolCalls {
				var v map[string]any
				if err := json.Unmarshal([]byte(tc.Function.Arguments), &v); err != nil {
					t.Errorf("history %d: call %s has arguments %q: %v", i, tc.ID, tc.Function.Arguments, err)
				}
			}
		}
	}
}

// chatTurn is a server-parsed generation.
func chatTurn(finish, content string, cs ...[2]string) step {
	return func(context.Context, []openai.ChatCompletionMessage) (inference.Turn, error) {
		t := inference.Turn{Parsed: true, Content: content, FinishReason: finish}
		for i, c := range cs {
			t.ToolCalls = append(t.ToolCalls, openai.ToolCall{ID: fmt.Sprintf("c%d", i), Type: "function", Function: openai.FunctionCall{Name: c[0], Arguments: c[1]}})
		}
		return t, nil
	}
}

// rawTurn is an unparsed (tokens-mode) generation.
func rawTurn(finish, text string) step {
	return func(context.Context, []openai.ChatCompletionMessage) (inference.Turn, error) {
		return inference.Turn{Text: text, FinishReason: finish, CompletionIDs: []int32{1}, Logprobs: []float32{-1}}, nil
	}
}

func eventKinds(res Result) string {
	var ks []string
	for _, e := range res.Events {
		k := e.Kind
		if e.Detail != "" {
			k += ":" + e.Detail
		}
		ks = append(ks, k)
	}
	return strings.Join(ks, ",")
}

func roles(res Result) string {
	var rs []string
	for _, m := range res.Messages {
		rs = append(rs, m.Role)
	}
	return strings.Join(rs, ",")
}

func toolErrorKinds(res Result) string {
	var ks []string
	for _, te := range res.ToolErrors {
		ks = append(ks, te.Kind)
	}
	return strings.Join(ks, ",")
}

// TestMisbehaviour: each kind of model misbehaviour has its defined
// outcome (docs/agentloop.md, "Model misbehaviour"): never an error of the
// rollout, and never a history a chat template would refuse.
func TestMisbehaviour(t *testing.T) {
	const cutArgs = `{"path": "a", "n": 12`
	for _, tc := range []struct {
		name  string
		cfg   Config
		steps []step
		check func(t *testing.T, res Result)
	}{
		{
			name:  "unparsable arguments",
			steps: []step{chatTurn("tool_calls", "", [2]string{"look", `{"path": "a",}`}), final("ok")},
			check: func(t *testing.T, res Result) {
				if res.StopReason != StopFinished || toolErrorKinds(res) != tools.InvalidJSON {
					t.Fatalf("stop %s tool errors %s", res.StopReason, toolErrorKinds(res))
				}
				if a := res.Messages[1].ToolCalls[0].Function.Arguments; a != "{}" {
					t.Fatalf("history arguments %q, want {}", a)
				}
				e := res.Events[0]
				if e.Kind != EventArgumentsReplaced || e.Original != `{"path": "a",}` || e.Message != 1 || e.CallID != "c0" || res.Counters.ReplacedArguments != 1 {
					t.Fatalf("event %+v counters %+v", e, res.Counters)
				}
				if !strings.Contains(res.Messages[2].Content, "Invalid JSON in tool arguments") {
					t.Fatalf("the model is not told: %s", res.Messages[2].Content)
				}
			},
		},
		{
			name:  "empty and non-object arguments",
			steps: []step{chatTurn("tool_calls", "", [2]string{"look", ``}, [2]string{"look", `[1]`}), final("ok")},
			check: func(t *testing.T, res Result) {
				// Empty arguments mean {} to the tools (then a schema error:
				// path is required); [1] is not an object.
				if toolErrorKinds(res) != "schema,not_object" || res.Counters.ReplacedArguments != 2 {
					t.Fatalf("tool errors %s counters %+v", toolErrorKinds(res), res.Counters)
				}
			},
		},
		{
			name:  "call without a name",
			steps: []step{chatTurn("tool_calls", "", [2]string{"", `{"path":"a"}`}, [2]string{"look", `{"path":"b"}`}), final("ok")},
			check: func(t *testing.T, res Result) {
				a := res.Messages[1]
				if len(a.ToolCalls) != 1 || a.ToolCalls[0].Function.Name != "look" || toolErrorKinds(res) != tools.InvalidParse {
					t.Fatalf("assistant %+v tool errors %s", a, toolErrorKinds(res))
				}
				if !strings.Contains(res.Messages[2].Content, "no tool name") || res.Messages[3].Content != `{"content":"b"}` {
					t.Fatalf("results %+v", res.Messages[2:4])
				}
			},
		},
		{
			name:  "unknown tool",
			steps: []step{chatTurn("tool_calls", "", [2]string{"Look", `{"path":"a"}`}), final("ok")},
			check: func(t *testing.T, res Result) {
				if toolErrorKinds(res) != tools.InvalidUnknownTool || res.Messages[1].ToolCalls[0].Function.Name != "Look" || len(res.Events) != 0 {
					t.Fatalf("tool errors %s events %s", toolErrorKinds(res), eventKinds(res))
				}
			},
		},
		{
			name:  "near-miss tool name repaired",
			cfg:   Config{RepairToolNames: true},
			steps: []step{chatTurn("tool_calls", "", [2]string{"Look", `{"path":"a"}`}, [2]string{"nope", `{}`}), final("ok")},
			check: func(t *testing.T, res Result) {
				if res.Messages[2].Content != `{"content":"a"}` || toolErrorKinds(res) != tools.InvalidUnknownTool {
					t.Fatalf("repaired call not executed: %s (tool errors %s)", res.Messages[2].Content, toolErrorKinds(res))
				}
				if n := res.Messages[1].ToolCalls[0].Function.Name; n != "look" {
					t.Fatalf("history name %q", n)
				}
				e := res.Events[0]
				if len(res.Events) != 1 || e.Kind != EventToolNameRepaired || e.Original != "Look" || e.Detail != "look" || e.CallID != "c0" || res.Counters.RepairedNames != 1 {
					t.Fatalf("events %+v counters %+v", res.Events, res.Counters)
				}
			},
		},
		{
			name:  "wrong argument types",
			steps: []step{chatTurn("tool_calls", "", [2]string{"look", `{"path": ["a"]}`}), final("ok")},
			check: func(t *testing.T, res Result) {
				if toolErrorKinds(res) != tools.InvalidSchema || res.StopReason != StopFinished {
					t.Fatalf("tool errors %s stop %s", toolErrorKinds(res), res.StopReason)
				}
			},
		},
		{
			name:  "too many calls in one turn",
			cfg:   Config{MaxCallsPerTurn: 2},
			steps: []step{chatTurn("tool_calls", "", [2]string{"look", `{"path":"a"}`}, [2]string{"look", `{"path":"b"}`}, [2]string{"look", `{"path":"c"}`}), final("ok")},
			check: func(t *testing.T, res Result) {
				if toolErrorKinds(res) != InvalidTooManyCalls || !strings.Contains(res.Messages[4].Content, "Too many tool calls") || res.Messages[3].Content != `{"content":"b"}` {
					t.Fatalf("tool errors %s messages %+v", toolErrorKinds(res), res.Messages[2:5])
				}
			},
		},
		{
			name:  "no call limit by default",
			steps: []step{chatTurn("tool_calls", "", [2]string{"look", `{"path":"a"}`}, [2]string{"look", `{"path":"b"}`}, [2]string{"look", `{"path":"c"}`}), final("ok")},
			check: func(t *testing.T, res Result) {
				if len(res.ToolErrors) != 0 || res.Counters.ToolCalls != 3 {
					t.Fatalf("tool errors %s", toolErrorKinds(res))
				}
			},
		},
		{
			name:  "empty reply finishes by default",
			steps: []step{final(""), final("never")},
			check: func(t *testing.T, res Result) {
				if res.StopReason != StopFinished || !res.FinishedNaturally || res.TurnsUsed != 1 || len(res.Events) != 0 {
					t.Fatalf("stop %s turns %d events %s", res.StopReason, res.TurnsUsed, eventKinds(res))
				}
			},
		},
		{
			name:  "empty reply nudged",
			cfg:   Config{EmptyReplyNudges: 1},
			steps: []step{final("  \n"), final(""), final("never")},
			check: func(t *testing.T, res Result) {
				// One nudge, then the second empty reply finishes.
				if res.StopReason != StopFinished || res.TurnsUsed != 2 || roles(res) != "user,assistant,user,assistant" {
					t.Fatalf("stop %s turns %d roles %s", res.StopReason, res.TurnsUsed, roles(res))
				}
				if res.Messages[2].Content != EmptyReplyNudgeText || eventKinds(res) != "message_inserted:empty_reply_nudge" || res.Events[0].Message != 2 || res.Counters.InsertedMessages != 1 {
					t.Fatalf("nudge %q events %+v", res.Messages[2].Content, res.Events)
				}
			},
		},
		{
			name:  "reply cut at length without a call",
			cfg:   Config{OnTruncation: TruncationToolError},
			steps: []step{chatTurn("length", "The answer is"), final("never")},
			check: func(t *testing.T, res Result) {
				if res.StopReason != StopLength || res.FinishedNaturally || res.TurnsUsed != 1 {
					t.Fatalf("stop %s natural %v turns %d", res.StopReason, res.FinishedNaturally, res.TurnsUsed)
				}
			},
		},
		{
			name: "call cut at length stops (default)",
			steps: []step{chatTurn("length", "", [2]string{"put", `{"path":"x"}`}, [2]string{"look", cutArgs}),
				final("never")},
			check: func(t *testing.T, res Result) {
				if res.StopReason != StopLength || res.FinishedNaturally || res.TurnsUsed != 1 || roles(res) != "user,assistant" {
					t.Fatalf("stop %s turns %d roles %s", res.StopReason, res.TurnsUsed, roles(res))
				}
				if res.Counters.ToolCalls != 0 || len(res.ToolErrors) != 0 {
					t.Fatalf("a call of the cut turn ran: %+v", res.Counters)
				}
				if eventKinds(res) != "arguments_replaced:{},call_not_executed:length,call_not_executed:length" || res.Events[0].Original != cutArgs {
					t.Fatalf("events %+v", res.Events)
				}
			},
		},
		{
			name: "call cut at length as a tool error",
			cfg:  Config{OnTruncation: TruncationToolError},
			steps: []step{chatTurn("length", "", [2]string{"put", `{"path":"x"}`}, [2]string{"look", cutArgs}),
				final("ok")},
			check: func(t *testing.T, res Result) {
				if res.StopReason != StopFinished || res.TurnsUsed != 2 || toolErrorKinds(res) != InvalidTruncated {
					t.Fatalf("stop %s turns %d tool errors %s", res.StopReason, res.TurnsUsed, toolErrorKinds(res))
				}
				if res.Messages[2].Content != `{"ok":true}` || !strings.Contains(res.Messages[3].Content, "max_tokens limit") {
					t.Fatalf("results %+v", res.Messages[2:4])
				}
			},
		},
		{
			name:  "tokens mode: call cut at length stops",
			cfg:   Config{Parser: "hermes"},
			steps: []step{rawTurn("length", "I will look.\n<tool_call>\n{\"name\": \"look\", \"arguments\": {\"path\": \"a"), final("never")},
			check: func(t *testing.T, res Result) {
				if res.StopReason != StopLength || roles(res) != "user,assistant" || len(res.Messages[1].ToolCalls) != 0 {
					t.Fatalf("stop %s roles %s", res.StopReason, roles(res))
				}
				if eventKinds(res) != "call_unparsed:call JSON is truncated (output ended inside the JSON),call_not_executed:length" ||
					!strings.Contains(res.Events[0].Original, `"path": "a`) {
					t.Fatalf("events %+v", res.Events)
				}
			},
		},
		{
			name:  "tokens mode: call cut at length as a tool error",
			cfg:   Config{Parser: "hermes", OnTruncation: TruncationToolError},
			steps: []step{rawTurn("length", "<tool_call>\n{\"name\": \"look\", \"arguments\": {\"path\": \"a"), final("ok")},
			check: func(t *testing.T, res Result) {
				if res.StopReason != StopFinished || toolErrorKinds(res) != InvalidTruncated || roles(res) != "user,assistant,tool,assistant" {
					t.Fatalf("stop %s tool errors %s roles %s", res.StopReason, toolErrorKinds(res), roles(res))
				}
			},
		},
		{
			name:  "malformed call without length is a parse error",
			cfg:   Config{Parser: "hermes"},
			steps: []step{rawTurn("stop", "<tool_call>\n{\"name\": \"look\", \"arguments\": {\"path\": \"a"), final("ok")},
			check: func(t *testing.T, res Result) {
				if res.StopReason != StopFinished || toolErrorKinds(res) != tools.InvalidParse {
					t.Fatalf("stop %s tool errors %s", res.StopReason, toolErrorKinds(res))
				}
				// The turn's only call was unreadable: the assistant
				// message keeps the model's text of it rather than being
				// empty (templates refuse an assistant message with neither
				// content nor calls).
				if a := res.Messages[1]; a.Role != openai.ChatMessageRoleAssistant || !strings.Contains(a.Content, `"arguments": {"path": "a`) {
					t.Fatalf("assistant message %+v, want the unparsed call's text as content", a)
				}
			},
		},
		{
			name:  "complete calls at length stop too",
			steps: []step{chatTurn("length", "", [2]string{"look", `{"path":"a"}`}), final("never")},
			check: func(t *testing.T, res Result) {
				if res.StopReason != StopLength || res.Counters.ToolCalls != 0 {
					t.Fatalf("stop %s counters %+v", res.StopReason, res.Counters)
				}
			},
		},
		{
			name:  "grace turn answered",
			cfg:   Config{MaxTurns: 2, GraceTurn: true},
			steps: []step{calls([2]string{"look", `{"path":"a"}`}), calls([2]string{"look", `{"path":"b"}`}), final("my answer")},
			check: func(t *testing.T, res Result) {
				if res.StopReason != StopMaxTurns || !res.FinishedNaturally || res.TurnsUsed != 3 || roles(res) != "user,assistant,tool,assistant,tool,user,assistant" {
					t.Fatalf("stop %s natural %v turns %d roles %s", res.StopReason, res.FinishedNaturally, res.TurnsUsed, roles(res))
				}
				if res.Messages[5].Content != GraceTurnText || eventKinds(res) != "message_inserted:grace_turn" {
					t.Fatalf("grace %q events %s", res.Messages[5].Content, eventKinds(res))
				}
			},
		},
		{
			name:  "grace turn calls are not executed",
			cfg:   Config{MaxTurns: 1, GraceTurn: true},
			steps: []step{calls([2]string{"look", `{"path":"a"}`}), calls([2]string{"put", `{"path":"b"}`})},
			check: func(t *testing.T, res Result) {
				if res.StopReason != StopMaxTurns || res.FinishedNaturally || res.Counters.ToolCalls != 1 || roles(res) != "user,assistant,tool,user,assistant" {
					t.Fatalf("stop %s natural %v counters %+v roles %s", res.StopReason, res.FinishedNaturally, res.Counters, roles(res))
				}
				if eventKinds(res) != "message_inserted:grace_turn,call_not_executed:grace_turn" {
					t.Fatalf("events %s", eventKinds(res))
				}
			},
		},
		{
			name:  "no grace turn by default",
			cfg:   Config{MaxTurns: 1},
			steps: []step{calls([2]string{"look", `{"path":"a"}`}), final("never")},
			check: func(t *testing.T, res Result) {
				if res.StopReason != StopMaxTurns || res.TurnsUsed != 1 || roles(res) != "user,assistant,tool" {
					t.Fatalf("stop %s turns %d roles %s", res.StopReason, res.TurnsUsed, roles(res))
				}
			},
		},
		{
			name:  "budget warnings recorded",
			cfg:   Config{MaxTurns: 2, BudgetWarnings: true},
			steps: []step{calls([2]string{"look", `{"path":"a"}`}), calls([2]string{"look", `{"path":"b"}`})},
			check: func(t *testing.T, res Result) {
				// 1 of 2 is 50 %: no warning; 2 of 2 crosses both marks: one (90 %).
				if len(res.Events) != 1 || res.Events[0].Kind != EventBudgetWarning || res.Events[0].Message != 4 || !strings.Contains(res.Events[0].Detail, "2 of 2") {
					t.Fatalf("events %+v", res.Events)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s sent
			steps := make([]step, len(tc.steps))
			for i, st := range tc.steps {
				steps[i] = s.wrap(st)
			}
			res, err, p, _ := run(t, context.Background(), tc.cfg, nil, steps...)
			if err != nil || res.StopReason.Failed() {
				t.Fatalf("model misbehaviour failed the rollout: %s: %v", res.StopReason, err)
			}
			if !p.finished {
				t.Fatal("Finish not called")
			}
			s.checkArgsValid(t)
			// The record too: the final history is valid for a template.
			s.hists = append(s.hists, res.Messages)
			s.checkArgsValid(t)
			tc.check(t, res)
		})
	}
}

func TestLoopConfigErrors(t *testing.T) {
	for _, cfg := range []Config{{OnTruncation: "ignore"}, {EmptyReplyNudges: -1}, {MaxCallsPerTurn: -2}} {
		cfg.Messages = []openai.ChatCompletionMessage{{Role: "user", Content: "x"}}
		res, err := Run(context.Background(), cfg, Deps{Policy: &scriptPolicy{}})
		if !errors.Is(err, ErrConfig) || res.StopReason != StopConfigErr {
			t.Errorf("%+v: err %v stop %s", cfg, err, res.StopReason)
		}
	}
}
