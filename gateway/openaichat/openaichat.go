// Package openaichat is the gateway's OpenAI Chat Completions front door:
// POST /v1/chat/completions, streamed (server-sent events in OpenAI's chunk
// shape) or not, with tools, tool_choice, parallel tool calls and
// reasoning_content, and errors in OpenAI's shape. /v1/models is served by
// the capture handler for every OpenAI door.
//
// Tokens-mode generation is not streamed: a streamed answer is written
// after the generation completes, as the chunks OpenAI would have sent;
// while it runs, a streamed request gets keep-alive comments every
// KeepAlive (gateway/doorkit, as the other doors), and an error after the
// first of them arrives as a data: {"error": …} event under the 200.
package openaichat

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"
	json "github.com/segmentio/encoding/json"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/doorkit"
	"github.com/rollout-rl/rollout/internal/util/jsonscan"
)

// Name is the door's API name in records.
const Name = "openai-chat"

// Door is the OpenAI Chat Completions front door.
type Door struct {
	// Now stamps "created" (time.Now when nil); tests pin it.
	Now func() time.Time
	// KeepAlive is the interval of a streamed answer's keep-alive
	// comments while the generation runs (doorkit.DefaultKeepAlive when
	// 0).
	KeepAlive time.Duration
}

var _ gateway.FrontDoor = Door{}

// Name implements gateway.FrontDoor.
func (Door) Name() string { return Name }

// Mount implements gateway.FrontDoor.
func (d Door) Mount(mux *http.ServeMux, prefix string, c gateway.Completer) {
	mux.HandleFunc("POST "+prefix+"/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		d.serve(w, r, c)
	})
}

// recorded are the request fields that would steer sampling: recorded in
// Call.Requested, never applied (the run's sampler governs).
var recorded = []string{"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
	"repetition_penalty", "seed", "stop", "logit_bias", "logprobs", "top_logprobs", "reasoning_effort", "n",
	"parallel_tool_calls", "response_format", "service_tier"}

type request struct {
	Model               string          `json:"model"`
	Messages            json.RawMessage `json:"messages"` // decoded through historyCache
	Tools               json.RawMessage `json:"tools"`    // decoded through toolsCache
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// wireMessage is one message as OpenAI's API accepts it.
type wireMessage struct {
	Role             string            `json:"role"`
	Content          json.RawMessage   `json:"content"`
	Name             string            `json:"name"`
	ToolCalls        []openai.ToolCall `json:"tool_calls"`
	ToolCallID       string            `json:"tool_call_id"`
	ReasoningContent *string           `json:"reasoning_content"`
	Reasoning        *string           `json:"reasoning"`
}

// apiError is an error with its OpenAI status, type, param and code.
type apiError struct {
	status     int
	typ, code  string
	param, msg string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, msg: fmt.Sprintf(format, args...)}
}

