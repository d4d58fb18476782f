package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/rollout-rl/rollout/sandbox/agent"
)

// Tunneler is implemented by sandboxes that can serve a loopback port
// inside the sandbox from the host over their exec channel, without
// opening the sandbox's network (every backend whose sandboxes run the
// agent: ChannelOps.Listen). A process in the sandbox connects to
// 127.0.0.1:port; the host accepts the connection from the returned
// listener.
type Tunneler interface {
	// Listen binds 127.0.0.1:port inside the sandbox (0: any free port;
	// the listener's Addr says which). The listener lives until it is
	// closed, ctx ends, the sandbox is closed or handed to its next
	// holder; its Close also closes every connection accepted from it.
	Listen(ctx context.Context, port int) (net.Listener, error)
}

// Listen opens a tunnel listener in sb, or says that sb's backend cannot.
func Listen(ctx context.Context, sb Sandbox, port int) (net.Listener, error) {
	t, ok := sb.(Tunneler)
	if !ok {
		return nil, fmt.Errorf("listen in sandbox: %w: %T has no tunnel to the host: %w", ErrInvalid, sb, errors.ErrUnsupported)
	}
	return t.Listen(ctx, port)
}

// Dialer is implemented by sandboxes that can connect the host to a
// loopback port inside the sandbox over their exec channel (the other
// direction of Tunneler; ChannelOps.Dial): a server a process of the
// sandbox listens on is reached without opening the sandbox's network.
type Dialer interface {
	// Dial connects to 127.0.0.1:port inside the sandbox. The connection
	// lives until it is closed, ctx ends, the sandbox is closed or handed
	// to its next holder.
	Dial(ctx context.Context, port int) (net.Conn, error)
}

// Dial connects to a loopback port in sb, or says that sb's backend cannot.
func Dial(ctx context.Context, sb Sandbox, port int) (net.Conn, error) {
	d, ok := sb.(Dialer)
	if !ok {
		return nil, fmt.Errorf("dial in sandbox: %w: %T has no tunnel from the host: %w", ErrInvalid, sb, errors.ErrUnsupported)
	}
	return d.Dial(ctx, port)
}

// TunnelAddr is the address of a tunnel listener and of its connections'
// in-sandbox ends: a loopback address inside the sandbox, not the host's.
type TunnelAddr struct {
	Addr string // host:port inside the sandbox
}

func (a TunnelAddr) Network() string { return "sandbox-tcp" }
func (a TunnelAddr) String() string  { return a.Addr }

// Listen implements Tunneler over the agent's OpListen and OpAccept. The
// holder's gate governs it: a sandbox reset in place for its next holder
// closes the previous holder's listeners (and the agent's reset ends
// their in-sandbox side too).
func (o *ChannelOps) Listen(ctx context.Context, port int) (net.Listener, error) {
	if port < 0 || port > 65535 {
		return nil, fmt.Errorf("listen in sandbox: %w: port %d out of range 0-65535", ErrInvalid, port)
	}
	end, err := o.Begin()
	if err != nil {
		return nil, err
	}
	defer end()
	c := o.Conn
	id, cl, err := c.open(agent.Request{Op: agent.OpListen, Port: port})
	if err != nil {
		return nil, o.owner.Wrap("listen", err)
	}
	l := &tunnelListener{ops: o, id: id, cl: cl, done: make(chan struct{}), conns: map[*tunnelConn]struct{}{}}
	var info agent.ListenInfo
	select {
	case b, ok := <-cl.data:
		if !ok {
			err = fmt.Errorf("%w: agent ended the listen stream", ErrUnavailable)
		} else if jerr := json.Unmarshal(b, &info); jerr != nil || info.Port <= 0 {
			err = fmt.Errorf("%w: bad listen answer %q", ErrUnavailable, b)
		}
	case resp := <-cl.resp:
		err = responseError("listen", resp)
		if err == nil {
			err = fmt.Errorf("%w: agent closed the listener at once", ErrUnavailable)
		}
		if resp.Code == agent.CodeInvalid && resp.Err == fmt.Sprintf("unknown op %q", agent.OpListen) {
			err = fmt.Errorf("%w: this sandbox's agent has no tunnel (stale rollout-agent binary?): %w", ErrInvalid, errors.ErrUnsupported)
		}
		c.forget(id, cl)
		return nil, o.owner.Wrap("listen", err)
	case <-ctx.Done():
		err = ctx.Err()
	case <-c.done:
		err = fmt.Errorf("%w: %v", ErrUnavailable, c.Broken())
	}
	if err != nil {
		l.shut(err)
		return nil, o.owner.Wrap("listen", err)
	}
	l.addr = TunnelAddr{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(info.Port))}
	handedOn := fmt.Errorf("tunnel listener: %w: %w: sandbox handed to its next holder", net.ErrClosed, ErrClosed)
	if !o.calls.onShut(l, func() { l.shut(handedOn) }) {
		l.shut(handedOn)
		return nil, fmt.Errorf("listen: %w: handed to its next holder", ErrClosed)
	}
	go l.watch(ctx)
	return l, nil
}

