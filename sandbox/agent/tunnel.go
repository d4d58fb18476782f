package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// A tunnel lets the host serve a loopback port inside the sandbox without
// giving the sandbox any network: a process in the sandbox connects to
// 127.0.0.1:PORT, the agent accepts the connection and relays its bytes
// over the exec channel (OpListen, OpAccept). The host answers them (the
// gateway session of a harness running in the sandbox).

// tunnelListener is one OpListen request's listener. Connections accepted
// by the kernel wait in its backlog until an OpAccept takes them.
type tunnelListener struct {
	ln     net.Listener
	conns  chan net.Conn // handed from the accept loop to OpAccept handlers
	closed chan struct{} // closed when the listener is closing

	mu     sync.Mutex
	active map[net.Conn]struct{} // relayed connections, closed with the listener
	done   bool
}

// track registers c as relayed; false when the listener already closed.
func (l *tunnelListener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return false
	}
	l.active[c] = struct{}{}
	return true
}

func (l *tunnelListener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.active, c)
	l.mu.Unlock()
}

// listen serves OpListen: it binds 127.0.0.1:port, reports the port and
// holds the listener until ctx ends (Cancel, the peer's end, a reset,
// shutdown); then it closes the listener and every connection accepted
// from it.
func (s *server) listen(ctx context.Context, p *peer, id uint32, port int) error {
	if port < 0 || port > 65535 {
		return invalidf("listen: port %d out of range 0-65535", port)
	}
	// tcp4 on the loopback address only: the tunnel is for processes of
	// the sandbox, never for anything its network could reach.
	ln, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return failedf("listen on 127.0.0.1:%d: %v", port, err)
	}
	l := &tunnelListener{ln: ln, conns: make(chan net.Conn), closed: make(chan struct{}), active: map[net.Conn]struct{}{}}
	p.mu.Lock()
	p.listeners[id] = l
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.listeners, id)
		p.mu.Unlock()
	}()
	var loop sync.WaitGroup
	loop.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case l.conns <- c:
			case <-l.closed:
				_ = c.Close()
				return
			}
		}
	})
	err = p.sendJSON(FrameData, id, ListenInfo{Port: ln.Addr().(*net.TCPAddr).Port})
	if err == nil {
		<-ctx.Done()
	}
	close(l.closed)
	_ = ln.Close()
	loop.Wait()
	l.mu.Lock()
	l.done = true
	for c := range l.active {
		_ = c.Close()
	}
	l.mu.Unlock()
	return err
}

// accept serves OpAccept: it waits for the next connection of the
// listener of request listenID and relays it (see OpAccept).
func (s *server) accept(ctx context.Context, p *peer, id, listenID uint32, data <-chan []byte) error {
	p.mu.Lock()
	in := p.reqs[id]
	p.mu.Unlock()
	l := in.listener
	if l == nil {
		return notFoundf("accept: no listener %d on this channel", listenID)
	}
	var c net.Conn
	select {
	case c = <-l.conns:
	case <-l.closed:
		return failedf("accept: listener closed")
	case <-ctx.Done():
		return failedf("accept: cancelled")
	}
	if !l.track(c) {
		_ = c.Close()
		return failedf("accept: listener closed")
	}
	defer l.untrack(c)
	defer c.Close()
	if err := p.sendJSON(FrameData, id, AcceptInfo{Remote: c.RemoteAddr().String()}); err != nil {
		return failedf("accept: %v", err)
	}
	return relay(ctx, p, id, c, data, in.closing, l.closed)
}

// dialLoopback serves OpDial: it connects to 127.0.0.1:port inside the sandbox
// and relays the connection (see OpDial). Only the loopback address: the
// host reaches the sandbox's own servers, never what its network could.
func (s *server) dialLoopback(ctx context.Context, p *peer, id uint32, port int, data <-chan []byte) error {
	if port <= 0 || port > 65535 {
		return invalidf("dial: port %d out of range 1-65535", port)
	}
	p.mu.Lock()
	in := p.reqs[id]
	p.mu.Unlock()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return failedf("dial 127.0.0.1:%d: %v", port, err)
	}
	defer c.Close()
	if err := p.sendJSON(FrameData, id, AcceptInfo{Remote: c.RemoteAddr().String()}); err != nil {
		return failedf("dial: %v", err)
	}
	return relay(ctx, p, id, c, data, in.closing, nil)
}

// relay copies c's bytes to the host as Data frames (End at its
// half-close) and the host's Data frames into c until both directions
// ended, the host closed it (closing), or it is aborted (ctx, the
// listener's close).
func relay(ctx context.Context, p *peer, id uint32, c net.Conn, data <-chan []byte, closing, lnClosed <-chan struct{}) error {
	stop := make(chan struct{})
	outDone := make(chan struct{})
	inDone := make(chan struct{})
	var outErr error
	go func() {
		defer close(outDone)
		buf := make([]byte, ChunkSize)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if serr := p.send(FrameData, id, buf[:n]); serr != nil {
					outErr = serr
					return
				}
			}
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return // closed by this side: the answer says why
				}
				outErr = p.send(FrameEnd, id, nil) // EOF (or a reset by the peer)
				return
			}
		}
	}()
	go func() {
		defer close(inDone)
		var werr error
		for {
			select {
			case b, ok := <-data:
				if !ok {
					if werr == nil {
						if cw, ok := c.(interface{ CloseWrite() error }); ok {
							_ = cw.CloseWrite()
						}
					}
					return
				}
				if werr == nil {
					// A failed write (the peer closed) drops the rest;
					// the loop keeps consuming so the channel never
					// stalls on this request.
					_, werr = c.Write(b)
				}
			case <-stop:
				return
			}
		}
	}()
	var aborted string
	outOpen, inOpen, closeReq := true, true, false
	for (outOpen || inOpen) && !(closeReq && !inOpen) {
		select {
		case <-outDone:
			outOpen, outDone = false, nil
		case <-inDone:
			inOpen, inDone = false, nil
		case <-closing:
			closeReq, closing = true, nil
		case <-ctx.Done():
			aborted = "cancelled"
		case <-lnClosed:
			aborted = "listener closed"
		}
		if aborted != "" {
			break
		}
	}
	_ = c.Close()
	close(stop)
	if outDone != nil {
		<-outDone
	}
	if inDone != nil {
		<-inDone
	}
	if aborted != "" {
		_ = p.send(FrameEnd, id, []byte(aborted))
		return failedf("connection %s", aborted)
	}
	if outErr != nil {
		return failedf("relay: %v", outErr)
	}
	return nil
}
