package openaichat

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	json "github.com/segmentio/encoding/json"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/internal/testkit/gatewaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func decodeBody(body string) (gateway.Call, bool, *apiError) {
	return decode(httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
}

func TestDecode(t *testing.T) {
	call, usage, e := decodeBody(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"temperature":0.2,"seed":7,"max_tokens":9,
		"tool_choice":{"type":"function","function":{"name":"terminal"}},"parallel_tool_calls":false,
		"tools":[{"type":"function","function":{"name":"terminal","parameters":{"type":"object"}}}],
		"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
		{"role":"assistant","content":null,"reasoning":"hm","tool_calls":[{"id":"call_1","type":"function","function":{"name":"terminal","arguments":"{}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"out"}]}`)
	if e != nil {
		t.Fatal(e.msg)
	}
	if !usage || !call.Stream || call.MaxTokens != 9 || call.ToolChoice.Mode != "function" || call.ToolChoice.Name != "terminal" ||
		*call.ParallelToolCalls || call.Requested["temperature"] != 0.2 || call.Requested["seed"] != float64(7) || len(call.Tools) != 1 {
		t.Fatalf("call %+v", call)
	}
	m := call.Messages
	if m[0].Role != "system" || m[1].Content != "ab" || m[2].ReasoningContent != "hm" || m[2].ToolCalls[0].ID != "call_1" || m[3].ToolCallID != "call_1" {
		t.Fatalf("messages %+v", m)
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct{ body, param, msg string }{
		{`[1]`, "", "not a JSON object"},
		{`{"messages":[{"role":"user","content":"x"}]}`, "model", "model"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"n":2}`, "n", "n=2"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"}`, "tool_choice", "sometimes"},
		{`{"model":"m","messages":[{"content":"x"}]}`, "messages[0].role", "needs a role"},
		{`{"model":"m","messages":[{"role":"user","content":5}]}`, "messages[0].content", "string or an array"},
		{`{"model":"m","messages":[{"role":"user","content":"x","tool_calls":[{"function":{"name":"f"}}]}]}`, "messages[0].tool_calls", "only assistant"},
		{`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]}`, "messages[0].tool_calls[0].function.name", "function name"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval"}]}`, "tools[0]", "type"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-1}`, "max_tokens", "at least 1"},
		{`{"model":"m","messages":[{"role":"user","content":"x"},{"role":5}]}`, "messages[1]", "invalid message"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"many"}`, "", "invalid request"},
	} {
		_, _, e := decodeBody(tc.body)
		if e == nil || e.status != 400 || e.param != tc.param || !strings.Contains(e.msg, tc.msg) {
			t.Errorf("%s: %+v, want param %q and %q", tc.body, e, tc.param, tc.msg)
		}
	}
}

// A harness's next call re-sends the history it sent before: only the
// messages after it are decoded, and the call's messages are what a
// decode of the whole body gives. Messages that are not arrays are refused.
func TestDecodeHistoryOnce(t *testing.T) {
	history := `{"role":"system","content":"sys"},{"role":"user","content":"list the files\nplease"}`
	reply := `{"role":"assistant","content":null,"tool_calls":[{"id":"call_9","type":"function","function":{"name":"terminal","arguments":"{\"command\":\"ls\"}"}}]},{"role":"tool","tool_call_id":"call_9","content":"a.txt\nb.txt"}`
	body := func(msgs string) string { return `{"model":"m","messages":[` + msgs + `]}` }
	if _, _, e := decodeBody(body(history)); e != nil {
		t.Fatal(e.msg)
	}
	hits, reused := historyCache.Stats()
	call, _, e := decodeBody(body(history + "," + reply))
	if e != nil {
		t.Fatal(e.msg)
	}
	h2, r2 := historyCache.Stats()
	if h2 != hits+1 || r2 != reused+2 {
		t.Fatalf("second call: %d hits, %d messages reused; want one hit reusing the 2 messages sent before", h2-hits, r2-reused)
	}
	m := call.Messages
	if len(m) != 4 || m[0].Role != "system" || m[1].Content != "list the files\nplease" || m[2].ToolCalls[0].Function.Arguments != `{"command":"ls"}` || m[3].Content != "a.txt\nb.txt" {
		t.Fatalf("messages %+v", m)
	}
	for _, bad := range []string{`{"model":"m","messages":{"role":"user"}}`, `{"model":"m","messages":"hi"}`, `{"model":"m","messages":[]}`, `{"model":"m","messages":null}`, `{"model":"m"}`} {
		if _, _, e := decodeBody(bad); e == nil || e.param != "messages" {
			t.Errorf("%s: %+v, want an error naming messages", bad, e)
		}
	}
}

// completer answers every call with a fixed reply or error.
type completer struct {
	rep gateway.Reply
	err error
}

func (c completer) Complete(context.Context, string, gateway.Call) (gateway.Reply, error) {
	return c.rep, c.err
}
func (c completer) Models(context.Context, string) ([]gateway.Model, error) { return nil, nil }

func TestErrorMapping(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		want   string
	}{
		{gateway.Errorf(gateway.ErrOverloaded, "", "busy"), 503, `{"error":{"code":null,"message":"overloaded: busy","param":null,"type":"server_error"}}`},
		{gateway.Errorf(gateway.ErrContextLength, "", "too long"), 400, `{"error":{"code":"context_length_exceeded","message":"context length exceeded: too long","param":"messages","type":"invalid_request_error"}}`},
		{context.Canceled, 500, `{"error":{"code":null,"message":"context canceled","param":null,"type":"server_error"}}`},
	} {
		mux := http.NewServeMux()
		Door{}.Mount(mux, "/s/{session}", completer{err: tc.err})
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/s/x/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}]}`)))
		if w.Code != tc.status || strings.TrimSpace(w.Body.String()) != tc.want {
			t.Errorf("%v: %d %s, want %d %s", tc.err, w.Code, w.Body, tc.status, tc.want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(`{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	f.Add(`{"model":"m","messages":[{"role":"assistant","content":[{"type":"text","text":"x"}],"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{"}}]}],"tool_choice":"none"}`)
	f.Add(`{"model":"m","messages":[{"role":"tool"}],"tools":[{"type":"function"}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		call, _, e := decodeBody(body)
		if e == nil && (call.Model == "" || len(call.Messages) == 0) {
			t.Fatalf("accepted a call without model or messages: %q", body)
		}
		if e != nil && (e.status < 400 || e.msg == "") {
			t.Fatalf("error without status or message: %+v", e)
		}
	})
}

// A streamed reply slower than KeepAlive commits the 200 event stream with
// keep-alive comments; a failure after that is a data: {"error": …} event
// (what OpenAI-compatible servers send), and a success the usual chunks.
func TestStreamKeepAliveAndLateError(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`
	fail := &gatewaytest.Scripted{Err: gateway.Errorf(gateway.ErrOverloaded, "", "pool full"), Release: make(chan struct{})}
	resp := gatewaytest.Post(t, gatewaytest.Serve(t, Door{KeepAlive: time.Millisecond}, fail)+"/v1/chat/completions", body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != ": keep-alive\n" {
		t.Fatalf("first line %q, want a keep-alive comment", line)
	}
	close(fail.Release)
	events, _ := gatewaytest.ReadSSE(t, br)
	if len(events) != 1 || events[0].Data["error"] == nil {
		t.Fatalf("events %+v, want one error event", events)
	}
	if e := events[0].Data["error"].(map[string]any); e["type"] != "server_error" || !strings.Contains(e["message"].(string), "pool full") {
		t.Fatalf("error %v", e)
	}

	ok := &gatewaytest.Scripted{Reply: gateway.Reply{ID: "r1", Model: "m", Content: "<b>hi</b>", FinishReason: "stop"}, Release: make(chan struct{})}
	resp = gatewaytest.Post(t, gatewaytest.Serve(t, Door{KeepAlive: time.Millisecond}, ok)+"/v1/chat/completions", body)
	br = bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != ": keep-alive\n" {
		t.Fatalf("first line %q, want a keep-alive comment", line)
	}
	close(ok.Release)
	raw, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"content":"<b>hi</b>"`) || !strings.HasSuffix(string(raw), "data: [DONE]\n\n") {
		t.Fatalf("stream %q", raw)
	}
}

// BenchmarkDecodeHistory decodes a request carrying a 41-message tool
// history (~17 kB), as a harness re-sends on every call.
func BenchmarkDecodeHistory(b *testing.B) {
	msgs := []string{`{"role":"system","content":"` + strings.Repeat("You are a helpful agent. ", 80) + `"}`}
	for i := range 20 {
		msgs = append(msgs,
			fmt.Sprintf(`{"role":"assistant","content":"step %d","tool_calls":[{"id":"call_%d","type":"function","function":{"name":"terminal","arguments":"{\"command\":\"ls -la /tmp\"}"}}]}`, i, i),
			fmt.Sprintf(`{"role":"tool","tool_call_id":"call_%d","content":"%s"}`, i, strings.Repeat("file.txt ", 60)))
	}
	body := `{"model":"m","temperature":0.3,"tools":[{"type":"function","function":{"name":"terminal","parameters":{"type":"object","properties":{"command":{"type":"string"}}}}}],"messages":[` +
		strings.Join(msgs, ",") + `]}`
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, e := decodeBody(body); e != nil {
			b.Fatal(e.msg)
		}
	}
}

// topFields gives what the map decode it stands in for gives: the same
// raw values of the keys decode reads, and never ok on a body the map
// decode refuses.
func FuzzTopFields(f *testing.F) {
	for _, s := range []string{`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}],"seed":7}`,
		`{}`, ` { "tools" : [ 1 , {"a":"}\"]"} ] , "temperature":0.5 } `, `{"t\u006fols":[1],"tools":[2]}`, `{"tools":[1],"tools":null}`,
		`{"Tools":[1],"TOP_P":1}`, `{"a":"\\\"","stop":["\\"]}`, `{"tools":1}x`, `{"tools":01}`, `{"tools":[1,]}`, `[1]`, `null`, `"x"`,
		`{"tools":"\ud800"}`, "{\"tools\xff\":1,\"seed\":\"\xff\"}", `{"n":2,"logprobs":true,"logit_bias":{"1":2}}`, `{"a":1`, `{"a" 1}`,
		`{"stop":"a\/b\u00e9"}`, `{"seed":-0,"top_k":1e2,"min_p":-1.5E-3}`, `{"service_tier":"\""}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		got, ok := topFields([]byte(body))
		var want map[string]json.RawMessage
		werr := json.Unmarshal([]byte(body), &want)
		if !ok {
			return
		}
		if werr != nil {
			t.Fatalf("%q: topFields ok, the map decode says %v", body, werr)
		}
		for _, k := range append([]string{"tools"}, recorded...) {
			g, gok := got[k]
			w, wok := want[k]
			if gok != wok || !bytes.Equal(g, w) {
				t.Fatalf("%q: %s is %q (%v), the map decode's %q (%v)", body, k, g, gok, w, wok)
			}
		}
	})
}

// agentTurnBody is a harness's request a few turns into an episode: a
// system prompt, the task, three tool calls and their results, one tool
// with a JSON schema.
const agentTurnBody = `{"model":"rollout-sim","temperature":0.7,"max_tokens":512,` +
	`"tools":[{"type":"function","function":{"name":"terminal","description":"Run a shell command in the sandbox and return its output.",` +
	`"parameters":{"type":"object","properties":{"command":{"type":"string","description":"The command to run."},` +
	`"timeout":{"type":"integer","description":"Seconds before the command is killed.","minimum":1}},"required":["command"]}}}],` +
	`"messages":[{"role":"system","content":"You are a careful software engineer working in a Linux sandbox. Use the terminal tool to inspect and change files; answer when the task is done."},` +
	`{"role":"user","content":"The tests in ./pkg/parse fail since yesterday's change. Find out why and fix it."},` +
	`{"role":"assistant","content":"Let me run the tests first.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"terminal","arguments":"{\"command\":\"go test ./pkg/parse/\"}"}}]},` +
	`{"role":"tool","tool_call_id":"call_1","content":"--- FAIL: TestParseNumber (0.00s)\n    parse_test.go:41: ParseNumber(\"1e5\") = 0, want 100000\nFAIL\nFAIL\tex/pkg/parse\t0.004s"},` +
	`{"role":"assistant","content":"","tool_calls":[{"id":"call_2","type":"function","function":{"name":"terminal","arguments":"{\"command\":\"git log -p -1 -- pkg/parse/number.go\"}"}}]},` +
	`{"role":"tool","tool_call_id":"call_2","content":"commit 4f1c2a9\n\n    parse: faster digits\n\n-\tfor i < len(s) \u0026\u0026 isDigit(s[i]) {\n+\tfor i < len(s) \u0026\u0026 s[i] > '0' {\n"},` +
	`{"role":"assistant","content":"The new loop stops at '0' and never reads an exponent.","tool_calls":[{"id":"call_3","type":"function","function":{"name":"terminal","arguments":"{\"command\":\"sed -i 's/s\\[i\\] > .0./isDigit(s[i])/' pkg/parse/number.go \u0026\u0026 go test ./pkg/parse/\"}"}}]},` +
	`{"role":"tool","tool_call_id":"call_3","content":"ok  \tex/pkg/parse\t0.003s"}]}`

func TestDecodeAgentTurn(t *testing.T) {
	call, _, e := decodeBody(agentTurnBody)
	if e != nil {
		t.Fatal(e.msg)
	}
	if len(call.Messages) != 8 || len(call.Tools) != 1 || !strings.HasPrefix(string(call.ToolsRaw), `[{"type":"function"`) || call.Requested["temperature"] != 0.7 {
		t.Fatalf("call %+v", call)
	}
}

func BenchmarkDecodeAgentTurn(b *testing.B) {
	b.SetBytes(int64(len(agentTurnBody)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, e := decodeBody(agentTurnBody); e != nil {
			b.Fatal(e.msg)
		}
	}
}
