package anthropic

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	openai "github.com/sashabaranov/go-openai"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/internal/testkit/gatewaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func client(base string) sdk.Client {
	return sdk.NewClient(option.WithBaseURL(base), option.WithAPIKey("sk-none"), option.WithMaxRetries(0))
}

func reply() gateway.Reply {
	return gateway.Reply{
		ID: "R7", Model: "qwen3-tools",
		Reasoning: "The user wants the files. I will run ls and then pwd, in parallel; " + strings.Repeat("é", 70),
		Content:   "Running two commands — ✓",
		ToolCalls: []openai.ToolCall{
			{ID: "call_x1", Type: openai.ToolTypeFunction, Function: openai.FunctionCall{Name: "bash", Arguments: `{"command":"ls -la /work/some/long/path/that/makes/the/input/longer/than/one/delta"}`}},
			{ID: "call_x2", Type: openai.ToolTypeFunction, Function: openai.FunctionCall{Name: "bash", Arguments: `{"command":"pwd"}`}},
		},
		FinishReason: gateway.FinishToolCalls, PromptTokens: 120, CompletionTokens: 45,
	}
}

// TestDecodeGolden: every block kind of a Claude-Code-style request maps
// to the canonical call recorded in testdata/claude.golden.json.
func TestDecodeGolden(t *testing.T) {
	body, err := os.ReadFile("testdata/claude.json")
	if err != nil {
		t.Fatal(err)
	}
	call, err := decode(body)
	if err != nil {
		t.Fatal(err)
	}
	gatewaytest.Golden(t, "claude.golden.json", gatewaytest.GoldenView(call))

	m := call.Messages
	roles := make([]string, len(m))
	for i := range m {
		roles[i] = m[i].Role
	}
	if got := strings.Join(roles, " "); got != "system user assistant tool tool user assistant tool assistant user" {
		t.Fatalf("roles %s", got)
	}
	if m[0].Content != "You are a terminal agent.\nBe brief." {
		t.Errorf("system %q", m[0].Content)
	}
	a := m[2]
	if a.Ref != "R1" || a.ReasoningContent != "I will list and print the directory." || a.Content != "Looking." ||
		len(a.ToolCalls) != 2 || a.ToolCalls[0].Function.Arguments != `{"command":"ls","timeout":10}` {
		t.Errorf("assistant turn %+v", a)
	}
	if m[3].ToolCallID != "call_a" || m[4].Content != "/work" || m[5].Content != "and now?" {
		t.Errorf("tool results then user text: %+v %+v %+v", m[3], m[4], m[5])
	}
	if m[6].Ref != "" || m[6].ReasoningContent != "foreign" || m[6].ToolCalls[0].Function.Arguments != "{}" {
		t.Errorf("foreign assistant turn %+v", m[6])
	}
	if call.MaxTokens != 4096 || call.ToolChoice.Mode != "auto" || call.ParallelToolCalls == nil || !*call.ParallelToolCalls || !call.Stream {
		t.Errorf("call %+v", call)
	}
	if call.Requested["top_k"] != 40.0 || call.Requested["thinking"] == nil {
		t.Errorf("requested %v", call.Requested)
	}
}

func TestToolChoice(t *testing.T) {
	cases := map[string]gateway.ToolChoice{
		`{"type":"any"}`:                                   {Mode: "required"},
		`{"type":"none"}`:                                  {Mode: "none"},
		`{"type":"tool","name":"bash"}`:                    {Mode: "function", Name: "bash"},
		`{"type":"auto","disable_parallel_tool_use":true}`: {Mode: "auto"},
	}
	for in, want := range cases {
		tc, par, err := decodeToolChoice(json.RawMessage(in))
		if err != nil || *tc != want {
			t.Errorf("%s → %+v %v", in, tc, err)
		}
		if strings.Contains(in, "disable") && (par == nil || *par) {
			t.Errorf("%s: parallel %v", in, par)
		}
	}
}