// decode turns the body into a canonical call, with specific errors.
func decode(r *http.Request) (gateway.Call, bool, *apiError) {
	body, err := doorkit.ReadBody(r)
	if err != nil {
		if limit, ok := doorkit.TooLarge(err); ok {
			return gateway.Call{}, false, &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", msg: fmt.Sprintf("request body larger than %d bytes", limit)}
		}
		return gateway.Call{}, false, badRequest("", "read request body: %v", err)
	}
	fields, ok := topFields(body)
	if !ok {
		if err := json.Unmarshal(body, &fields); err != nil {
			return gateway.Call{}, false, badRequest("", "the request body is not a JSON object: %v", err)
		}
	}
	// The request with its messages raw: they are decoded one by one,
	// through historyCache (a harness re-sends its whole history on every
	// call: only the messages after the part seen before are decoded).
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		return gateway.Call{}, false, requestError(err)
	}
	if req.Model == "" {
		return gateway.Call{}, false, badRequest("model", "you must provide a model parameter")
	}
	elems, ok := arrayElems(req.Messages)
	if !ok || len(elems) == 0 {
		return gateway.Call{}, false, badRequest("messages", "messages must be a non-empty array")
	}
	if req.N != nil && *req.N != 1 {
		return gateway.Call{}, false, badRequest("n", "n=%d is not supported: the gateway answers one choice", *req.N)
	}
	tools, err := decodeTools(req.Tools)
	if err != nil {
		return gateway.Call{}, false, requestError(err)
	}
	call := gateway.Call{API: Name, Model: req.Model, Tools: tools, ToolsRaw: fields["tools"], ParallelToolCalls: req.ParallelToolCalls, Stream: req.Stream}
	for i, t := range tools {
		if t.Type != openai.ToolTypeFunction || t.Function == nil || t.Function.Name == "" {
			return gateway.Call{}, false, badRequest(fmt.Sprintf("tools[%d]", i), "a tool must be {\"type\":\"function\",\"function\":{\"name\":…}}")
		}
	}
	switch {
	case req.MaxCompletionTokens != nil:
		call.MaxTokens = *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		call.MaxTokens = *req.MaxTokens
	}
	if call.MaxTokens < 0 {
		return gateway.Call{}, false, badRequest("max_tokens", "max_tokens must be at least 1")
	}
	if len(req.ToolChoice) > 0 && string(req.ToolChoice) != "null" {
		tc, e := toolChoice(req.ToolChoice)
		if e != nil {
			return gateway.Call{}, false, e
		}
		call.ToolChoice = tc
	}
	call.Requested = doorkit.Requested(fields, recorded)
	call.Messages, err = historyCache.Decode(elems, func(i int, raw []byte) (gateway.Message, error) {
		var w wireMessage
		if err := json.Unmarshal(raw, &w); err != nil {
			return gateway.Message{}, badRequest(fmt.Sprintf("messages[%d]", i), "invalid message: %v", err)
		}
		m, e := message(i, w)
		if e != nil {
			return gateway.Message{}, e
		}
		return m, nil
	})
	if bad := (*apiError)(nil); errors.As(err, &bad) {
		return gateway.Call{}, false, bad
	}
	usage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	return call, usage, nil
}

// historyCache holds the messages harnesses sent, decoded (see
// doorkit.HistoryCache).
var historyCache doorkit.HistoryCache[gateway.Message]

// toolsCache holds the tool lists harnesses send, decoded (read-only).
var toolsCache doorkit.DecodeCache[[]openai.Tool]

// decodeTools is the request's tool list (none for an absent or null one).
func decodeTools(raw json.RawMessage) ([]openai.Tool, error) {
	if !doorkit.IsSet(raw) {
		return nil, nil
	}
	return toolsCache.Get(raw, func(raw []byte) ([]openai.Tool, error) {
		var ts []openai.Tool
		err := json.Unmarshal(raw, &ts)
		return ts, err
	})
}

// requestError is the error of a body that did not decode as a request
// (its messages are decoded one by one later, each named in its error).
func requestError(err error) *apiError {
	return badRequest("", "invalid request: %v", err)
}

func toolChoice(raw json.RawMessage) (*gateway.ToolChoice, *apiError) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none", "required":
			return &gateway.ToolChoice{Mode: s}, nil
		}
		return nil, badRequest("tool_choice", "tool_choice %q: want auto, none, required or a function", s)
	}
	var o struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &o); err != nil || o.Type != "function" || o.Function.Name == "" {
		return nil, badRequest("tool_choice", "tool_choice must be a string or {\"type\":\"function\",\"function\":{\"name\":…}}")
	}
	return &gateway.ToolChoice{Mode: "function", Name: o.Function.Name}, nil
}

