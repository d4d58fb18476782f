package responses

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	sdk "github.com/openai/openai-go/v3/responses"
	openai "github.com/sashabaranov/go-openai"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/internal/testkit/gatewaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func serve(t *testing.T, d *Door, c gateway.Completer) string {
	return gatewaytest.Serve(t, d, c) + "/v1/"
}

func client(base string) oai.Client {
	return oai.NewClient(option.WithBaseURL(base), option.WithAPIKey("sk-none"), option.WithMaxRetries(0))
}

func reply() gateway.Reply {
	return gateway.Reply{
		ID: "R7", Model: "qwen3-tools",
		Reasoning: "The user wants the files. I will run ls and then pwd, in parallel; " + strings.Repeat("é", 70),
		Content:   "Running two commands — ✓",
		ToolCalls: []openai.ToolCall{
			{ID: "call_x1", Type: openai.ToolTypeFunction, Function: openai.FunctionCall{Name: "shell", Arguments: `{"command":["ls","-la","/work/some/long/path/that/makes/the/arguments/longer/than/one/delta"]}`}},
			{ID: "call_x2", Type: openai.ToolTypeFunction, Function: openai.FunctionCall{Name: "shell", Arguments: `{"command":["pwd"]}`}},
		},
		FinishReason: gateway.FinishToolCalls, PromptTokens: 120, CompletionTokens: 45,
	}
}

// TestDecodeGolden: every input item kind of a Codex-style request maps to
// the canonical call recorded in testdata/codex.golden.json.
func TestDecodeGolden(t *testing.T) {
	body, err := os.ReadFile("testdata/codex.json")
	if err != nil {
		t.Fatal(err)
	}
	call, _, err := decode(body)
	if err != nil {
		t.Fatal(err)
	}
	gatewaytest.Golden(t, "codex.golden.json", gatewaytest.GoldenView(call))

	// The points the golden file must hold, spelled out.
	if call.Previous != "R0" || call.MaxTokens != 512 || !call.Stream || call.ToolChoice.Mode != "auto" {
		t.Errorf("call fields: %+v", call)
	}
	m := call.Messages
	if len(m) != 9 {
		t.Fatalf("%d messages, want 9", len(m))
	}
	if m[0].Role != "system" || m[0].Content != "You are a coding agent." || m[1].Role != "system" {
		t.Errorf("instructions and developer message: %+v %+v", m[0], m[1])
	}
	a := m[3]
	if a.Role != "assistant" || a.Ref != "R1" || a.ReasoningContent != "I should run ls." || a.Content != "Listing." || len(a.ToolCalls) != 2 {
		t.Errorf("assistant turn: %+v", a)
	}
	if m[4].Role != "tool" || m[4].ToolCallID != "call_a" || m[5].Content != "/work" {
		t.Errorf("tool outputs: %+v %+v", m[4], m[5])
	}
	if m[6].Role != "assistant" || m[6].Ref != "" || m[6].ToolCalls[0].ID != "call_c" {
		t.Errorf("unanchored function call: %+v", m[6])
	}
	if call.Requested["temperature"] != 0.2 || call.Requested["store"] != false {
		t.Errorf("requested: %v", call.Requested)
	}
}

// TestAssistantGrouping: items of different replies never merge into one
// assistant message; a reasoning item after content starts a new one.
func TestAssistantGrouping(t *testing.T) {
	body := `{"model":"m","input":[
		{"type":"message","role":"assistant","id":"msg_A","content":"one"},
		{"type":"message","role":"assistant","id":"msg_B","content":"two"},
		{"type":"function_call","id":"fc_B_0","call_id":"c1","name":"f","arguments":"{}"},
		{"type":"function_call","id":"fc_C_0","call_id":"c2","name":"f","arguments":"{}"},
		{"type":"reasoning","id":"rs_C","summary":[{"type":"summary_text","text":"think"}]}
	]}`
	call, _, err := decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, m := range call.Messages {
		refs = append(refs, m.Ref)
	}
	if got := strings.Join(refs, ","); got != "A,B,C,C" {
		t.Errorf("refs %q, want A,B,C,C", got)
	}
	if call.Messages[3].ReasoningContent != "think" {
		t.Errorf("reasoning from summary: %+v", call.Messages[3])
	}
}