// TestNonStreamingSDK: the official Go SDK parses the message; sent back,
// its blocks decode to a message whose Ref is the reply's id.
func TestNonStreamingSDK(t *testing.T) {
	c := &gatewaytest.Scripted{Reply: reply()}
	cl := client(gatewaytest.Serve(t, New(), c))
	msg, err := cl.Messages.New(context.Background(), sdk.MessageNewParams{
		Model: "qwen3-tools", MaxTokens: 1000,
		Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock("list files"))},
	})
	if err != nil {
		t.Fatal(err)
	}
	if msg.ID != "msg_R7" || msg.StopReason != "tool_use" || msg.Usage.InputTokens != 120 || msg.Usage.OutputTokens != 45 || len(msg.Content) != 4 {
		t.Fatalf("message %+v", msg)
	}
	r := reply()
	if th := msg.Content[0].AsThinking(); th.Thinking != r.Reasoning || th.Signature == "" {
		t.Errorf("thinking %+v", th)
	}
	if tx := msg.Content[1].AsText(); tx.Text != r.Content {
		t.Errorf("text %+v", tx)
	}
	if tu := msg.Content[3].AsToolUse(); tu.ID != "call_x2" || tu.Name != "bash" || string(tu.Input) != `{"command":"pwd"}` {
		t.Errorf("tool_use %+v", tu)
	}
	if call := c.Last(t); call.MaxTokens != 1000 || call.Stream || c.Sessions()[0] != "sess-1" {
		t.Errorf("call %+v", call)
	}

	// Round trip through the SDK's own param conversion.
	_, err = cl.Messages.New(context.Background(), sdk.MessageNewParams{
		Model: "qwen3-tools", MaxTokens: 1000,
		Messages: []sdk.MessageParam{
			sdk.NewUserMessage(sdk.NewTextBlock("list files")),
			msg.ToParam(),
			sdk.NewUserMessage(sdk.NewToolResultBlock("call_x1", "a", false), sdk.NewToolResultBlock("call_x2", "/", true)),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := c.Last(t).Messages
	if len(got) != 4 {
		t.Fatalf("%d messages, want user, assistant, 2 tool", len(got))
	}
	a := got[1]
	if a.Ref != r.ID || a.ReasoningContent != r.Reasoning || a.Content != r.Content || len(a.ToolCalls) != 2 ||
		a.ToolCalls[0].ID != "call_x1" || a.ToolCalls[0].Function.Arguments != r.ToolCalls[0].Function.Arguments {
		t.Errorf("echoed assistant turn %+v", a)
	}
}

// TestStopReasons and tool inputs that are not objects.
func TestStopReasons(t *testing.T) {
	cases := []struct {
		rep  gateway.Reply
		want string
	}{
		{gateway.Reply{ID: "a", Content: "x", FinishReason: gateway.FinishStop}, "end_turn"},
		{gateway.Reply{ID: "b", Content: "x", FinishReason: gateway.FinishLength}, "max_tokens"},
		{gateway.Reply{ID: "c", FinishReason: gateway.FinishToolCalls, ToolCalls: []openai.ToolCall{{ID: "t", Function: openai.FunctionCall{Name: "f", Arguments: "not json"}}}}, "tool_use"},
	}
	for _, tc := range cases {
		m := messageOf(tc.rep, "m")
		if *m.StopReason != tc.want {
			t.Errorf("%+v → %s, want %s", tc.rep, *m.StopReason, tc.want)
		}
	}
	m := messageOf(cases[2].rep, "m")
	if string(m.Content[0].Input) != `{"_raw_arguments":"not json"}` {
		t.Errorf("malformed arguments as input: %s", m.Content[0].Input)
	}
}

// readSSE reads a Messages event stream, which has no comments.
func readSSE(t *testing.T, r io.Reader) []gatewaytest.Event {
	t.Helper()
	events, comments := gatewaytest.ReadSSE(t, r)
	if len(comments) > 0 {
		t.Fatalf("comment lines %q in a Messages stream", comments)
	}
	return events
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	return gatewaytest.Post(t, url, body, "anthropic-version", "2023-06-01")
}

// TestStreamSequence: the event order, block indices and accumulated
// deltas of a streamed reply.
func TestStreamSequence(t *testing.T) {
	c := &gatewaytest.Scripted{Reply: reply()}
	base := gatewaytest.Serve(t, New(), c)
	resp := post(t, base+"/v1/messages", `{"model":"qwen3-tools","max_tokens":100,"messages":[{"role":"user","content":"hi"}],"stream":true}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events := readSSE(t, resp.Body)
	var names []string
	acc := map[int]*strings.Builder{}
	kinds := map[int]string{}
	for _, e := range events {
		if e.Data["type"] != e.Name {
			t.Errorf("event %s has type %v", e.Name, e.Data["type"])
		}
		i := gatewaytest.Num(e.Data["index"])
		switch e.Name {
		case "content_block_start":
			if acc[i] != nil || i != len(acc) {
				t.Errorf("block %d started out of order", i)
			}
			acc[i] = &strings.Builder{}
			kinds[i] = e.Data["content_block"].(map[string]any)["type"].(string)
		case "content_block_delta":
			d := e.Data["delta"].(map[string]any)
			for _, k := range []string{"text", "thinking", "partial_json"} {
				if s, ok := d[k].(string); ok {
					acc[i].WriteString(s)
				}
			}
			if d["type"] == "signature_delta" {
				names = append(names, "signature_delta")
			}
			continue
		}
		names = append(names, e.Name)
	}
	want := "message_start content_block_start signature_delta content_block_stop content_block_start content_block_stop content_block_start content_block_stop content_block_start content_block_stop message_delta message_stop"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("events\n%s\nwant\n%s", got, want)
	}
	r := reply()
	for i, w := range []string{r.Reasoning, r.Content, r.ToolCalls[0].Function.Arguments, r.ToolCalls[1].Function.Arguments} {
		if acc[i] == nil || acc[i].String() != w {
			t.Errorf("block %d (%s) accumulated %q, want %q", i, kinds[i], acc[i], w)
		}
	}
	md := events[len(events)-2].Data
	if md["delta"].(map[string]any)["stop_reason"] != "tool_use" || gatewaytest.Num(md["usage"].(map[string]any)["output_tokens"]) != 45 {
		t.Errorf("message_delta %v", md)
	}
}

// TestStreamSDK: the official SDK's stream and accumulator rebuild the
// same message as the non-streamed answer.
func TestStreamSDK(t *testing.T) {
	c := &gatewaytest.Scripted{Reply: reply()}
	cl := client(gatewaytest.Serve(t, New(), c))
	params := sdk.MessageNewParams{
		Model: "qwen3-tools", MaxTokens: 2048,
		Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock("hi"))},
		Thinking: sdk.ThinkingConfigParamOfEnabled(1024),
	}
	st := cl.Messages.NewStreaming(context.Background(), params)
	defer st.Close()
	var m sdk.Message
	for st.Next() {
		if err := m.Accumulate(st.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	whole, err := cl.Messages.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != whole.ID || m.StopReason != whole.StopReason || len(m.Content) != len(whole.Content) || m.Usage.OutputTokens != 45 || m.Usage.InputTokens != 120 {
		t.Fatalf("streamed %+v\nwhole %+v", m, whole)
	}
	for i := range m.Content {
		s, w := m.Content[i], whole.Content[i]
		if s.Type != w.Type || s.Text != w.Text || s.Thinking != w.Thinking || s.Signature != w.Signature || s.ID != w.ID || string(s.Input) != string(w.Input) {
			t.Errorf("block %d: streamed %+v, whole %+v", i, s, w)
		}
	}
	if c.Last(t).Requested["thinking"] == nil {
		t.Error("thinking not recorded")
	}
}

// TestErrors: each kind in Anthropic's error shape and status, streamed
// or not, as the SDK reads them.
func TestErrors(t *testing.T) {
	cases := []struct {
		err    error
		status int
		typ    string
		msg    string
	}{
		{gateway.Errorf(gateway.ErrBadRequest, "messages.2", "a tool result without its call"), 400, "invalid_request_error", "tool result without its call"},
		{gateway.Errorf(gateway.ErrUnknownModel, "", "no such model"), 404, "not_found_error", "model: nope"},
		{&gateway.Error{Kind: gateway.ErrContextLength, Tokens: 70000, Limit: 65536}, 400, "invalid_request_error", "prompt is too long: 70000 tokens > 65536 maximum"},
		{gateway.Errorf(gateway.ErrContextLength, "", "counts unknown"), 400, "invalid_request_error", "prompt is too long"},
		{gateway.Errorf(gateway.ErrSession, "", "closed"), 404, "not_found_error", "closed"},
		{gateway.Errorf(gateway.ErrOverloaded, "", "pool full"), 529, "overloaded_error", "Overloaded"},
		{errors.New("engine exploded"), 500, "api_error", "engine exploded"},
	}
	for _, tc := range cases {
		t.Run(tc.typ, func(t *testing.T) {
			c := &gatewaytest.Scripted{Err: tc.err}
			cl := client(gatewaytest.Serve(t, New(), c))
			params := sdk.MessageNewParams{Model: "nope", MaxTokens: 10, Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock("hi"))}}
			for _, stream := range []bool{false, true} {
				var err error
				if stream {
					st := cl.Messages.NewStreaming(context.Background(), params)
					for st.Next() {
					}
					err = st.Err()
					st.Close()
				} else {
					_, err = cl.Messages.New(context.Background(), params)
				}
				var apiErr *sdk.Error
				if !errors.As(err, &apiErr) {
					t.Fatalf("stream=%v: %v is not an API error", stream, err)
				}
				if apiErr.StatusCode != tc.status || string(apiErr.Type()) != tc.typ || !strings.Contains(apiErr.Message, tc.msg) {
					t.Errorf("stream=%v: %d %s %q; want %d %s %q", stream, apiErr.StatusCode, apiErr.Type(), apiErr.Message, tc.status, tc.typ, tc.msg)
				}
			}
		})
	}
}

// TestFailureAfterStreamStarted: a reply slower than KeepAlive commits the
// stream with ping events; a failure then is an error event the SDK
// raises as the API's error.
func TestFailureAfterStreamStarted(t *testing.T) {
	c := &gatewaytest.Scripted{Err: gateway.Errorf(gateway.ErrOverloaded, "", "pool full"), Release: make(chan struct{})}
	base := gatewaytest.Serve(t, &Door{KeepAlive: time.Millisecond}, c)
	resp := post(t, base+"/v1/messages", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"stream":true}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != "event: ping\n" {
		t.Fatalf("first line %q", line)
	}
	close(c.Release)
	var rest []gatewaytest.Event
	for _, e := range readSSE(t, br) {
		if e.Data["type"] != "ping" { // by its data: the first ping's event line was read above
			rest = append(rest, e)
		}
	}
	if len(rest) != 1 || rest[0].Name != "error" {
		t.Fatalf("events %+v", rest)
	}
	e := rest[0].Data["error"].(map[string]any)
	if e["type"] != "overloaded_error" {
		t.Errorf("error %v", e)
	}

	// The same through the SDK: its stream reports the API error.
	c2 := &gatewaytest.Scripted{Err: gateway.Errorf(gateway.ErrOverloaded, "", "pool full"), Release: make(chan struct{})}
	cl := client(gatewaytest.Serve(t, &Door{KeepAlive: time.Millisecond}, c2))
	st := cl.Messages.NewStreaming(context.Background(), sdk.MessageNewParams{Model: "m", MaxTokens: 10, Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock("hi"))}})
	close(c2.Release)
	for st.Next() {
	}
	var apiErr *sdk.Error
	if !errors.As(st.Err(), &apiErr) || apiErr.Type() != "overloaded_error" {
		t.Errorf("SDK stream error %v", st.Err())
	}
	st.Close()
}

// TestMalformed: bad requests get a 400 invalid_request_error and never
// reach the Completer.
func TestMalformed(t *testing.T) {
	cases := []struct{ body, want string }{
		{`nope`, "not a valid Messages request"},
		{`{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, "model"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{`{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{`{"model":"m","max_tokens":1,"messages":[]}`, "messages"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"x"}]}`, "top-level system"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user"}]}`, "messages.0.content"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":7}]}`, "messages.0.content"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, "image"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"b","input":{}}]}]}`, "assistant message"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result"}]}]}`, "tool_use_id"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"b","input":[1]}]},{"role":"user","content":"y"}]}`, "input must be an object"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"prefill"}]}`, "prefill"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"system":[{"type":"image"}]}`, "system.0.type"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"bash_20250124","name":"bash"}]}`, "tools.0.type"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f"}]}`, "input_schema"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"sometimes"}}`, "tool_choice"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"tool"}}`, "tool_choice.name"},
		{`{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","budget_tokens":2000}}`, "budget_tokens"},
		{`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"maybe"}}`, "thinking.type"},
	}
	c := &gatewaytest.Scripted{Reply: reply()}
	base := gatewaytest.Serve(t, New(), c)
	for _, tc := range cases {
		resp := post(t, base+"/v1/messages", tc.body)
		var e errorBody
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if resp.StatusCode != 400 || e.Type != "error" || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("%s: %d %+v, want 400 mentioning %q", tc.body, resp.StatusCode, e, tc.want)
		}
	}
	if len(c.Calls()) != 0 {
		t.Errorf("the Completer saw %d malformed calls", len(c.Calls()))
	}
}

func TestSignature(t *testing.T) {
	for _, id := range []string{"R1", "a_b", "ü/+="} {
		if got, ok := openSignature(signature(id)); !ok || got != id {
			t.Errorf("%q → %q %v", id, got, ok)
		}
	}
	for _, s := range []string{"", "EqQBCkgIARAB", "rollout.", "rollout.!!"} {
		if _, ok := openSignature(s); ok {
			t.Errorf("%q opened", s)
		}
	}
}

func FuzzDecode(f *testing.F) {
	if b, err := os.ReadFile("testdata/claude.json"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"thinking","signature":"rollout.UjE"}]},{"role":"user","content":[]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		call, err := decode(body)
		if err != nil {
			if !errors.Is(err, gateway.ErrBadRequest) {
				t.Fatalf("error of the wrong kind: %v", err)
			}
			return
		}
		if call.Model == "" || call.MaxTokens < 1 || len(call.Messages) == 0 {
			t.Fatalf("accepted an incomplete call: %+v", call)
		}
		for _, m := range call.Messages {
			if m.Role == "" {
				t.Fatal("a message without a role")
			}
		}
	})
}
