package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/rollout-rl/rollout/sandbox/agent"
)

// conn is the host end of the agent channel: one attached stdio stream,
// many concurrent requests told apart by id.
type Conn struct {
	wmu sync.Mutex
	w   io.Writer

	mu     sync.Mutex
	calls  map[uint32]*call
	nextID uint32
	err    error // why the channel ended; set before done is closed

	Hello chan agent.Hello
	done  chan struct{}
}

type call struct {
	resp    chan agent.Response
	data    chan []byte
	dataEnd bool
	// endReason is the End frame's payload (an aborted stream), set
	// before data is closed.
	endReason string
	gone      chan struct{} // closed when the caller stopped listening
}

func NewConn(r io.Reader, w io.Writer) *Conn {
	c := &Conn{w: w, calls: map[uint32]*call{}, Hello: make(chan agent.Hello, 1), done: make(chan struct{})}
	go c.readLoop(r)
	return c
}

func (c *Conn) readLoop(r io.Reader) {
	err := c.read(r)
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = errors.New("exec channel closed (the sandbox's agent or container exited)")
	}
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
	close(c.done)
}

func (c *Conn) read(r io.Reader) error {
	for {
		f, err := agent.ReadFrame(r)
		if err != nil {
			return err
		}
		switch f.Type {
		case agent.FrameHello:
			var h agent.Hello
			if err := json.Unmarshal(f.Payload, &h); err != nil {
				return fmt.Errorf("bad hello from agent: %w", err)
			}
			select {
			case c.Hello <- h:
			default:
			}
		case agent.FrameResponse, agent.FrameData, agent.FrameEnd:
			c.mu.Lock()
			cl := c.calls[f.ID]
			if f.Type == agent.FrameResponse {
				delete(c.calls, f.ID)
			}
			c.mu.Unlock()
			if cl == nil {
				continue
			}
			switch f.Type {
			case agent.FrameResponse:
				var resp agent.Response
				if err := json.Unmarshal(f.Payload, &resp); err != nil {
					resp = agent.Response{Code: agent.CodeFailed, Err: "bad response from agent: " + err.Error()}
				}
				cl.resp <- resp
			case agent.FrameData:
				select {
				case cl.data <- f.Payload:
				case <-cl.gone:
				}
			case agent.FrameEnd:
				if !cl.dataEnd {
					cl.dataEnd = true
					cl.endReason = string(f.Payload)
					close(cl.data)
				}
			}
		default:
			return fmt.Errorf("unexpected frame type %q from agent", f.Type)
		}
	}
}

// broken returns the channel's end reason, or nil while it is healthy.
func (c *Conn) Broken() error {
	select {
	case <-c.done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err
	default:
		return nil
	}
}

func (c *Conn) send(typ byte, id uint32, payload []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return agent.WriteFrame(c.w, typ, id, payload)
}

