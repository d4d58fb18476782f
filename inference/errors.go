package inference

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// Error is the typed error every backend returns. It names the endpoint and
// the request so a failure in a run of thousands of episodes can be traced
// to one server log line, and it wraps exactly one class (ErrInfra or
// ErrRequest) plus, where it applies, ErrContextLength.
type Error struct {
	Class     error  // ErrInfra or ErrRequest
	Endpoint  string // base URL; empty when no endpoint was chosen
	Op        string // e.g. "POST /v1/completions"
	RequestID string // the X-Request-Id sent, when there was one
	Status    int    // HTTP status; 0 when no response was read
	Msg       string // what went wrong, including the server's message
	Err       error  // underlying cause, may be nil
	// acknowledged marks a 200 whose body could not be used: the server did
	// the work, so a generation must not be sent again.
	acknowledged bool
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("inference")
	if e.Op != "" {
		b.WriteString(" ")
		b.WriteString(e.Op)
	}
	if e.Endpoint != "" {
		b.WriteString(" on ")
		b.WriteString(e.Endpoint)
	}
	if e.RequestID != "" {
		b.WriteString(" (request ")
		b.WriteString(e.RequestID)
		b.WriteString(")")
	}
	if e.Status != 0 {
		fmt.Fprintf(&b, ": HTTP %d", e.Status)
	}
	if e.Msg != "" {
		b.WriteString(": ")
		b.WriteString(e.Msg)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap exposes the class and the cause to errors.Is/As.
func (e *Error) Unwrap() []error {
	out := make([]error, 0, 2)
	if e.Class != nil {
		out = append(out, e.Class)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

// ErrTemplate marks a chat template tokens mode cannot work with (its
// assistant-turn closing cannot be learned, or a render does not end with
// it): a configuration error, the same on every request, found by the
// start check (CheckTemplate) before a run's first rollout.
var ErrTemplate = errors.New("chat template not usable in tokens mode")

// errMalformed marks a response that arrived but cannot be used.
var errMalformed = errors.New("malformed response")

// retryable reports whether another attempt may be sent: only when no
// response was acknowledged (connection failure, timeout of an attempt) or
// the server answered 5xx. 4xx is never retried; a 200 with an unusable body
// is never re-sent because the generation already happened.
func retryable(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	if e.acknowledged || errors.Is(e.Class, ErrRequest) {
		return false
	}
	if e.Status >= 500 {
		return true
	}
	return e.Status == 0 && errors.Is(e.Class, ErrInfra)
}

// countsAgainstEndpoint reports whether err says something about the
// endpoint's health (for the circuit breaker); a 4xx is the caller's fault.
func countsAgainstEndpoint(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	return errors.Is(e.Class, ErrInfra)
}

// isNetErr is true for dial/read failures and per-attempt timeouts.
func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// contextLengthMessage recognises the servers' "prompt too long" errors:
//   - vLLM: "This model's maximum context length is N tokens…", "… is
//     longer than the maximum model length of N" (and "Please reduce the
//     length of the messages or completion");
//   - SGLang: "The input (N tokens) is longer than the model's context
//     length (M tokens)", "… exceeds the maximum …";
//   - llama.cpp: type exceed_context_size_error, "request (N tokens) exceeds
//     the available context size (M tokens)…" (the type is checked by the
//     caller);
//   - OpenAI: "context_length_exceeded".
func contextLengthMessage(msg string) bool {
	m := strings.ToLower(msg)
	for _, s := range []string{"maximum context length", "context_length_exceeded", "maximum model length", "context length",
		"exceeds the max", "too long", "available context size", "exceed_context_size"} {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// contentMessage recognises a 5xx the server returned because of the
// request's content rather than its own state — the chat template failing
// on the history. These are ErrRequest + ErrContent: not retried, not held
// against the endpoint. Patterns (case-insensitive):
//   - llama.cpp: "Failed to parse tool call arguments as JSON", "Failed to
//     parse messages", "Failed to apply chat template"/"chat template";
//   - Jinja errors surfacing from Python servers: "TemplateError",
//     "UndefinedError", "jinja2.exceptions", "raise_exception";
//   - JSON decoding of tool-call arguments: "JSONDecodeError", "Expecting
//     value", "Expecting property name".
func contentMessage(msg string) bool {
	m := strings.ToLower(msg)
	for _, s := range []string{"failed to parse tool call arguments", "failed to parse messages", "chat template",
		"templateerror", "undefinederror", "jinja2.exceptions", "raise_exception",
		"jsondecodeerror", "expecting value", "expecting property name"} {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}
