package inference

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	json "github.com/segmentio/encoding/json"

	"github.com/rollout-rl/rollout/internal/util/tracing"

	"github.com/rollout-rl/rollout/internal/util/netpolicy"
)

// maxResponseBytes bounds a response body; a full 128k-token completion
// with logprobs is a few MiB.
const maxResponseBytes = 256 << 20

// newTransport is the client's transport: the direct HTTP/1.1 path for
// cleartext endpoints over a net/http Transport for everything else
// (direct.go), both sized by idlePerHost.
func newTransport(idlePerHost int, st *connStats) *directTransport {
	return newDirectTransport(newStdTransport(idlePerHost, st), idlePerHost)
}

// NewHTTPClient is an HTTP client on the pool's own transport, keeping up
// to idlePerHost idle connections per host: for other clients of
// inference servers (LLM judges) and for benchmarks that measure the
// floor the client stands on.
func NewHTTPClient(idlePerHost int) *http.Client {
	return &http.Client{Transport: newTransport(idlePerHost, nil)}
}

// newStdTransport sizes an http.Transport for thousands of concurrent agent
// loops: the default keeps 2 idle connections per host, which makes every
// burst open (and TIME_WAIT) new sockets. dials counts new connections so
// churn can be measured from the client side.
func newStdTransport(idlePerHost int, st *connStats) *http.Transport {
	// Confined by the network policy of the request's context, when a
	// served job set one (internal/util/netpolicy).
	dial := netpolicy.Dialer(&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second})
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil || st == nil {
				return c, err
			}
			st.dials.Add(1)
			return &countedConn{Conn: c, st: st}, nil
		},
		MaxIdleConns:          0, // no global cap; per-host cap below
		MaxIdleConnsPerHost:   idlePerHost,
		IdleConnTimeout:       120 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		// Inference servers do not compress; asking for gzip only costs CPU.
		DisableCompression: true,
		ForceAttemptHTTP2:  true,
		// Per-connection buffers, allocated at every dial and held by
		// every idle connection (thousands of them): 64 KiB each cost
		// more in allocation and clearing than they saved in syscalls.
		// Bodies larger than a buffer bypass it anyway.
		WriteBufferSize: 16 << 10,
		ReadBufferSize:  16 << 10,
	}
}

// connStats counts dialled and closed connections: closes under steady
// load are connection churn.
type connStats struct {
	dials, closes atomic.Int64
}

type countedConn struct {
	net.Conn
	st   *connStats
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.st.closes.Add(1) })
	return c.Conn.Close()
}

