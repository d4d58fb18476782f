// Package responses is the gateway's OpenAI Responses front door
// (POST /v1/responses, the API a Codex-style harness speaks): it decodes a
// create request's instructions, input items (messages, function calls
// and their outputs, reasoning items) and function tools into a canonical
// gateway.Call, and answers the Completer's Reply as a response object or
// as the API's server-sent event sequence.
package responses

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/doorkit"
)

// Name is the door's API name in records and logs.
const Name = "openai-responses"

// Door serves the OpenAI Responses API.
type Door struct {
	// KeepAlive is how long a streamed request waits for its reply before
	// the door commits to an HTTP 200 event stream and writes an SSE
	// comment, then again every KeepAlive until the reply comes (so that
	// a harness's idle timeout does not cut a call queued behind the
	// engine pool). An error before then is an HTTP error with the API's
	// status; after, a response.failed event. 0: doorkit.DefaultKeepAlive
	// (10 s).
	KeepAlive time.Duration
	// Now is the clock for created_at (nil: time.Now).
	Now func() time.Time
}

var (
	_ gateway.FrontDoor = (*Door)(nil)
)

// New returns the door with its defaults.
func New() *Door { return &Door{} }

// Name implements gateway.FrontDoor.
func (d *Door) Name() string { return Name }

// Mount adds POST {prefix}/v1/responses.
func (d *Door) Mount(mux *http.ServeMux, prefix string, c gateway.Completer) {
	mux.HandleFunc("POST "+prefix+"/v1/responses", func(w http.ResponseWriter, r *http.Request) {
		d.serve(w, r, c)
	})
}

func (d *Door) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

func (d *Door) serve(w http.ResponseWriter, r *http.Request, c gateway.Completer) {
	body, err := doorkit.ReadBody(r)
	if err != nil {
		if limit, ok := doorkit.TooLarge(err); ok {
			writeError(w, http.StatusRequestEntityTooLarge, apiError{Message: fmt.Sprintf("the request body is larger than %d bytes", limit), Type: "invalid_request_error"})
			return
		}
		writeError(w, http.StatusBadRequest, apiError{Message: "read the request body: " + err.Error(), Type: "invalid_request_error"})
		return
	}
	call, req, err := decode(body)
	if err != nil {
		writeGatewayError(w, err, call.Model)
		return
	}
	encrypted := slices.Contains(req.Include, "reasoning.encrypted_content")
	session := r.PathValue("session")

	if !call.Stream {
		rep, err := doorkit.Await(r.Context(), c, session, call, 0, nil)
		if err != nil {
			writeGatewayError(w, err, call.Model)
			return
		}
		resp := skeleton(respPrefix+rep.ID, req, req.fields, call.Model, d.now())
		finish(&resp, rep, encrypted)
		doorkit.WriteJSON(w, http.StatusOK, resp)
		return
	}
	var s *stream
	rep, err := doorkit.Await(r.Context(), c, session, call, d.KeepAlive, func() {
		if s == nil {
			s = startStream(w)
		}
		s.Comment("keep-alive")
	})
	if err != nil {
		if s == nil {
			writeGatewayError(w, err, call.Model)
			return
		}
		resp := skeleton(respPrefix+"failed_"+randomID(), req, req.fields, call.Model, d.now())
		s.failed(resp, err)
		return
	}
	if s == nil {
		s = startStream(w)
	}
	resp := skeleton(respPrefix+rep.ID, req, req.fields, call.Model, d.now())
	s.reply(resp, rep, encrypted)
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// apiError is the OpenAI error object.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func writeError(w http.ResponseWriter, status int, e apiError) {
	doorkit.WriteJSON(w, status, map[string]apiError{"error": e})
}

func strp(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// classify maps a gateway error to the API's status, error type and code.
func classify(err error, model string) (int, apiError) {
	e := apiError{Message: err.Error(), Param: strp(gateway.Param(err))}
	switch gateway.KindOf(err) {
	case gateway.ErrBadRequest:
		e.Type = "invalid_request_error"
		return http.StatusBadRequest, e
	case gateway.ErrUnknownModel:
		e.Type, e.Code = "invalid_request_error", strp("model_not_found")
		e.Message = "The model `" + model + "` does not exist or you do not have access to it. (" + err.Error() + ")"
		if e.Param == nil {
			e.Param = strp("model")
		}
		return http.StatusNotFound, e
	case gateway.ErrContextLength:
		e.Type, e.Code = "invalid_request_error", strp("context_length_exceeded")
		e.Message = "Your input exceeds the context window of this model. Please adjust your input and try again. (" + err.Error() + ")"
		if e.Param == nil {
			e.Param = strp("input")
		}
		return http.StatusBadRequest, e
	case gateway.ErrSession:
		e.Type, e.Code = "invalid_request_error", strp("session_not_found")
		return http.StatusNotFound, e
	case gateway.ErrOverloaded:
		e.Type, e.Code = "server_error", strp("server_is_overloaded")
		return http.StatusServiceUnavailable, e
	default:
		e.Type, e.Code = "server_error", strp("server_error")
		return http.StatusInternalServerError, e
	}
}

func writeGatewayError(w http.ResponseWriter, err error, model string) {
	status, e := classify(err, model)
	writeError(w, status, e)
}

// failureCode is a response.failed error code (the API's codes: Codex
// reads context_length_exceeded as a full context window).
func failureCode(err error) string {
	switch gateway.KindOf(err) {
	case gateway.ErrContextLength:
		return "context_length_exceeded"
	case gateway.ErrOverloaded:
		return "rate_limit_exceeded"
	case gateway.ErrBadRequest, gateway.ErrUnknownModel, gateway.ErrSession:
		return "invalid_prompt"
	default:
		return "server_error"
	}
}