// TestInterleavedCallsRejoin: a harness that sends each call of one reply
// followed by its output (call, output, call, output) gets one assistant
// message with both calls, then both results, as the reply was sampled;
// calls of another reply, or without the gateway's item ids, stay apart.
func TestInterleavedCallsRejoin(t *testing.T) {
	body := `{"model":"m","input":[
		{"type":"message","role":"user","content":"go"},
		{"type":"function_call","id":"fc_R_0","call_id":"c1","name":"f","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"one"},
		{"type":"function_call","id":"fc_R_1","call_id":"c2","name":"f","arguments":"{}"},
		{"type":"function_call_output","call_id":"c2","output":"two"},
		{"type":"function_call","id":"fc_S_0","call_id":"c3","name":"f","arguments":"{}"},
		{"type":"function_call_output","call_id":"c3","output":"three"},
		{"type":"function_call","call_id":"c4","name":"f","arguments":"{}"},
		{"type":"function_call_output","call_id":"c4","output":"four"}
	]}`
	call, _, err := decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range call.Messages {
		s := m.Role + ":" + m.Ref
		for _, c := range m.ToolCalls {
			s += "+" + c.ID
		}
		if m.ToolCallID != "" {
			s += "=" + m.ToolCallID
		}
		got = append(got, s)
	}
	want := "user:,assistant:R+c1+c2,tool:=c1,tool:=c2,assistant:S+c3,tool:=c3,assistant:+c4,tool:=c4"
	if strings.Join(got, ",") != want {
		t.Errorf("messages\n got %s\nwant %s", strings.Join(got, ","), want)
	}
}

// TestNonStreamingSDK: the official Go SDK parses the response object;
// its items carry the reply, and sent back as input they decode to a
// message whose Ref is the reply's id.
func TestNonStreamingSDK(t *testing.T) {
	c := &gatewaytest.Scripted{Reply: reply()}
	base := serve(t, New(), c)
	cl := client(base)
	req := `{"model":"qwen3-tools","input":"list files","include":["reasoning.encrypted_content"],"store":false,"max_output_tokens":100}`
	resp, err := cl.Responses.New(context.Background(), sdk.ResponseNewParams{}, option.WithRequestBody("application/json", []byte(req)))
	if err != nil {
		t.Fatal(err)
	}
	if resp.ID != "resp_R7" || resp.Status != "completed" || resp.Usage.InputTokens != 120 || resp.Usage.OutputTokens != 45 || resp.Usage.TotalTokens != 165 {
		t.Errorf("response: id %s status %s usage %+v", resp.ID, resp.Status, resp.Usage)
	}
	if len(resp.Output) != 4 {
		t.Fatalf("%d output items, want 4 (reasoning, message, 2 calls)", len(resp.Output))
	}
	rs := resp.Output[0].AsReasoning()
	if rs.ID != "rs_R7" || len(rs.Content) != 1 || rs.Content[0].Text != reply().Reasoning || rs.EncryptedContent == "" {
		t.Errorf("reasoning item: %+v", rs)
	}
	if resp.OutputText() != reply().Content {
		t.Errorf("output text %q", resp.OutputText())
	}
	fc := resp.Output[3].AsFunctionCall()
	if fc.CallID != "call_x2" || fc.Name != "shell" || fc.Arguments != `{"command":["pwd"]}` || fc.ID != "fc_R7_1" {
		t.Errorf("function call item: %+v", fc)
	}
	if c.Sessions()[0] != "sess-1" || c.Last(t).MaxTokens != 100 || c.Last(t).Stream {
		t.Errorf("session %q call %+v", c.Sessions()[0], c.Last(t))
	}

	// Round trip: the harness sends the output back (reasoning text
	// dropped, as some harnesses do) followed by the tool outputs.
	var items []json.RawMessage
	for _, o := range resp.Output {
		raw := json.RawMessage(o.RawJSON())
		if o.Type == "reasoning" {
			var m map[string]any
			_ = json.Unmarshal(raw, &m)
			delete(m, "content")
			raw, _ = json.Marshal(m)
		}
		items = append(items, raw)
	}
	items = append(items,
		json.RawMessage(`{"type":"function_call_output","call_id":"call_x1","output":"a"}`),
		json.RawMessage(`{"type":"function_call_output","call_id":"call_x2","output":"/"}`))
	next, _ := json.Marshal(map[string]any{"model": "qwen3-tools", "input": items})
	if _, err := cl.Responses.New(context.Background(), sdk.ResponseNewParams{}, option.WithRequestBody("application/json", next)); err != nil {
		t.Fatal(err)
	}
	got := c.Last(t).Messages
	if len(got) != 3 {
		t.Fatalf("%d messages, want assistant + 2 tool", len(got))
	}
	want := reply()
	a := got[0]
	if a.Ref != want.ID || a.ReasoningContent != want.Reasoning || a.Content != want.Content || len(a.ToolCalls) != 2 ||
		a.ToolCalls[0].ID != "call_x1" || a.ToolCalls[0].Function.Arguments != want.ToolCalls[0].Function.Arguments {
		t.Errorf("echoed assistant turn: %+v", a)
	}
}