// Dial implements Dialer over the agent's OpDial. ctx bounds the connect
// only; a sandbox handed to its next holder closes the connection.
func (o *ChannelOps) Dial(ctx context.Context, port int) (net.Conn, error) {
	if port <= 0 || port > 65535 {
		return nil, fmt.Errorf("dial in sandbox: %w: port %d out of range 1-65535", ErrInvalid, port)
	}
	end, err := o.Begin()
	if err != nil {
		return nil, err
	}
	defer end()
	c := o.Conn
	id, cl, err := c.open(agent.Request{Op: agent.OpDial, Port: port})
	if err != nil {
		return nil, o.owner.Wrap("dial", err)
	}
	var info agent.AcceptInfo
	select {
	case b, ok := <-cl.data:
		if !ok {
			err = fmt.Errorf("%w: agent ended the dial stream", ErrUnavailable)
		} else if jerr := json.Unmarshal(b, &info); jerr != nil {
			err = fmt.Errorf("%w: bad dial answer %q", ErrUnavailable, b)
		}
	case resp := <-cl.resp:
		err = responseError(fmt.Sprintf("dial 127.0.0.1:%d", port), resp)
		if err == nil {
			err = fmt.Errorf("%w: agent answered dial without a connection", ErrUnavailable)
		}
		if resp.Code == agent.CodeInvalid && resp.Err == fmt.Sprintf("unknown op %q", agent.OpDial) {
			err = fmt.Errorf("%w: this sandbox's agent cannot dial (stale rollout-agent binary?): %w", ErrInvalid, errors.ErrUnsupported)
		}
		c.forget(id, cl)
		return nil, o.owner.Wrap("dial", err)
	case <-ctx.Done():
		err = ctx.Err()
	case <-c.done:
		err = fmt.Errorf("%w: %v", ErrUnavailable, c.Broken())
	}
	if err != nil {
		if c.Broken() == nil {
			_ = c.send(agent.FrameCancel, id, nil)
		}
		c.forget(id, cl)
		return nil, o.owner.Wrap("dial", err)
	}
	tc := &tunnelConn{c: c, id: id, cl: cl, local: TunnelAddr{Addr: "host"}, remote: TunnelAddr{Addr: info.Remote},
		closed: make(chan struct{}), rd: newDeadline(), wd: newDeadline()}
	handedOn := fmt.Errorf("tunnel connection: %w: %w: sandbox handed to its next holder", net.ErrClosed, ErrClosed)
	if !o.calls.onShut(tc, func() { tc.finish(handedOn, false) }) {
		tc.finish(handedOn, false)
		return nil, fmt.Errorf("dial: %w: handed to its next holder", ErrClosed)
	}
	tc.untrack = func() { o.calls.offShut(tc) }
	return tc, nil
}