// roundTrip sends req, streams upload (if any) as Data frames, copies the
// response's Data frames into download (if any) and returns the Response.
// Channel failures are ErrUnavailable; ctx errors are returned as such.
func (c *Conn) roundTrip(ctx context.Context, req agent.Request, upload io.Reader, download io.Writer) (agent.Response, error) {
	if err := c.Broken(); err != nil {
		return agent.Response{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	payload, err := json.Marshal(req)
	if err != nil {
		return agent.Response{}, fmt.Errorf("%w: encode request: %v", ErrInvalid, err)
	}
	if len(payload) > agent.MaxFrame {
		return agent.Response{}, fmt.Errorf("%w: request of %d bytes is too large (stdin above ~20 MB: use WriteFile)", ErrInvalid, len(payload))
	}
	cl := &call{resp: make(chan agent.Response, 1), data: make(chan []byte, 64), gone: make(chan struct{})}
	c.mu.Lock()
	c.nextID++
	id := c.nextID
	c.calls[id] = cl
	c.mu.Unlock()
	defer func() {
		close(cl.gone)
		c.mu.Lock()
		delete(c.calls, id)
		c.mu.Unlock()
	}()
	fail := func(err error) (agent.Response, error) {
		if b := c.Broken(); b != nil {
			return agent.Response{}, fmt.Errorf("%w: %v", ErrUnavailable, b)
		}
		return agent.Response{}, err
	}
	if err := c.send(agent.FrameRequest, id, payload); err != nil {
		return fail(fmt.Errorf("%w: send request: %v", ErrUnavailable, err))
	}
	var early *agent.Response
	if upload != nil {
		var err error
		if early, err = c.stream(ctx, id, upload, cl.resp); err != nil {
			if !errors.Is(err, ErrUnavailable) {
				// Aborted (cancelled, or the source failed): the agent
				// answers once it has dropped the partial upload.
				c.awaitCancelled(cl, cl.data)
			}
			return fail(err)
		}
		if early != nil {
			// The agent answered (an error) before the stream ended.
			return *early, nil
		}
	}
	data := cl.data
	var werr error
	for {
		select {
		case b, ok := <-data:
			if !ok {
				data = nil
				continue
			}
			if download != nil && werr == nil {
				if _, werr = download.Write(b); werr != nil {
					_ = c.send(agent.FrameCancel, id, nil)
				}
			}
		case resp := <-cl.resp:
			// Data and End frames precede the Response, so whatever is still
			// buffered belongs to this answer.
			for data != nil {
				select {
				case b, ok := <-data:
					if !ok {
						data = nil
						break
					}
					if download != nil && werr == nil {
						_, werr = download.Write(b)
					}
				default:
					data = nil
				}
			}
			if werr != nil {
				return resp, fmt.Errorf("write downloaded data: %w", werr)
			}
			return resp, nil
		case <-ctx.Done():
			_ = c.send(agent.FrameCancel, id, nil)
			c.awaitCancelled(cl, data)
			return agent.Response{}, ctx.Err()
		case <-c.done:
			return fail(nil)
		}
	}
}

// cancelGrace bounds how long a cancelled call waits for the agent's
// answer to it.
const cancelGrace = 2 * time.Second

// awaitCancelled waits, after a Cancel frame (or an aborted upload), for
// the agent's answer to the call: the agent sends it once the command is
// killed and reaped (the partial upload dropped), so a call made right
// after a cancelled one never finds that command still running or still
// writing. The rest of its output is dropped. An agent that does not
// answer within cancelGrace is not waited for further.
func (c *Conn) awaitCancelled(cl *call, data <-chan []byte) {
	t := time.NewTimer(cancelGrace)
	defer t.Stop()
	for {
		select {
		case _, ok := <-data:
			if !ok {
				data = nil
			}
		case <-cl.resp:
			return
		case <-c.done:
			return
		case <-t.C:
			return
		}
	}
}

// stream sends r as Data frames and an End frame. It stops early when the
// agent already answered (it refused the transfer) and returns that answer.
func (c *Conn) stream(ctx context.Context, id uint32, r io.Reader, resp <-chan agent.Response) (*agent.Response, error) {
	buf := make([]byte, agent.ChunkSize)
	for {
		select {
		case early := <-resp:
			return &early, nil
		default:
		}
		if err := ctx.Err(); err != nil {
			_ = c.send(agent.FrameEnd, id, []byte("cancelled"))
			return nil, err
		}
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := c.send(agent.FrameData, id, buf[:n]); err != nil {
				return nil, fmt.Errorf("%w: send data: %v", ErrUnavailable, err)
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			if err := c.send(agent.FrameEnd, id, nil); err != nil {
				return nil, fmt.Errorf("%w: send data: %v", ErrUnavailable, err)
			}
			return nil, nil
		}
		if rerr != nil {
			_ = c.send(agent.FrameEnd, id, []byte("source failed"))
			return nil, fmt.Errorf("read upload source: %w", rerr)
		}
	}
}

// responseError maps an agent error code onto the sandbox error classes.
func responseError(what string, resp agent.Response) error {
	if resp.Err == "" && resp.Code == "" {
		return nil
	}
	class := ErrFailed
	switch resp.Code {
	case agent.CodeInvalid:
		class = ErrInvalid
	case agent.CodeNotFound:
		class = ErrNotFound
	}
	return fmt.Errorf("%s: %w: %s", what, class, resp.Err)
}

// tailBuffer keeps the last bytes of the agent's stderr for error messages.
// NewTailBuffer keeps the last max bytes written to it (an agent's stderr,
// quoted when its start fails).
func NewTailBuffer(max int) *TailBuffer { return &TailBuffer{max: max} }

type TailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *TailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *TailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

// awaitHello waits for the agent's hello on c and checks its protocol
// version; stderr is the agent's, quoted when it exits or stays silent.
func AwaitHello(ctx context.Context, c *Conn, stderr *TailBuffer) (agent.Hello, error) {
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case h := <-c.Hello:
		if h.Err != "" {
			return h, fmt.Errorf("%w: agent start-up: %s", ErrInvalid, h.Err)
		}
		if h.Version != agent.ProtocolVersion {
			return h, fmt.Errorf("%w: agent protocol %d, want %d (stale rollout-agent binary?)", ErrInvalid, h.Version, agent.ProtocolVersion)
		}
		return h, nil
	case <-c.done:
		return agent.Hello{}, fmt.Errorf("%w: agent exited before its hello: %s", ErrUnavailable, stderr.String())
	case <-t.C:
		return agent.Hello{}, fmt.Errorf("%w: no hello from the agent within 30s: %s", ErrUnavailable, stderr.String())
	case <-ctx.Done():
		return agent.Hello{}, ctx.Err()
	}
}

// Done is closed when the connection is broken or closed: a backend
// watches it to learn that its sandbox's channel is gone.
func (c *Conn) Done() <-chan struct{} { return c.done }
