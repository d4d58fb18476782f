// Package anthropic is the gateway's Anthropic Messages front door
// (POST /v1/messages): it
// decodes a Messages request's system prompt, messages (text, tool_use,
// tool_result, thinking blocks) and client tools into a canonical
// gateway.Call, and answers the Completer's Reply as a message object or
// as the API's server-sent event sequence.
package anthropic

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/doorkit"
)

// Name is the door's API name in records and logs.
const Name = "anthropic-messages"

// Door serves the Anthropic Messages API.
type Door struct {
	// KeepAlive is how long a streamed request waits for its reply before
	// the door commits to an HTTP 200 event stream and writes a ping
	// event, then again every KeepAlive until the reply comes (so that a
	// harness's idle timeout does not cut a call queued behind the engine
	// pool). An error before then is an HTTP error with the API's status;
	// after, an error event. 0: doorkit.DefaultKeepAlive (10 s).
	KeepAlive time.Duration
}

var _ gateway.FrontDoor = (*Door)(nil)

// New returns the door with its defaults.
func New() *Door { return &Door{} }

// Name implements gateway.FrontDoor.
func (d *Door) Name() string { return Name }

// Mount adds POST {prefix}/v1/messages. GET /v1/models (Anthropic's list
// for a request with anthropic-version) is the capture handler's: doors
// never mount it.
func (d *Door) Mount(mux *http.ServeMux, prefix string, c gateway.Completer) {
	mux.HandleFunc("POST "+prefix+"/v1/messages", func(w http.ResponseWriter, r *http.Request) {
		d.serve(w, r, c)
	})
}

