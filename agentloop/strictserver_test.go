package agentloop

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/tools"
)

// strictChatServer is an OpenAI chat endpoint that behaves like llama.cpp
// (and vLLM) where issue 14's defect 1 showed: its chat template loads every
// tool call's arguments as JSON, so a history with arguments that do not
// parse is refused with HTTP 500 "Failed to parse tool call arguments as
// JSON". Its replies come from a script of messages.
type strictChatServer struct {
	mu       sync.Mutex
	replies  []map[string]any // message + finish_reason per request
	requests int
	refused  int
}

func (s *strictChatServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/models":
		fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model","max_model_len":8192}]}`)
		return
	case "/v1/chat/completions":
	default:
		http.NotFound(w, r)
		return
	}
	var req struct {
		Messages []struct {
			ToolCalls []struct {
				Function struct {
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range req.Messages {
		for _, tc := range m.ToolCalls {
			var v any
			if json.Unmarshal([]byte(tc.Function.Arguments), &v) != nil {
				s.refused++
				w.WriteHeader(http.StatusInternalServerError)
				fmt.Fprint(w, `{"error":{"code":500,"message":"Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse error","type":"server_error"}}`)
				return
			}
		}
	}
	i := s.requests
	s.requests++
	reply := map[string]any{"message": map[string]any{"role": "assistant", "content": "done"}, "finish_reason": "stop"}
	if i < len(s.replies) {
		reply = s.replies[i]
	}
	reply["index"] = 0
	json.NewEncoder(w).Encode(map[string]any{"id": fmt.Sprintf("chatcmpl-%d", i), "object": "chat.completion", "model": "m",
		"choices": []any{reply}, "usage": map[string]any{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
}

func callReply(finish string, name, args string) map[string]any {
	return map[string]any{"finish_reason": finish, "message": map[string]any{"role": "assistant", "content": nil,
		"tool_calls": []any{map[string]any{"id": "call_1", "type": "function", "function": map[string]any{"name": name, "arguments": args}}}}}
}

// Issue 14, defect 1, over HTTP through the real chat backend: a call whose
// arguments the server itself returned cut (finish_reason "length") or
// malformed never reaches the server again as invalid JSON, so the strict
// template never refuses the conversation.
func TestStrictTemplateNeverRefusesTheHistory(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       Config
		replies   []map[string]any
		wantStop  StopReason
		wantReqs  int
		wantError string
	}{
		{"cut call, on_truncation stop", Config{}, []map[string]any{callReply("length", "look", `{"path": "a`)}, StopLength, 1, ""},
		{"cut call, on_truncation tool_error", Config{OnTruncation: TruncationToolError}, []map[string]any{callReply("length", "look", `{"path": "a`)}, StopFinished, 2, InvalidTruncated},
		{"malformed call", Config{}, []map[string]any{callReply("tool_calls", "look", `{"path": 'a'}`)}, StopFinished, 2, tools.InvalidJSON},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &strictChatServer{replies: tc.replies}
			hs := httptest.NewServer(srv)
			defer hs.Close()
			pol, err := inference.Open(inference.Config{Backend: inference.BackendChat, Endpoints: []string{hs.URL}, Retries: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer pol.Close()
			cfg := tc.cfg
			cfg.ID, cfg.Parser = "strict", "hermes"
			cfg.Messages = []openai.ChatCompletionMessage{{Role: "user", Content: "task"}}
			cfg.Tools = (&testTools{}).set(t)
			res, err := Run(context.Background(), cfg, Deps{Policy: pol, Runtime: tools.NewRuntime(&memSandbox{}, "strict")})
			if err != nil {
				t.Fatalf("stop %s: %v", res.StopReason, err)
			}
			if res.StopReason != tc.wantStop || srv.requests != tc.wantReqs || srv.refused != 0 {
				t.Fatalf("stop %s after %d requests (%d refused), want %s after %d", res.StopReason, srv.requests, srv.refused, tc.wantStop, tc.wantReqs)
			}
			if tc.wantError != "" && (len(res.ToolErrors) != 1 || res.ToolErrors[0].Kind != tc.wantError) {
				t.Fatalf("tool errors %+v", res.ToolErrors)
			}
			if e := res.Events[0]; e.Kind != EventArgumentsReplaced || !strings.HasPrefix(e.Original, `{"path": `) {
				t.Fatalf("events %+v", res.Events)
			}
		})
	}
}