// TestStreamSequence: the event sequence is the API's, sequence numbers
// count from 0 without gaps, indices match, and the accumulated deltas
// equal the reply.
func TestStreamSequence(t *testing.T) {
	c := &gatewaytest.Scripted{Reply: reply()}
	base := serve(t, New(), c)
	resp := gatewaytest.Post(t, base+"responses", `{"model":"qwen3-tools","input":"hi","stream":true,"include":["reasoning.encrypted_content"]}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d type %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events, _ := gatewaytest.ReadSSE(t, resp.Body)
	var names []string
	text := map[int]*strings.Builder{}
	acc := func(i int) *strings.Builder {
		if text[i] == nil {
			text[i] = &strings.Builder{}
		}
		return text[i]
	}
	deltas := map[string]int{}
	for i, e := range events {
		if e.Data["type"] != e.Name {
			t.Errorf("event %d: name %s, type %v", i, e.Name, e.Data["type"])
		}
		if gatewaytest.Num(e.Data["sequence_number"]) != i {
			t.Errorf("event %d (%s): sequence_number %v", i, e.Name, e.Data["sequence_number"])
		}
		switch e.Name {
		case "response.output_text.delta", "response.reasoning_text.delta", "response.function_call_arguments.delta":
			acc(gatewaytest.Num(e.Data["output_index"])).WriteString(e.Data["delta"].(string))
			deltas[e.Name]++
			continue // sequences of deltas collapse in names
		}
		names = append(names, e.Name)
	}
	want := []string{
		"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.content_part.added", "response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.done", "response.output_item.done",
		"response.completed",
	}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	r := reply()
	for i, w := range []string{r.Reasoning, r.Content, r.ToolCalls[0].Function.Arguments, r.ToolCalls[1].Function.Arguments} {
		if text[i] == nil || text[i].String() != w {
			t.Errorf("output %d accumulated %q, want %q", i, text[i], w)
		}
	}
	if deltas["response.reasoning_text.delta"] < 2 || deltas["response.function_call_arguments.delta"] < 3 {
		t.Errorf("expected several deltas: %v", deltas)
	}
	last := events[len(events)-1].Data["response"].(map[string]any)
	if last["id"] != "resp_R7" || last["status"] != "completed" || len(last["output"].([]any)) != 4 {
		t.Errorf("completed response: %v", last)
	}
	// The done items are whole: the SDK's accumulator rebuilds the
	// response from them.
	var accum sdk.ResponseAccumulator
	for _, e := range events {
		var ev sdk.ResponsesServerEventUnion
		if err := json.Unmarshal([]byte(e.Raw), &ev); err != nil {
			t.Fatal(err)
		}
		if err := accum.AddEvent(ev); err != nil {
			t.Fatalf("SDK accumulator refused %s: %v", e.Name, err)
		}
	}
	snap := accum.Snapshot()
	if snap.TerminalEvent != "response.completed" || snap.ResponseID != "resp_R7" || snap.OutputText() != r.Content {
		t.Errorf("SDK snapshot: %+v", snap)
	}
}

// TestStreamSDK: the official SDK's streaming client reads the events,
// and an incomplete reply (max_output_tokens) ends with response.incomplete.
func TestStreamSDK(t *testing.T) {
	rep := gateway.Reply{ID: "R9", Content: "partial answer that was cut", FinishReason: gateway.FinishLength, PromptTokens: 5, CompletionTokens: 8}
	c := &gatewaytest.Scripted{Reply: rep}
	cl := client(serve(t, New(), c))
	st := cl.Responses.NewStreaming(context.Background(), sdk.ResponseNewParams{
		Model: "qwen3-tools", Input: sdk.ResponseNewParamsInputUnion{OfString: oai.String("hi")},
		MaxOutputTokens: oai.Int(8),
	})
	defer st.Close()
	var text strings.Builder
	var final sdk.Response
	var seq []int64
	for st.Next() {
		ev := st.Current()
		seq = append(seq, ev.SequenceNumber)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.incomplete", "response.completed":
			final = ev.Response
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != rep.Content || final.Status != "incomplete" || final.IncompleteDetails.Reason != "max_output_tokens" {
		t.Errorf("text %q status %s details %+v", text.String(), final.Status, final.IncompleteDetails)
	}
	if msg := final.Output[0].AsMessage(); msg.Status != "incomplete" {
		t.Errorf("message item status %s", msg.Status)
	}
	for i, s := range seq {
		if s != int64(i) {
			t.Fatalf("sequence numbers %v", seq)
		}
	}
	if call := c.Last(t); !call.Stream || call.MaxTokens != 8 || call.Messages[0].Content != "hi" {
		t.Errorf("call %+v", call)
	}
}

// TestErrors: each error kind in the API's shape and status, through the
// SDK's error type.
func TestErrors(t *testing.T) {
	cases := []struct {
		err    error
		status int
		typ    string
		code   string
		param  string
	}{
		{gateway.Errorf(gateway.ErrBadRequest, "input[2]", "a tool result without its call"), 400, "invalid_request_error", "", "input[2]"},
		{gateway.Errorf(gateway.ErrUnknownModel, "", "no model nope"), 404, "invalid_request_error", "model_not_found", "model"},
		{&gateway.Error{Kind: gateway.ErrContextLength, Msg: "70000 tokens > 65536", Tokens: 70000, Limit: 65536}, 400, "invalid_request_error", "context_length_exceeded", "input"},
		{gateway.Errorf(gateway.ErrSession, "", "session sess-1 closed"), 404, "invalid_request_error", "session_not_found", ""},
		{gateway.Errorf(gateway.ErrOverloaded, "", "pool full"), 503, "server_error", "server_is_overloaded", ""},
		{errors.New("engine exploded"), 500, "server_error", "server_error", ""},
	}
	for _, tc := range cases {
		t.Run(tc.typ+"/"+tc.code, func(t *testing.T) {
			c := &gatewaytest.Scripted{Err: tc.err}
			cl := client(serve(t, New(), c))
			for _, stream := range []bool{false, true} {
				var err error
				params := sdk.ResponseNewParams{Model: "nope", Input: sdk.ResponseNewParamsInputUnion{OfString: oai.String("hi")}}
				if stream {
					st := cl.Responses.NewStreaming(context.Background(), params)
					for st.Next() {
					}
					err = st.Err()
					st.Close()
				} else {
					_, err = cl.Responses.New(context.Background(), params)
				}
				var apiErr *oai.Error
				if !errors.As(err, &apiErr) {
					t.Fatalf("stream=%v: %v is not an API error", stream, err)
				}
				if apiErr.StatusCode != tc.status || apiErr.Type != tc.typ || apiErr.Code != tc.code || apiErr.Param != tc.param {
					t.Errorf("stream=%v: status %d type %q code %q param %q; want %d %q %q %q", stream, apiErr.StatusCode, apiErr.Type, apiErr.Code, apiErr.Param, tc.status, tc.typ, tc.code, tc.param)
				}
			}
		})
	}
}

// TestFailureAfterStreamStarted: a reply slower than KeepAlive commits the
// stream (keep-alive comments); a failure then is a response.failed event
// with the API's error code.
func TestFailureAfterStreamStarted(t *testing.T) {
	c := &gatewaytest.Scripted{Err: &gateway.Error{Kind: gateway.ErrContextLength, Msg: "too long"}, Release: make(chan struct{})}
	base := serve(t, &Door{KeepAlive: time.Millisecond}, c)
	resp := gatewaytest.Post(t, base+"responses", `{"model":"m","input":"hi","stream":true}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != ": keep-alive\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(c.Release)
	events, _ := gatewaytest.ReadSSE(t, br)
	if len(events) != 1 || events[0].Name != "response.failed" {
		t.Fatalf("events %+v", events)
	}
	r := events[0].Data["response"].(map[string]any)
	e := r["error"].(map[string]any)
	if r["status"] != "failed" || e["code"] != "context_length_exceeded" || !strings.Contains(e["message"].(string), "too long") {
		t.Errorf("failed response %v", r)
	}
}

// TestKeepAliveThenReply: a slow success after keep-alives is the whole
// normal sequence.
func TestKeepAliveThenReply(t *testing.T) {
	c := &gatewaytest.Scripted{Reply: reply(), Release: make(chan struct{})}
	base := serve(t, &Door{KeepAlive: time.Millisecond}, c)
	resp := gatewaytest.Post(t, base+"responses", `{"model":"m","input":"hi","stream":true}`)
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != ": keep-alive\n" {
		t.Fatalf("first line %q", line)
	}
	close(c.Release)
	events, _ := gatewaytest.ReadSSE(t, br)
	if events[0].Name != "response.created" || events[len(events)-1].Name != "response.completed" || gatewaytest.Num(events[0].Data["sequence_number"]) != 0 {
		t.Errorf("first %s last %s", events[0].Name, events[len(events)-1].Name)
	}
}

// TestMalformed: bad requests get a 400 naming the field, and never reach
// the Completer.
func TestMalformed(t *testing.T) {
	cases := []struct{ body, param string }{
		{`not json`, ""},
		{`{"input":"hi"}`, "model"},
		{`{"model":"m"}`, "input"},
		{`{"model":"m","input":42}`, "input"},
		{`{"model":"m","input":[{"type":"message","role":"tool","content":"x"}]}`, "input[0].role"},
		{`{"model":"m","input":[{"type":"message","role":"user"}]}`, "input[0].content"},
		{`{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, "input[0].content[0].type"},
		{`{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, "input[0].call_id"},
		{`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":{"a":1}}]}`, "input[0].arguments"},
		{`{"model":"m","input":[{"type":"function_call_output","call_id":"c"}]}`, "input[0].output"},
		{`{"model":"m","input":[{"type":"reasoning","id":"rs_x","summary":[{"type":"bogus","text":"x"}]}]}`, "input[0].summary[0].type"},
		{`{"model":"m","input":[{"type":"item_reference","id":"msg_1"}]}`, "input[0]"},
		{`{"model":"m","input":[{"type":"local_shell_call"}]}`, "input[0].type"},
		{`{"model":"m","input":[{"content":"no type"}]}`, "input[0].type"},
		{`{"model":"m","input":"hi","tools":[{"type":"web_search"}]}`, "tools[0].type"},
		{`{"model":"m","input":"hi","tools":[{"type":"function","function":{"name":"f"}}]}`, "tools[0].name"},
		{`{"model":"m","input":"hi","tool_choice":"sometimes"}`, "tool_choice"},
		{`{"model":"m","input":"hi","tool_choice":{"type":"function"}}`, "tool_choice.name"},
		{`{"model":"m","input":"hi","max_output_tokens":0}`, "max_output_tokens"},
		{`{"model":"m","input":"hi","background":true}`, "background"},
		{`{"model":"m","input":"hi","text":{"format":{"type":"json_schema"}}}`, "text.format.type"},
		{`{"model":"m","input":"hi","instructions":["x"]}`, "instructions"},
	}
	c := &gatewaytest.Scripted{Reply: reply()}
	base := serve(t, New(), c)
	for _, tc := range cases {
		resp := gatewaytest.Post(t, base+"responses", tc.body)
		var e struct {
			Error apiError `json:"error"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if resp.StatusCode != 400 || e.Error.Type != "invalid_request_error" || param != tc.param || e.Error.Message == "" {
			t.Errorf("%s: status %d error %+v param %q, want 400 param %q", tc.body, resp.StatusCode, e.Error, param, tc.param)
		}
	}
	if len(c.Calls()) != 0 {
		t.Errorf("the Completer saw %d malformed calls", len(c.Calls()))
	}
}

func TestIDs(t *testing.T) {
	for _, id := range []string{"R1", "a_b_c", "x-1"} {
		if got := refFromCallItemID(fcPrefix + id + "_12"); got != id {
			t.Errorf("fc id of %q → %q", id, got)
		}
		if r, text, ok := openSeal(seal(id, "why")); !ok || r != id || text != "why" {
			t.Errorf("seal of %q → %q %q %v", id, r, text, ok)
		}
	}
	for _, bad := range []string{"fc_", "fc_x", "fc__1", "fc_x_y", "call_1"} {
		if got := refFromCallItemID(bad); got != "" {
			t.Errorf("%q → %q, want none", bad, got)
		}
	}
	for _, bad := range []string{"", "gAAAAB", "rollout.!!", "rollout.e30"} {
		if _, _, ok := openSeal(bad); ok {
			t.Errorf("%q opened", bad)
		}
	}
	if previousID("resp_R3") != "R3" || previousID("other") != "other" {
		t.Error("previous_response_id mapping")
	}
}

func FuzzDecode(f *testing.F) {
	if b, err := os.ReadFile("testdata/codex.json"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(`{"model":"m","input":[{"type":"reasoning","encrypted_content":"rollout.e30"}]}`))
	f.Add([]byte(`{"model":"m","input":[{"role":"assistant","id":"msg_","content":[{"type":"refusal","refusal":"no"}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		call, _, err := decode(body)
		if err != nil {
			if !errors.Is(err, gateway.ErrBadRequest) {
				t.Fatalf("error of the wrong kind: %v", err)
			}
			return
		}
		if call.Model == "" {
			t.Fatal("accepted a call without a model")
		}
		for _, m := range call.Messages {
			if m.Role == "" {
				t.Fatal("a message without a role")
			}
		}
	})
}
