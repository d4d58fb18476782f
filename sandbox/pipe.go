package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/rollout-rl/rollout/sandbox/agent"
)

// Piper is implemented by sandboxes that can run a command with its stdin
// and stdout streamed to the host (the Docker backend's OpPipe): stdio
// servers such as MCP servers that act on the sandbox.
type Piper interface {
	Pipe(ctx context.Context, req ExecRequest) (Pipe, error)
}

// Pipe is a running piped command. Read is its stdout, Write its stdin.
// Close kills the command and releases the stream; Done is closed when the
// command ended (exited, was killed, or the sandbox died), after which Err
// says why.
type Pipe interface {
	io.ReadWriteCloser
	Done() <-chan struct{}
	Err() error
}

type pipeConn struct {
	c    *Conn
	id   uint32
	cl   *call
	pr   *io.PipeReader
	pw   *io.PipeWriter
	done chan struct{}
	Wrap func(string, error) error

	once   sync.Once
	mu     sync.Mutex
	err    error
	closed bool
}

// pipe opens a byte stream to a process started by req; wrap classifies
// the stream's final error the way the owning sandbox classifies its own.
func (c *Conn) Pipe(ctx context.Context, req agent.Request, wrap func(string, error) error) (*pipeConn, error) {
	if err := c.Broken(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	payload, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("%w: encode request: %v", ErrInvalid, err)
	}
	cl := &call{resp: make(chan agent.Response, 1), data: make(chan []byte, 64), gone: make(chan struct{})}
	c.mu.Lock()
	c.nextID++
	id := c.nextID
	c.calls[id] = cl
	c.mu.Unlock()
	pr, pw := io.Pipe()
	p := &pipeConn{c: c, id: id, cl: cl, pr: pr, pw: pw, done: make(chan struct{}), Wrap: wrap}
	if err := c.send(agent.FrameRequest, id, payload); err != nil {
		p.finish(fmt.Errorf("%w: send request: %v", ErrUnavailable, err))
		return nil, p.err
	}
	go p.pump()
	return p, nil
}

// pump copies stdout frames into the pipe until the command's Response,
// the channel's end or Close.
func (p *pipeConn) pump() {
	data := p.cl.data
	for {
		select {
		case b, ok := <-data:
			if !ok {
				data = nil
				continue
			}
			if _, err := p.pw.Write(b); err != nil {
				// The reader closed: keep draining so the channel never stalls.
				continue
			}
		case resp := <-p.cl.resp:
			// Data and End precede the Response; an early refusal has
			// neither, so take only what is already buffered.
			for data != nil {
				select {
				case b, ok := <-data:
					if !ok {
						data = nil
						break
					}
					_, _ = p.pw.Write(b)
				default:
					data = nil
				}
			}
			err := responseError("pipe", resp)
			if err == nil && resp.Exec != nil {
				err = fmt.Errorf("%w: exited with code %d: %s", ErrFailed, resp.Exec.ExitCode, tail(resp.Exec.Stderr, 400))
			}
			p.finish(err)
			return
		case <-p.c.done:
			p.finish(fmt.Errorf("%w: %v", ErrUnavailable, p.c.Broken()))
			return
		}
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func (p *pipeConn) finish(err error) {
	p.once.Do(func() {
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
		p.pw.CloseWithError(io.EOF)
		close(p.cl.gone)
		p.c.mu.Lock()
		delete(p.c.calls, p.id)
		p.c.mu.Unlock()
	})
}

// Read implements io.Reader (the command's stdout).
func (p *pipeConn) Read(b []byte) (int, error) { return p.pr.Read(b) }

// Write implements io.Writer (the command's stdin).
func (p *pipeConn) Write(b []byte) (int, error) {
	select {
	case <-p.done:
		return 0, fmt.Errorf("pipe: the command ended: %w", p.Err())
	default:
	}
	n := 0
	for len(b) > 0 {
		c := b[:min(len(b), agent.ChunkSize)]
		if err := p.c.send(agent.FrameData, p.id, c); err != nil {
			return n, fmt.Errorf("%w: pipe stdin: %v", ErrUnavailable, err)
		}
		n += len(c)
		b = b[len(c):]
	}
	return n, nil
}

// Close kills the command and waits (bounded) for it to end.
func (p *pipeConn) Close() error {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if already {
		return nil
	}
	_ = p.pr.Close()
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.c.send(agent.FrameCancel, p.id, nil)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.finish(errors.New("pipe: no answer to cancel within 10s"))
	}
	return nil
}

// Done implements Pipe.
func (p *pipeConn) Done() <-chan struct{} { return p.done }

// Err implements Pipe: why the command ended (nil while it runs).
func (p *pipeConn) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil && p.Wrap != nil {
		return p.Wrap("pipe", p.err)
	}
	return p.err
}
