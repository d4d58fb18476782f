package inference

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// directTransport is the client's http.RoundTripper. What a collector
// sends most is small JSON requests over cleartext HTTP/1.1 straight to an
// engine, thousands of them at once: those it runs on the caller's own
// goroutine, writing the request with net/http's Request.Write and reading
// the answer with http.ReadResponse on a kept-alive connection of its own
// pool. net/http's Transport gives every connection a reader and a writer
// goroutine and hands each request and response between them over
// channels; at 4,096 loops those hand-offs were the largest part of the
// client's CPU (docs/inference.md, "The HTTP floor"). Everything else —
// https (TLS, HTTP/2), a proxy from the environment, a scheme other than
// http — goes to the wrapped net/http Transport unchanged.
//
// Connection rules, as net/http keeps them: a connection is reused only
// after its response body was read to the end and neither side asked to
// close it; an idle connection the server has closed (its keep-alive
// timeout) is noticed before reuse, and a request that fails on a reused
// connection before any byte of an answer arrived is sent once more on a
// new one when its body can be replayed; an answer the server sent before
// it stopped reading the request is returned (earlyAnswer); a cancelled
// context ends a blocked write or read at once (the connection is then
// closed, never reused). Idle connections are kept per host up to maxIdle
// and closed after idleTimeout (never when it is 0). No goroutine is
// started.
type directTransport struct {
	std         *http.Transport
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	maxIdle     int
	idleTimeout time.Duration

	mu    sync.Mutex
	hosts map[string]*directHost
	sweep *time.Timer // pending idle sweep, nil when none is scheduled
}

type directHost struct {
	direct bool          // no proxy applies: the direct path serves it
	idle   []*directConn // LIFO: the most recently used on top
}

type directConn struct {
	net.Conn
	br    *bufio.Reader
	bw    *bufio.Writer
	since time.Time // when it went idle
}

func newDirectTransport(std *http.Transport, maxIdle int) *directTransport {
	dial := std.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	if maxIdle <= 0 {
		maxIdle = http.DefaultMaxIdleConnsPerHost
	}
	return &directTransport{std: std, dial: dial, maxIdle: maxIdle, idleTimeout: std.IdleConnTimeout, hosts: map[string]*directHost{}}
}

var _ http.RoundTripper = (*directTransport)(nil)

// RoundTrip implements http.RoundTripper.
func (t *directTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || req.URL.Host == "" {
		return t.std.RoundTrip(req)
	}
	addr := canonicalAddr(req)
	h := t.host(req, addr)
	if !h.direct {
		return t.std.RoundTrip(req)
	}
	ctx := req.Context()
	resp, retry, err := t.try(ctx, req, h, addr)
	if err == nil || !retry || ctx.Err() != nil {
		return resp, ctxErr(ctx, err)
	}
	if req.Body != nil && req.Body != http.NoBody {
		if req.GetBody == nil {
			return nil, err
		}
		body, gerr := req.GetBody()
		if gerr != nil {
			return nil, err
		}
		req = req.Clone(ctx)
		req.Body = body
	}
	resp, _, err = t.try(ctx, req, h, addr)
	return resp, ctxErr(ctx, err)
}

// ctxErr is the context's error in place of err once the context ended:
// the exchange failed because the caller gave up.
func ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// try sends req once. retry reports a failure on a reused connection
// before any byte of the answer came back: the server had closed it.
func (t *directTransport) try(ctx context.Context, req *http.Request, h *directHost, addr string) (_ *http.Response, retry bool, _ error) {
	c, reused, err := t.conn(ctx, h, addr)
	if err != nil {
		return nil, false, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	fail := func(retry bool, err error) (*http.Response, bool, error) {
		stop()
		_ = c.Close()
		return nil, retry, err
	}
	err = req.Write(c.bw)
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		if resp := earlyAnswer(ctx, c, req); resp != nil {
			return t.answer(ctx, req, resp, c, h, stop, false), false, nil
		}
		return fail(reused, fmt.Errorf("write request: %w", err))
	}
	if _, err := c.br.Peek(1); err != nil {
		// Nothing at all came back on a reused connection: the server
		// closed it while it sat idle, before reading this request.
		nothing := errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
		return fail(reused && nothing, fmt.Errorf("read response: %w", err))
	}
	resp, err := http.ReadResponse(c.br, req)
	if err != nil {
		return fail(false, fmt.Errorf("read response: %w", err))
	}
	if resp.StatusCode < 200 {
		// 1xx: nothing here asks for one (no Expect: 100-continue).
		return fail(false, fmt.Errorf("unexpected informational response %s", resp.Status))
	}
	return t.answer(ctx, req, resp, c, h, stop, !resp.Close && !req.Close), false, nil
}

// answer hands resp to the caller with a body that gives c back (keep) or
// closes it once read.
func (t *directTransport) answer(ctx context.Context, req *http.Request, resp *http.Response, c *directConn, h *directHost, stop func() bool, keep bool) *http.Response {
	body := &directBody{rc: resp.Body, c: c, t: t, h: h, stop: stop, keep: keep, ctx: ctx}
	if resp.Body == http.NoBody { // HEAD, 204, 304, an empty length
		body.done(true) // nothing to read: the connection is free now
	}
	resp.Body = body
	return resp
}

// earlyAnswerWait bounds the look for an answer after a failed write.
const earlyAnswerWait = 50 * time.Millisecond