// message checks one decoded message; "developer" is taken as "system" (chat
// templates know no developer role) and text parts are joined.
func message(i int, w wireMessage) (gateway.Message, *apiError) {
	// The message's parameter name, for an error (not built otherwise).
	param := func(field string) string { return "messages[" + strconv.Itoa(i) + "]" + field }
	m := gateway.Message{}
	switch w.Role {
	case "system", "developer":
		m.Role = openai.ChatMessageRoleSystem
	case "user", "assistant", "tool":
		m.Role = w.Role
	case "":
		return m, badRequest(param(".role"), "a message needs a role")
	default:
		return m, badRequest(param(".role"), "invalid role %q: want system, developer, user, assistant or tool", w.Role)
	}
	text, e := content(param, w.Content)
	if e != nil {
		return m, e
	}
	m.Content, m.Name = text, w.Name
	switch m.Role {
	case "tool":
		if w.ToolCallID == "" {
			return m, badRequest(param(".tool_call_id"), "a tool message must have a tool_call_id")
		}
		m.ToolCallID = w.ToolCallID
	case "assistant":
		for j, tc := range w.ToolCalls {
			if tc.Function.Name == "" {
				return m, badRequest(fmt.Sprintf("%s.tool_calls[%d].function.name", param(""), j), "a tool call needs a function name")
			}
			tc.Type = openai.ToolTypeFunction
			tc.Index = nil
			m.ToolCalls = append(m.ToolCalls, tc)
		}
		switch {
		case w.ReasoningContent != nil:
			m.ReasoningContent = *w.ReasoningContent
		case w.Reasoning != nil:
			m.ReasoningContent = *w.Reasoning
		}
	default:
		if len(w.ToolCalls) > 0 {
			return m, badRequest(param(".tool_calls"), "only assistant messages carry tool_calls")
		}
	}
	return m, nil
}

