package inference

import (
	"context"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	json "github.com/segmentio/encoding/json"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/tools"
)

// agentTools is the terminal and file toolsets: six tools, ~6 KB of
// schemas, what an agent episode sends with every render; and the same,
// encoded.
func agentTools(tb testing.TB) ([]openai.Tool, EncodedTools) {
	tb.Helper()
	set, err := tools.Default().Resolve([]string{"terminal", "file"}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	ts := set.OpenAI()
	enc, err := EncodeTools(ts)
	if err != nil {
		tb.Fatal(err)
	}
	return ts, enc
}

func decodeAny(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := stdjson.Unmarshal(b, &m); err != nil {
		t.Fatalf("request body is not a JSON object: %v: %s", err, b)
	}
	return m
}

// TestEncodedToolsSameBody: a request with its tools encoded ahead sends
// the body the same request with Tools sends, for every request type that
// takes them, with and without extra_body.
func TestEncodedToolsSameBody(t *testing.T) {
	ts, enc := agentTools(t)
	gp := true
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "list the files"}}
	pairs := []struct {
		name       string
		list, json any
	}{
		{"tokenize", &TokenizeRequest{Model: "m", Messages: msgs, Tools: ts, AddGenerationPrompt: &gp},
			&TokenizeRequest{Model: "m", Messages: msgs, ToolsJSON: enc, AddGenerationPrompt: &gp}},
		{"chat", &ChatRequest{Model: "m", Messages: msgs, Tools: ts}, &ChatRequest{Model: "m", Messages: msgs, ToolsJSON: enc}},
		{"apply-template", &LlamaTemplateRequest{Messages: msgs, Tools: ts, AddGenerationPrompt: &gp},
			&LlamaTemplateRequest{Messages: msgs, ToolsJSON: enc, AddGenerationPrompt: &gp}},
	}
	for _, p := range pairs {
		for _, extra := range []map[string]any{nil, {"priority": 3}} {
			a, err := encodeBody(p.list, extra, "op", "r")
			if err != nil {
				t.Fatal(err)
			}
			b, err := encodeBody(p.json, extra, "op", "r")
			if err != nil {
				t.Fatal(err)
			}
			ma, mb := decodeAny(t, a), decodeAny(t, b)
			if _, ok := mb["tools"]; !ok {
				t.Fatalf("%s: no tools in %s", p.name, b)
			}
			if !reflect.DeepEqual(ma, mb) {
				t.Fatalf("%s (extra %v): bodies differ:\n%s\n%s", p.name, extra, a, b)
			}
		}
	}
}

func TestEncodedToolsEdges(t *testing.T) {
	enc, err := EncodeTools(nil)
	if err != nil || enc != nil {
		t.Fatalf("no tools: %q, %v; want nil, nil", enc, err)
	}
	b, err := encodeBody(&ChatRequest{ToolsJSON: enc}, nil, "op", "r")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := decodeAny(t, b)["tools"]; ok {
		t.Fatalf("no tools, but the body has a tools key (vLLM rejects \"tools\": []): %s", b)
	}
	ts, enc := agentTools(t)
	_, err = encodeBody(&TokenizeRequest{Tools: ts, ToolsJSON: enc}, nil, "op", "r")
	var ie *Error
	if !errors.As(err, &ie) || ie.Class != ErrRequest {
		t.Fatalf("both Tools and ToolsJSON: %v, want a request error", err)
	}
	bad := []openai.Tool{{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{Name: "x", Parameters: stdjson.RawMessage(`{`)}}}
	if _, err := EncodeTools(bad); err == nil {
		t.Fatal("a tool with a malformed schema encoded")
	}
}

