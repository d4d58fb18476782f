package sandbox

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// HandleState is the state every backend's sandbox handle keeps the same
// way: when it was last used, whether it waits in a warm pool (exempt from
// the idle limit), whether Close began, and why when the backend closed it
// (idle or lifetime limit, disk limit, the pod lost).
type HandleState struct {
	LastUsed atomic.Int64 // unix ns
	Pooled   atomic.Bool
	Closing  atomic.Bool
	Reason   atomic.Value // string
}

func (c *HandleState) Touch()           { c.LastUsed.Store(time.Now().UnixNano()) }
func (c *HandleState) SetPooled(v bool) { c.Pooled.Store(v) }

// IsClosing reports whether Close began (the reapers skip such handles).
func (c *HandleState) IsClosing() bool { return c.Closing.Load() }

// Open is the handle's check before a call: ErrClosed (named by what) once
// Close began, else it marks the handle used.
func (c *HandleState) Open(what string) error {
	if c.Closing.Load() {
		return c.ClosedError(what)
	}
	c.Touch()
	return nil
}

// ClosedError is ErrClosed after prefix, with the backend's reason when it
// gave one.
func (c *HandleState) ClosedError(prefix string) error {
	if r, _ := c.Reason.Load().(string); r != "" {
		return fmt.Errorf("%s: %w (%s)", prefix, ErrClosed, r)
	}
	return fmt.Errorf("%s: %w", prefix, ErrClosed)
}

// Handle is the glue the Docker, runc and Kubernetes sandbox handles share,
// written once so the three classify errors and close alike: the state
// above, the check before each call, the wrapping of a call's error into
// the error classes (ChannelOwner), and a Close body that runs once.
// A backend embeds it and calls Bind before the handle serves a call.
type Handle struct {
	HandleState
	name string
	// broken adds what the backend knows about the sandbox to a channel
	// failure (ErrUnavailable), e.g. the container's exit code; nil adds
	// nothing.
	broken    func(err error) error
	closeOnce sync.Once
	closeErr  error
}

// Bind names the sandbox in errors (its short id or pod name) and sets
// what a broken channel adds to an error (see Handle.broken).
func (h *Handle) Bind(name string, broken func(err error) error) {
	h.name, h.broken = name, broken
}

// Check is ChannelOwner's check before a call: ErrClosed once Close began.
func (h *Handle) Check() error {
	return h.Open("sandbox " + h.name)
}

// Wrap names the call and the sandbox in err. A broken channel after
// Close began is ErrClosed (the close broke it, not the sandbox); before,
// it carries what the backend knows about the sandbox.
func (h *Handle) Wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	prefix := what + " in sandbox " + h.name
	if errors.Is(err, ErrUnavailable) {
		if h.Closing.Load() {
			return h.ClosedError(prefix)
		}
		if h.broken != nil {
			err = h.broken(err)
		}
	}
	return fmt.Errorf("%s: %w", prefix, err)
}

// CloseOnce marks the handle closing and runs release the first time only;
// every call returns release's error, named by the sandbox. Close stays
// idempotent because of it.
func (h *Handle) CloseOnce(release func() error) error {
	h.closeOnce.Do(func() {
		h.Closing.Store(true)
		if err := release(); err != nil {
			h.closeErr = fmt.Errorf("close sandbox %s: %w", h.name, err)
		}
	})
	return h.closeErr
}