// content is a string, null, or an array of text parts.
func content(param func(string) string, raw json.RawMessage) (string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if s, ok := jsonscan.Unquote(raw); ok {
		return s, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest(param(".content"), "content must be a string or an array of content parts")
	}
	var b strings.Builder
	for k, p := range parts {
		if p.Type != "text" {
			return "", badRequest(fmt.Sprintf("%s[%d].type", param(".content"), k), "content part type %q is not supported (text only)", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

func (d Door) serve(w http.ResponseWriter, r *http.Request, c gateway.Completer) {
	call, usage, e := decode(r)
	if e != nil {
		writeError(w, e)
		return
	}
	now := time.Now
	if d.Now != nil {
		now = d.Now
	}
	session := r.PathValue("session")
	if !call.Stream {
		rep, err := doorkit.Await(r.Context(), c, session, call, 0, nil)
		if err != nil {
			writeError(w, fromGateway(err))
			return
		}
		doorkit.WriteJSON(w, http.StatusOK, completion(rep, now().Unix()))
		return
	}
	// A generation that takes longer than the keep-alive interval commits
	// the answer to its event stream and sends comments while it waits; an
	// error after that arrives as a data: {"error": …} event under the 200,
	// as OpenAI-compatible servers send it.
	var s *doorkit.Stream
	rep, err := doorkit.Await(r.Context(), c, session, call, d.KeepAlive, func() {
		if s == nil {
			s = doorkit.StartStream(w)
		}
		s.Comment("keep-alive")
	})
	if err != nil {
		if s == nil {
			writeError(w, fromGateway(err))
			return
		}
		s.Data(errorBody(fromGateway(err)))
		s.Flush()
		return
	}
	if s == nil {
		s = doorkit.StartStream(w)
	}
	writeStream(s, rep, now().Unix(), usage)
}

// fromGateway maps a Completer error to OpenAI's status, type and code.
func fromGateway(err error) *apiError {
	e := &apiError{msg: err.Error(), param: gateway.Param(err)}
	switch kind := gateway.KindOf(err); kind {
	case gateway.ErrBadRequest:
		e.status, e.typ = http.StatusBadRequest, "invalid_request_error"
	case gateway.ErrUnknownModel:
		e.status, e.typ, e.code = http.StatusNotFound, "invalid_request_error", "model_not_found"
	case gateway.ErrContextLength:
		e.status, e.typ, e.code = http.StatusBadRequest, "invalid_request_error", "context_length_exceeded"
		if e.param == "" {
			e.param = "messages"
		}
	case gateway.ErrSession:
		e.status, e.typ, e.code = http.StatusNotFound, "invalid_request_error", "session_not_found"
	case gateway.ErrOverloaded:
		e.status, e.typ = http.StatusServiceUnavailable, "server_error"
	default:
		e.status, e.typ = http.StatusInternalServerError, "server_error"
	}
	return e
}

func writeError(w http.ResponseWriter, e *apiError) {
	doorkit.WriteJSON(w, e.status, errorBody(e))
}

// errorBody is OpenAI's error object for e.
func errorBody(e *apiError) any {
	nullable := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	return map[string]any{"error": map[string]any{
		"message": e.msg, "type": e.typ, "param": nullable(e.param), "code": nullable(e.code)}}
}

type wireCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func usageOf(rep gateway.Reply) usageJSON {
	return usageJSON{rep.PromptTokens, rep.CompletionTokens, rep.PromptTokens + rep.CompletionTokens}
}

func completion(rep gateway.Reply, created int64) any {
	type msg struct {
		Role             string     `json:"role"`
		Content          *string    `json:"content"`
		ReasoningContent string     `json:"reasoning_content,omitempty"`
		ToolCalls        []wireCall `json:"tool_calls,omitempty"`
	}
	type choice struct {
		Index        int    `json:"index"`
		Message      msg    `json:"message"`
		Logprobs     any    `json:"logprobs"`
		FinishReason string `json:"finish_reason"`
	}
	m := msg{Role: "assistant", ReasoningContent: rep.Reasoning}
	if rep.Content != "" || len(rep.ToolCalls) == 0 {
		c := rep.Content
		m.Content = &c
	}
	for _, tc := range rep.ToolCalls {
		wc := wireCall{ID: tc.ID, Type: "function"}
		wc.Function.Name, wc.Function.Arguments = tc.Function.Name, tc.Function.Arguments
		m.ToolCalls = append(m.ToolCalls, wc)
	}
	return struct {
		ID      string    `json:"id"`
		Object  string    `json:"object"`
		Created int64     `json:"created"`
		Model   string    `json:"model"`
		Choices []choice  `json:"choices"`
		Usage   usageJSON `json:"usage"`
	}{ID: "chatcmpl-" + rep.ID, Object: "chat.completion", Created: created, Model: rep.Model,
		Choices: []choice{{Message: m, FinishReason: rep.FinishReason}}, Usage: usageOf(rep)}
}

// writeStream writes the reply as OpenAI's chunks: the role, the
// reasoning and content deltas, each tool call (id and name, then its
// arguments) by index, the finish chunk, the usage chunk when asked, and
// [DONE].
func writeStream(s *doorkit.Stream, rep gateway.Reply, created int64, includeUsage bool) {
	type delta struct {
		Role             string     `json:"role,omitempty"`
		Content          *string    `json:"content,omitempty"`
		ReasoningContent string     `json:"reasoning_content,omitempty"`
		ToolCalls        []wireCall `json:"tool_calls,omitempty"`
	}
	type choice struct {
		Index        int     `json:"index"`
		Delta        delta   `json:"delta"`
		Logprobs     any     `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
	}
	type chunk struct {
		ID      string   `json:"id"`
		Object  string   `json:"object"`
		Created int64    `json:"created"`
		Model   string   `json:"model"`
		Choices []choice `json:"choices"`
		// Usage: null on every chunk but the last when include_usage
		// is set (as OpenAI sends them), absent otherwise.
		Usage any `json:"usage,omitempty"`
	}
	emit := func(choices []choice, u any) {
		if u == nil && includeUsage {
			u = json.RawMessage("null")
		}
		s.Data(chunk{ID: "chatcmpl-" + rep.ID, Object: "chat.completion.chunk", Created: created, Model: rep.Model, Choices: choices, Usage: u})
	}
	empty := ""
	emit([]choice{{Delta: delta{Role: "assistant", Content: &empty}}}, nil)
	if rep.Reasoning != "" {
		emit([]choice{{Delta: delta{ReasoningContent: rep.Reasoning}}}, nil)
	}
	if rep.Content != "" {
		c := rep.Content
		emit([]choice{{Delta: delta{Content: &c}}}, nil)
	}
	for i, tc := range rep.ToolCalls {
		idx := i
		head := wireCall{Index: &idx, ID: tc.ID, Type: "function"}
		head.Function.Name = tc.Function.Name
		emit([]choice{{Delta: delta{ToolCalls: []wireCall{head}}}}, nil)
		args := wireCall{Index: &idx}
		args.Function.Arguments = tc.Function.Arguments
		emit([]choice{{Delta: delta{ToolCalls: []wireCall{args}}}}, nil)
	}
	fin := rep.FinishReason
	emit([]choice{{Delta: delta{}, FinishReason: &fin}}, nil)
	if includeUsage {
		u := usageOf(rep)
		emit([]choice{}, &u)
	}
	s.DataText("[DONE]")
	s.Flush()
}