// earlyAnswer is the answer a server sent before it stopped reading the
// request and closed the connection — a proxy's 413 for a body over its
// limit, a 400 for a bad header: that answer, not "connection reset", is
// what the caller needs to see. It is looked for after any failed write
// (net/http reports a failed write of the body as a failed read of it, so
// the two cannot be told apart) and for at most earlyAnswerWait; nil when
// none came or the context ended.
func earlyAnswer(ctx context.Context, c *directConn, req *http.Request) *http.Response {
	if ctx.Err() != nil {
		return nil
	}
	if err := c.SetReadDeadline(time.Now().Add(earlyAnswerWait)); err != nil {
		return nil
	}
	resp, err := http.ReadResponse(c.br, req)
	if err != nil || resp.StatusCode < 200 {
		return nil
	}
	// The rest of the answer is already here or comes without a wait:
	// no deadline, unless the context ended meanwhile (its callback's
	// past deadline must stay).
	_ = c.SetReadDeadline(time.Time{})
	if ctx.Err() != nil {
		_ = c.SetDeadline(time.Unix(1, 0))
	}
	resp.Close = true
	return resp
}

// conn returns an idle connection of h that is still open, or dials addr.
func (t *directTransport) conn(ctx context.Context, h *directHost, addr string) (*directConn, bool, error) {
	now := time.Now()
	for {
		t.mu.Lock()
		var c *directConn
		if n := len(h.idle); n > 0 {
			c = h.idle[n-1]
			h.idle[n-1] = nil
			h.idle = h.idle[:n-1]
		}
		t.mu.Unlock()
		if c == nil {
			break
		}
		if (t.idleTimeout <= 0 || now.Sub(c.since) < t.idleTimeout) && alive(c.Conn) {
			return c, true, nil
		}
		_ = c.Close()
	}
	nc, err := t.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	return &directConn{Conn: nc, br: bufio.NewReaderSize(nc, 4<<10), bw: bufio.NewWriterSize(nc, 4<<10)}, false, nil
}

// put keeps c for reuse, or closes it when h has enough idle ones.
func (t *directTransport) put(h *directHost, c *directConn) {
	c.since = time.Now()
	t.mu.Lock()
	if len(h.idle) >= t.maxIdle {
		t.mu.Unlock()
		_ = c.Close()
		return
	}
	h.idle = append(h.idle, c)
	if t.sweep == nil && t.idleTimeout > 0 {
		t.sweep = time.AfterFunc(t.idleTimeout, t.sweepIdle)
	}
	t.mu.Unlock()
}

// sweepIdle closes the connections idle for longer than idleTimeout (the
// oldest are at the bottom of each stack) and runs again while any are
// left.
func (t *directTransport) sweepIdle() {
	now := time.Now()
	var stale []*directConn
	t.mu.Lock()
	left := false
	for _, h := range t.hosts {
		n := 0
		for n < len(h.idle) && now.Sub(h.idle[n].since) >= t.idleTimeout {
			n++
		}
		stale = append(stale, h.idle[:n]...)
		h.idle = append(h.idle[:0], h.idle[n:]...)
		left = left || len(h.idle) > 0
	}
	t.sweep = nil
	if left {
		t.sweep = time.AfterFunc(t.idleTimeout/2, t.sweepIdle)
	}
	t.mu.Unlock()
	for _, c := range stale {
		_ = c.Close()
	}
}

// CloseIdleConnections closes every idle connection, both paths'.
func (t *directTransport) CloseIdleConnections() {
	var idle []*directConn
	t.mu.Lock()
	for _, h := range t.hosts {
		idle = append(idle, h.idle...)
		h.idle = nil
	}
	if t.sweep != nil {
		t.sweep.Stop()
		t.sweep = nil
	}
	t.mu.Unlock()
	for _, c := range idle {
		_ = c.Close()
	}
	t.std.CloseIdleConnections()
}

// host returns addr's entry, made on its first request: whether requests
// to it bypass any proxy is learned then (the environment's proxy
// settings are read once anyway).
func (t *directTransport) host(req *http.Request, addr string) *directHost {
	t.mu.Lock()
	h := t.hosts[addr]
	t.mu.Unlock()
	if h != nil {
		return h
	}
	direct := true
	if t.std.Proxy != nil {
		u, err := t.std.Proxy(req)
		direct = err == nil && u == nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if h = t.hosts[addr]; h == nil {
		h = &directHost{direct: direct}
		t.hosts[addr] = h
	}
	return h
}

func canonicalAddr(req *http.Request) string {
	if req.URL.Port() != "" {
		return req.URL.Host
	}
	return net.JoinHostPort(req.URL.Hostname(), "80")
}

// alive reports whether an idle connection is still open: a peek finds
// nothing to read yet. End of file (the server closed it) or bytes nobody
// asked for both mean it must not carry another request.
func alive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true // cannot tell; a failed send on it is retried
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	open := false
	var buf [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		_, _, rerr := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		open = errors.Is(rerr, unix.EAGAIN)
		return true
	}); err != nil {
		return false
	}
	return open
}

// directBody hands the connection back once the body has been read to its
// end, or closes it when the reader stops early or the read fails.
type directBody struct {
	rc   io.ReadCloser
	c    *directConn
	t    *directTransport
	h    *directHost
	stop func() bool
	keep bool
	ctx  context.Context

	once sync.Once
}

func (b *directBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.done(true)
	case err != nil:
		b.done(false)
		if cerr := b.ctx.Err(); cerr != nil {
			err = fmt.Errorf("read body: %w", cerr)
		}
	}
	return n, err
}

func (b *directBody) Close() error {
	b.done(false) // before EOF: the rest of the body is still on the wire
	return nil
}

func (b *directBody) done(complete bool) {
	b.once.Do(func() {
		_ = b.rc.Close()
		// stop is false when the context ended first: its callback has
		// set (or is setting) a deadline on the connection.
		if b.stop() && complete && b.keep {
			b.t.put(b.h, b.c)
			return
		}
		_ = b.c.Close()
	})
}