func (d *Door) serve(w http.ResponseWriter, r *http.Request, c gateway.Completer) {
	body, err := doorkit.ReadBody(r)
	if err != nil {
		if limit, ok := doorkit.TooLarge(err); ok {
			writeError(w, http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("the request body is larger than %d bytes", limit))
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_request_error", "read the request body: "+err.Error())
		return
	}
	call, err := decode(body)
	if err != nil {
		writeGatewayError(w, err, call.Model)
		return
	}
	session := r.PathValue("session")
	if !call.Stream {
		rep, err := doorkit.Await(r.Context(), c, session, call, 0, nil)
		if err != nil {
			writeGatewayError(w, err, call.Model)
			return
		}
		doorkit.WriteJSON(w, http.StatusOK, messageOf(rep, call.Model))
		return
	}
	var s *stream
	rep, err := doorkit.Await(r.Context(), c, session, call, d.KeepAlive, func() {
		if s == nil {
			s = startStream(w)
		}
		s.Event("ping", map[string]string{"type": "ping"})
		s.Flush()
	})
	if err != nil {
		if s == nil {
			writeGatewayError(w, err, call.Model)
			return
		}
		_, typ, text := classify(err, call.Model)
		s.Event("error", errorBody{Type: "error", Error: errorDetail{Type: typ, Message: text}})
		s.Flush()
		return
	}
	if s == nil {
		s = startStream(w)
	}
	s.reply(messageOf(rep, call.Model))
}

// The signature of a thinking block the door issues carries the Reply.ID
// (base64url after a marker), so that the harness's echo of the block
// names the reply it came from (Message.Ref).
const sigPrefix = "rollout."

func signature(replyID string) string {
	return sigPrefix + base64.RawURLEncoding.EncodeToString([]byte(replyID))
}

func openSignature(sig string) (string, bool) {
	rest, ok := strings.CutPrefix(sig, sigPrefix)
	if !ok {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(b) == 0 {
		return "", false
	}
	return string(b), true
}

// Wire shapes of the message object.
type (
	messageObj struct {
		ID           string         `json:"id"`
		Type         string         `json:"type"`
		Role         string         `json:"role"`
		Content      []contentBlock `json:"content"`
		Model        string         `json:"model"`
		StopReason   *string        `json:"stop_reason"`
		StopSequence *string        `json:"stop_sequence"`
		Usage        usage          `json:"usage"`
	}
	contentBlock struct {
		Type      string          `json:"type"`
		Text      *string         `json:"text,omitempty"`
		Thinking  *string         `json:"thinking,omitempty"`
		Signature *string         `json:"signature,omitempty"`
		ID        string          `json:"id,omitempty"`
		Name      string          `json:"name,omitempty"`
		Input     json.RawMessage `json:"input,omitempty"`
	}
	usage struct {
		InputTokens              int `json:"input_tokens"`
		OutputTokens             int `json:"output_tokens"`
		CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	}
	errorBody struct {
		Type  string      `json:"type"`
		Error errorDetail `json:"error"`
	}
	errorDetail struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
)

func ptr[T any](v T) *T { return &v }

// toolInput is a tool call's arguments as a tool_use input: the object
// itself when the arguments are a JSON object; otherwise (the model wrote
// something else: data, not a gateway failure) the text is kept whole
// under "_raw_arguments" so that the harness sees what was sampled.
func toolInput(args string) json.RawMessage {
	if strings.TrimSpace(args) == "" {
		return json.RawMessage("{}")
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(args), &obj) == nil && obj != nil {
		return json.RawMessage(args)
	}
	b, _ := json.Marshal(map[string]string{"_raw_arguments": args})
	return b
}

func stopReason(rep gateway.Reply) string {
	switch {
	case rep.FinishReason == gateway.FinishLength:
		return "max_tokens"
	case rep.FinishReason == gateway.FinishToolCalls || len(rep.ToolCalls) > 0:
		return "tool_use"
	default:
		return "end_turn"
	}
}

func messageOf(rep gateway.Reply, model string) messageObj {
	m := messageObj{ID: "msg_" + rep.ID, Type: "message", Role: "assistant", Content: []contentBlock{}, Model: model,
		StopReason: ptr(stopReason(rep)),
		Usage:      usage{InputTokens: rep.PromptTokens, OutputTokens: rep.CompletionTokens}}
	if rep.Model != "" {
		m.Model = rep.Model
	}
	if rep.Reasoning != "" {
		m.Content = append(m.Content, contentBlock{Type: "thinking", Thinking: ptr(rep.Reasoning), Signature: ptr(signature(rep.ID))})
	}
	if rep.Content != "" {
		m.Content = append(m.Content, contentBlock{Type: "text", Text: ptr(rep.Content)})
	}
	for _, tc := range rep.ToolCalls {
		m.Content = append(m.Content, contentBlock{Type: "tool_use", ID: tc.ID, Name: tc.Function.Name, Input: toolInput(tc.Function.Arguments)})
	}
	return m
}

func writeError(w http.ResponseWriter, status int, typ, message string) {
	doorkit.WriteJSON(w, status, errorBody{Type: "error", Error: errorDetail{Type: typ, Message: message}})
}

// classify maps a gateway error to the API's status, error type and
// message.
func classify(err error, model string) (int, string, string) {
	msg := err.Error()
	switch gateway.KindOf(err) {
	case gateway.ErrBadRequest:
		if p := gateway.Param(err); p != "" && !strings.Contains(msg, p) {
			msg = p + ": " + msg
		}
		return http.StatusBadRequest, "invalid_request_error", msg
	case gateway.ErrUnknownModel:
		return http.StatusNotFound, "not_found_error", "model: " + model + " (" + msg + ")"
	case gateway.ErrContextLength:
		var e *gateway.Error
		if errors.As(err, &e) && e.Tokens > 0 && e.Limit > 0 {
			return http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("prompt is too long: %d tokens > %d maximum", e.Tokens, e.Limit)
		}
		return http.StatusBadRequest, "invalid_request_error", "prompt is too long: " + msg
	case gateway.ErrSession:
		return http.StatusNotFound, "not_found_error", msg
	case gateway.ErrOverloaded:
		return 529, "overloaded_error", "Overloaded: " + msg
	default:
		return http.StatusInternalServerError, "api_error", msg
	}
}

func writeGatewayError(w http.ResponseWriter, err error, model string) {
	status, typ, msg := classify(err, model)
	writeError(w, status, typ, msg)
}