// SyscallConn reaches the socket under the count (the direct transport
// peeks at idle connections through it).
func (c *countedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

// httpCaller performs one JSON request against one endpoint and classifies
// the outcome. It holds no per-endpoint state, so one instance serves a
// whole pool.
type httpCaller struct {
	hc     *http.Client
	apiKey string
}

// doJSON POSTs (or GETs, with body nil) and decodes a 200 into out. body
// may be a []byte (already encoded) or any JSON-marshalable value.
func (c *httpCaller) doJSON(ctx context.Context, base, method, path, reqID string, body any, out any) error {
	op := method + " " + path
	mk := func(class error, status int, msg string, err error) *Error {
		return &Error{Class: class, Endpoint: base, Op: op, RequestID: reqID, Status: status, Msg: msg, Err: err}
	}
	var rdr io.Reader
	if body != nil {
		switch b := body.(type) {
		case []byte:
			rdr = bytes.NewReader(b)
		default:
			enc, err := json.Marshal(body)
			if err != nil {
				return mk(ErrRequest, 0, "encode request", err)
			}
			rdr = bytes.NewReader(enc)
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rdr)
	if err != nil {
		return mk(ErrRequest, 0, "build request", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	if reqID != "" {
		req.Header.Set("X-Request-Id", reqID)
	}
	tracing.Inject(ctx, req.Header)
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(ctxErr, context.DeadlineExceeded) {
			// The caller gave up: not the endpoint's fault.
			return mk(ErrInfra, 0, "cancelled", ctxErr)
		}
		return mk(ErrInfra, 0, "unreachable", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		recordVersionHeader(ctx, resp.Header)
	}
	rb := bodyPool.Get().(*bytes.Buffer)
	defer putBody(rb)
	data, rerr := readBody(resp.Body, resp.ContentLength, rb)
	if resp.StatusCode != http.StatusOK {
		msg := serverMessage(data)
		typ := serverErrorType(data)
		switch {
		case resp.StatusCode >= 400 && (typ == "exceed_context_size_error" || contextLengthMessage(msg)) && resp.StatusCode != http.StatusTooManyRequests:
			return mk(ErrRequest, resp.StatusCode, msg, ErrContextLength)
		case resp.StatusCode >= 500 && serverParseMessage(msg):
			// The model's own tool-call text did not parse on the server:
			// not its health, and the same seeded request fails the same
			// way. The chat backend replays the turn (chatreplay.go).
			return mk(ErrRequest, resp.StatusCode, msg, ErrServerParse)
		case resp.StatusCode >= 500 && contentMessage(msg):
			// The server failed on what we sent (a template that cannot
			// render this history): not its health, not transient.
			return mk(ErrRequest, resp.StatusCode, msg, ErrContent)
		case resp.StatusCode >= 500:
			return mk(ErrInfra, resp.StatusCode, msg, nil)
		case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout:
			// Overload, not a bad request: the runner may retry the rollout,
			// but the pool never re-sends a 4xx itself.
			return &Error{Class: ErrInfra, Endpoint: base, Op: op, RequestID: reqID, Status: resp.StatusCode, Msg: msg, acknowledged: true}
		case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnprocessableEntity:
			// Validation and template errors: the request's content.
			return mk(ErrRequest, resp.StatusCode, msg, ErrContent)
		case resp.StatusCode >= 400:
			return mk(ErrRequest, resp.StatusCode, msg, nil)
		default:
			e := mk(ErrInfra, resp.StatusCode, "unexpected status: "+msg, nil)
			e.acknowledged = true
			return e
		}
	}
	if rerr != nil {
		e := mk(ErrInfra, resp.StatusCode, "read body (truncated response)", rerr)
		e.acknowledged = true
		return e
	}
	if out == nil {
		return nil
	}
	if err := decodeResponse(data, out); err != nil {
		e := mk(ErrInfra, resp.StatusCode, fmt.Sprintf("%v: %s", errMalformed, snippet(data)), err)
		e.acknowledged = true
		return e
	}
	return nil
}

// bodyPool holds response buffers: a response is decoded (copied out)
// before its buffer goes back, so nothing keeps a reference to it.
var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func putBody(b *bytes.Buffer) {
	if b.Cap() <= 4<<20 {
		b.Reset()
		bodyPool.Put(b)
	}
}

// readBody reads at most maxResponseBytes of r into buf, sized up front
// from the Content-Length when the server sent one. The returned slice is
// buf's and only valid until buf is reused.
func readBody(r io.Reader, size int64, buf *bytes.Buffer) ([]byte, error) {
	buf.Reset()
	if size > 0 {
		// ReadFrom wants bytes.MinRead free before each read, including
		// the last one that sees EOF: room for that, so it never regrows.
		// A claimed length is not trusted beyond a few MiB up front.
		buf.Grow(int(min(size, 4<<20)) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(io.LimitReader(r, maxResponseBytes+1))
	data := buf.Bytes()
	if err != nil {
		return data, err
	}
	if len(data) > maxResponseBytes {
		return data[:maxResponseBytes], fmt.Errorf("response larger than %d bytes", maxResponseBytes)
	}
	return data, nil
}

// serverMessage extracts the human message of vLLM ({"error":{"message"}}
// or {"object":"error","message"}), FastAPI ({"detail"}) and SGLang errors.
func serverMessage(data []byte) string {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(data, &v) == nil {
		if len(v.Error) > 0 {
			var inner struct {
				Message string `json:"message"`
			}
			if json.Unmarshal(v.Error, &inner) == nil && inner.Message != "" {
				return inner.Message
			}
			var s string
			if json.Unmarshal(v.Error, &s) == nil && s != "" {
				return s
			}
		}
		if v.Message != "" {
			return v.Message
		}
		if len(v.Detail) > 0 {
			var s string
			if json.Unmarshal(v.Detail, &s) == nil {
				return s
			}
			return snippet(v.Detail)
		}
	}
	return snippet(data)
}

// serverErrorType reads {"error": {"type": …}} (llama.cpp, OpenAI) or a
// top-level "type" (vLLM's ErrorResponse); "" when absent.
func serverErrorType(data []byte) string {
	var v struct {
		Error json.RawMessage `json:"error"`
		Type  string          `json:"type"`
	}
	if json.Unmarshal(data, &v) != nil {
		return ""
	}
	if len(v.Error) > 0 {
		var inner struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(v.Error, &inner) == nil && inner.Type != "" {
			return inner.Type
		}
	}
	return v.Type
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	if s == "" {
		return "(empty body)"
	}
	return s
}