// BenchmarkRenderRequestEncode is the body of one render (/tokenize with
// the messages of a segment: an assistant tool call and a 4 KB terminal
// listing) with the agent's six tools: as it was encoded before
// (json.Marshal, tools per request), with the tools per request, and with
// the tools encoded once per episode.
func BenchmarkRenderRequestEncode(b *testing.B) {
	ts, enc := agentTools(b)
	gp := true
	msgs := []openai.ChatCompletionMessage{
		{Role: "user", Content: "x"},
		{Role: "assistant", Content: "Listing.", ToolCalls: []openai.ToolCall{{ID: "c1", Type: "function",
			Function: openai.FunctionCall{Name: "terminal", Arguments: `{"command":"ls -la"}`}}}},
		{Role: "tool", ToolCallID: "c1", Content: strings.Repeat("-rw-r--r-- 1 user user 4096 Nov 26 23:59 <a & b>.txt\n", 80)},
	}
	b.Run("as_before", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(&TokenizeRequest{Model: "m", Messages: msgs, Tools: ts, AddGenerationPrompt: &gp}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("tools_per_request", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := encodeBody(&TokenizeRequest{Model: "m", Messages: msgs, Tools: ts, AddGenerationPrompt: &gp}, nil, "op", "r"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("tools_encoded_once", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := encodeBody(&TokenizeRequest{Model: "m", Messages: msgs, ToolsJSON: enc, AddGenerationPrompt: &gp}, nil, "op", "r"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestPromptEchoChecked: /v1/completions' prompt_token_ids must be the
// prompt sent, id for id; an echo that differs (a server that inserted a
// BOS, truncated, or answered another request) is a malformed answer,
// also when an earlier response left its buffer to be reused.
func TestPromptEchoChecked(t *testing.T) {
	body := func(echo string) []byte {
		return []byte(`{"id":"c","choices":[{"index":0,"text":"ab","logprobs":{"tokens":["token_id:97","token_id:98"],` +
			`"token_logprobs":[-0.5,-0.25]},"finish_reason":"length","stop_reason":null,"token_ids":[97,98],"prompt_token_ids":` + echo + `}]}`)
	}
	prompt := []int32{1, 2, 3}
	// Without and with the prompt's encoding at hand (an episode's
	// promptEncoder): an echo of those very bytes is not parsed, any
	// other is.
	for _, encoded := range [][]byte{nil, appendIDs(nil, prompt)} {
		promptEchoCases(t, body, genInput{model: "m", prompt: prompt, promptJSON: encoded, maxTokens: 2, opts: CallOptions{RequestID: "echo-t1"}})
	}
}

func promptEchoCases(t *testing.T, body func(string) []byte, in genInput) {
	prompt := in.prompt
	for _, c := range []struct {
		echo string
		ok   bool
	}{
		{`[1,2,3]`, true},
		{`null`, true}, // older servers: nothing to compare
		{`[1,2,3,4,5,6,7,8]`, false},
		{`[1,2,3]`, true},
		{`[ 1, 2, 3 ]`, true},
		{`[0,1,2,3]`, false},
		{`[1,2]`, false},
		{`[]`, false},
		{`[1,2,4]`, false},
		{`[1,2,3,4]`, false},
	} {
		if err := answerCase(t, body(c.echo), in, c.ok, "prompt_token_ids that differ"); err != "" {
			t.Fatalf("echo %s of prompt %v: %s", c.echo, prompt, err)
		}
	}
}

// answerCase runs completionsGen on a server answering body: with ok the
// turn must give ids 97, 98; else a malformed-answer error naming want.
// It returns what went wrong ("" for nothing).
func answerCase(t *testing.T, body []byte, in genInput, ok bool, want string) string {
	t.Helper()
	p, err := NewPool(PoolConfig{Endpoints: []string{"http://answer.invalid"}, Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	p.caller.hc = &http.Client{Transport: bodyTransport{body}}
	s, err := (completionsGen{}).generate(context.Background(), p, in)
	p.Close()
	if ok {
		if err != nil || !slices.Equal(s.ids, []int32{97, 98}) {
			return fmt.Sprintf("%v, ids %v", err, s.ids)
		}
		return ""
	}
	var ie *Error
	if !errors.As(err, &ie) || ie.Class != ErrInfra || !strings.Contains(ie.Msg, want) {
		return fmt.Sprintf("%v, want a malformed-answer error", err)
	}
	return ""
}

// A tokens-mode request does not ask for the prompt's echo
// (return_token_ids): the server's count of the prompt in usage is
// checked instead, and a prompt it cut or extended is refused.
func TestPromptCountChecked(t *testing.T) {
	if req := TokensCompletionRequest("m", []int32{1, 2, 3}, 2, Sampling{}); req.ReturnTokenIDs || !req.ReturnTokensAsTokenIDs {
		t.Fatalf("request asks return_token_ids %v, return_tokens_as_token_ids %v", req.ReturnTokenIDs, req.ReturnTokensAsTokenIDs)
	}
	body := func(usage string) []byte {
		return []byte(`{"id":"c","choices":[{"index":0,"text":"ab","logprobs":{"tokens":["token_id:97","token_id:98"],` +
			`"token_logprobs":[-0.5,-0.25]},"finish_reason":"length","stop_reason":null}],"usage":` + usage + `}`)
	}
	in := genInput{model: "m", prompt: []int32{1, 2, 3}, maxTokens: 2, opts: CallOptions{RequestID: "count-t1"}}
	for _, c := range []struct {
		usage string
		ok    bool
	}{
		{`{"prompt_tokens":3,"completion_tokens":2}`, true},
		{`null`, true},                                       // no usage: nothing to compare
		{`{"completion_tokens":2}`, true},                    // no count: nothing to compare
		{`{"prompt_tokens":2,"completion_tokens":2}`, false}, // cut
		{`{"prompt_tokens":4,"completion_tokens":2}`, false}, // extended (a BOS added)
	} {
		if err := answerCase(t, body(c.usage), in, c.ok, "prompt tokens"); err != "" {
			t.Fatalf("usage %s: %s", c.usage, err)
		}
	}
}

// encodeBody writes a completion request's prompt ids itself: the body
// means what the codec's encoding of the whole request means, extra_body
// included, for every prompt length.
func TestEncodeBodyPromptIDs(t *testing.T) {
	temp := 0.7
	for _, n := range []int{0, 1, 3, 1000} {
		prompt := make([]int32, n)
		for i := range prompt {
			prompt[i] = int32(i*7919%151936) - int32(i%3) // a negative id too
		}
		req := TokensCompletionRequest("m", prompt, 64, Sampling{Temperature: &temp})
		extra := map[string]any{"priority": 3}
		got, err := encodeBody(req, extra, "op", "r")
		if err != nil {
			t.Fatal(err)
		}
		plain, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		want, err := withExtra(plain, extra)
		if err != nil {
			t.Fatal(err)
		}
		var a, b map[string]any
		if err := json.Unmarshal(got, &a); err != nil {
			t.Fatalf("n=%d: %v: %s", n, err, got)
		}
		if err := json.Unmarshal(want, &b); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("n=%d: encodeBody %s\nthe codec      %s", n, got, want)
		}
		if req.Prompt == nil && n > 0 {
			t.Fatal("encodeBody cleared the caller's prompt")
		}
	}
}

// An episode's prompt encoder encodes what each prompt adds, and a prompt
// that does not extend the last afresh: always the array's own encoding.
func TestPromptEncoder(t *testing.T) {
	var p promptEncoder
	for _, ids := range [][]int32{{}, {5}, {5, 6, 7}, {5, 6, 7, 8, 9}, {5, 6}, {5, 6, 1, 2}, {9}, nil, {1, 2, 3}} {
		got := p.encode(ids)
		want := appendIDs(nil, ids)
		if string(got) != string(want) {
			t.Fatalf("encode(%v) = %s, want %s", ids, got, want)
		}
	}
}