// open registers a call and sends its request; the caller reads cl's
// frames itself and must forget the call when done.
func (c *Conn) open(req agent.Request) (uint32, *call, error) {
	if err := c.Broken(); err != nil {
		return 0, nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	payload, err := json.Marshal(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: encode request: %v", ErrInvalid, err)
	}
	cl := &call{resp: make(chan agent.Response, 1), data: make(chan []byte, 64), gone: make(chan struct{})}
	c.mu.Lock()
	c.nextID++
	id := c.nextID
	c.calls[id] = cl
	c.mu.Unlock()
	if err := c.send(agent.FrameRequest, id, payload); err != nil {
		c.forget(id, cl)
		return 0, nil, fmt.Errorf("%w: send request: %v", ErrUnavailable, err)
	}
	return id, cl, nil
}

// forget stops delivering id's frames (late ones are dropped) and
// releases the read loop if it was blocked on cl.
func (c *Conn) forget(id uint32, cl *call) {
	c.mu.Lock()
	if c.calls[id] == cl {
		delete(c.calls, id)
	}
	c.mu.Unlock()
	select {
	case <-cl.gone:
	default:
		close(cl.gone)
	}
}

// tunnelListener is the host end of an OpListen request.
type tunnelListener struct {
	ops  *ChannelOps
	id   uint32
	cl   *call
	addr TunnelAddr

	once  sync.Once
	done  chan struct{} // closed by shut
	mu    sync.Mutex
	err   error
	conns map[*tunnelConn]struct{}
}

var _ net.Listener = (*tunnelListener)(nil)

// watch ends the listener when ctx ends, the agent closes it or the
// channel breaks.
func (l *tunnelListener) watch(ctx context.Context) {
	c := l.ops.Conn
	select {
	case <-l.done:
	case <-ctx.Done():
		l.shut(fmt.Errorf("%w: %v", net.ErrClosed, ctx.Err()))
	case resp := <-l.cl.resp:
		err := responseError("listen", resp)
		if err == nil {
			err = errors.New("listener closed by the sandbox's agent")
		}
		l.shut(fmt.Errorf("%w: %v", net.ErrClosed, l.ops.owner.Wrap("listen", err)))
	case <-c.done:
		l.shut(fmt.Errorf("%w: %v", net.ErrClosed, l.ops.owner.Wrap("listen", fmt.Errorf("%w: %v", ErrUnavailable, c.Broken()))))
	}
}

// shut closes the listener once: the agent is told (Cancel: it closes the
// in-sandbox listener and every connection from it), and the host ends of
// those connections fail at once.
func (l *tunnelListener) shut(err error) {
	l.once.Do(func() {
		l.mu.Lock()
		l.err = err
		conns := l.conns
		l.conns = nil
		l.mu.Unlock()
		close(l.done)
		c := l.ops.Conn
		if c.Broken() == nil {
			_ = c.send(agent.FrameCancel, l.id, nil)
		}
		c.forget(l.id, l.cl)
		for tc := range conns {
			tc.finish(fmt.Errorf("%w: the tunnel's listener closed", net.ErrClosed), false)
		}
		l.ops.calls.offShut(l)
	})
}

func (l *tunnelListener) closedErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Accept waits for the next connection to the listener's port inside the
// sandbox.
func (l *tunnelListener) Accept() (net.Conn, error) {
	select {
	case <-l.done:
		return nil, l.closedErr()
	default:
	}
	c := l.ops.Conn
	id, cl, err := c.open(agent.Request{Op: agent.OpAccept, Listener: l.id})
	if err != nil {
		return nil, l.ops.owner.Wrap("accept", err)
	}
	var info agent.AcceptInfo
	select {
	case b, ok := <-cl.data:
		if !ok {
			err = fmt.Errorf("%w: agent ended the accept stream", ErrUnavailable)
		} else if jerr := json.Unmarshal(b, &info); jerr != nil {
			err = fmt.Errorf("%w: bad accept answer %q", ErrUnavailable, b)
		}
	case resp := <-cl.resp:
		err = responseError("accept", resp)
		if err == nil {
			err = errors.New("agent answered accept without a connection")
		}
		select {
		case <-l.done:
			err = l.closedErr()
		default:
			err = l.ops.owner.Wrap("accept", err)
		}
	case <-l.done:
		err = l.closedErr()
	case <-c.done:
		err = l.ops.owner.Wrap("accept", fmt.Errorf("%w: %v", ErrUnavailable, c.Broken()))
	}
	if err != nil {
		if c.Broken() == nil {
			_ = c.send(agent.FrameCancel, id, nil)
		}
		c.forget(id, cl)
		return nil, err
	}
	tc := &tunnelConn{c: c, id: id, cl: cl, local: l.addr, remote: TunnelAddr{Addr: info.Remote},
		closed: make(chan struct{}), rd: newDeadline(), wd: newDeadline()}
	l.mu.Lock()
	if l.conns == nil {
		l.mu.Unlock()
		tc.finish(l.closedErr(), true)
		return nil, l.closedErr()
	}
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	tc.untrack = func() {
		l.mu.Lock()
		delete(l.conns, tc)
		l.mu.Unlock()
	}
	return tc, nil
}

// Close closes the listener and every connection accepted from it.
func (l *tunnelListener) Close() error {
	l.shut(net.ErrClosed)
	return nil
}

// Addr is the listener's address inside the sandbox.
func (l *tunnelListener) Addr() net.Addr { return l.addr }

// tunnelConn is the host end of one relayed connection (an OpAccept
// request). Reads take the agent's Data frames in order; no goroutine is
// held per connection.
type tunnelConn struct {
	c             *Conn
	id            uint32
	cl            *call
	local, remote TunnelAddr
	untrack       func()

	rmu  sync.Mutex // serialises readers; guards buf
	buf  []byte
	rd   *deadline
	wmu  sync.Mutex // serialises writers; guards wclosed
	wd   *deadline
	once sync.Once

	closed  chan struct{} // closed by finish
	mu      sync.Mutex
	err     error // why the connection ended (finish)
	wclosed bool  // CloseWrite was sent
}

var _ net.Conn = (*tunnelConn)(nil)

// finish ends the host end once: graceful sends EndClose (the agent writes
// what was sent, then closes the in-sandbox end), otherwise a Cancel
// aborts it.
func (t *tunnelConn) finish(err error, graceful bool) {
	t.once.Do(func() {
		t.mu.Lock()
		t.err = err
		t.mu.Unlock()
		close(t.closed)
		if t.c.Broken() == nil {
			if graceful {
				// Under wmu: after any Data frame a writer is sending.
				t.wmu.Lock()
				_ = t.c.send(agent.FrameEnd, t.id, []byte(agent.EndClose))
				t.wmu.Unlock()
			} else {
				_ = t.c.send(agent.FrameCancel, t.id, nil)
			}
		}
		t.c.forget(t.id, t.cl)
		if t.untrack != nil {
			t.untrack()
		}
	})
}

func (t *tunnelConn) endErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// Read returns the in-sandbox peer's bytes; io.EOF after its half-close.
func (t *tunnelConn) Read(b []byte) (int, error) {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	if len(b) == 0 {
		return 0, nil
	}
	for len(t.buf) == 0 {
		select {
		case <-t.closed:
			return 0, t.endErr()
		default:
		}
		select {
		case p, ok := <-t.cl.data:
			if !ok {
				if reason := t.cl.endReason; reason != "" {
					return 0, fmt.Errorf("tunnel connection: %w: %s", ErrUnavailable, reason)
				}
				return 0, io.EOF
			}
			t.buf = p
		case <-t.closed:
			return 0, t.endErr()
		case <-t.rd.wait():
			return 0, os.ErrDeadlineExceeded
		case <-t.c.done:
			return 0, fmt.Errorf("tunnel connection: %w: %v", ErrUnavailable, t.c.Broken())
		}
	}
	n := copy(b, t.buf)
	t.buf = t.buf[n:]
	return n, nil
}

// Write sends b to the in-sandbox peer.
func (t *tunnelConn) Write(b []byte) (int, error) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	n := 0
	for len(b) > 0 {
		select {
		case <-t.closed:
			return n, t.endErr()
		case <-t.wd.wait():
			return n, os.ErrDeadlineExceeded
		default:
		}
		if t.wclosed {
			return n, fmt.Errorf("tunnel connection: write after CloseWrite: %w", net.ErrClosed)
		}
		chunk := b[:min(len(b), agent.ChunkSize)]
		if err := t.c.send(agent.FrameData, t.id, chunk); err != nil {
			return n, fmt.Errorf("tunnel connection: %w: %v", ErrUnavailable, err)
		}
		n += len(chunk)
		b = b[len(chunk):]
	}
	return n, nil
}

// CloseWrite half-closes the connection: the in-sandbox peer reads EOF
// once everything written before has arrived.
func (t *tunnelConn) CloseWrite() error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	select {
	case <-t.closed:
		return t.endErr()
	default:
	}
	if t.wclosed {
		return nil
	}
	t.wclosed = true
	if err := t.c.send(agent.FrameEnd, t.id, nil); err != nil {
		return fmt.Errorf("tunnel connection: %w: %v", ErrUnavailable, err)
	}
	return nil
}

// Close closes the connection: what was written is delivered, then the
// in-sandbox end is closed.
func (t *tunnelConn) Close() error {
	t.finish(net.ErrClosed, true)
	return nil
}

func (t *tunnelConn) LocalAddr() net.Addr  { return t.local }
func (t *tunnelConn) RemoteAddr() net.Addr { return t.remote }

func (t *tunnelConn) SetDeadline(at time.Time) error {
	t.rd.set(at)
	t.wd.set(at)
	return nil
}
func (t *tunnelConn) SetReadDeadline(at time.Time) error  { t.rd.set(at); return nil }
func (t *tunnelConn) SetWriteDeadline(at time.Time) error { t.wd.set(at); return nil }

// deadline is a settable point in time whose wait channel is closed once
// it has passed (net.Conn deadlines; http.Server relies on them to stop a
// background read).
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	ch    chan struct{}
}

func newDeadline() *deadline { return &deadline{ch: make(chan struct{})} }

func (d *deadline) set(at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.ch // the timer fired: wait for its close
	}
	d.timer = nil
	select {
	case <-d.ch:
		d.ch = make(chan struct{})
	default:
	}
	if at.IsZero() {
		return
	}
	if dur := time.Until(at); dur <= 0 {
		close(d.ch)
		return
	}
	ch := d.ch
	d.timer = time.AfterFunc(time.Until(at), func() { close(ch) })
}

func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}
