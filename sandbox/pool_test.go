package sandbox

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gatedWarm is a warm sandbox whose Close returns only once every one of
// the pool's sandboxes is being closed (or after a minute, which fails the
// test): Pool.Close must remove them concurrently, not one after the other.
type gatedWarm struct {
	Warmable // nil: Pool.Close calls only Close
	gate     *closeGate
}

type closeGate struct {
	total, inFlight, peak atomic.Int32
	once                  sync.Once
	all                   chan struct{}
}

func (g *gatedWarm) Close(ctx context.Context) error {
	n := g.gate.inFlight.Add(1)
	for {
		p := g.gate.peak.Load()
		if n <= p || g.gate.peak.CompareAndSwap(p, n) {
			break
		}
	}
	if n == g.gate.total.Load() {
		g.gate.once.Do(func() { close(g.gate.all) })
	}
	defer g.gate.inFlight.Add(-1)
	select {
	case <-g.gate.all:
		return nil
	case <-time.After(time.Minute):
		return errors.New("closed alone")
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestPoolCloseConcurrent(t *testing.T) {
	p := NewPool(nil, PoolOptions{})
	const n = 8
	gate := &closeGate{all: make(chan struct{})}
	gate.total.Store(n)
	ws := &WarmSet{key: "k"}
	for range n {
		ws.ready = append(ws.ready, &gatedWarm{gate: gate})
	}
	p.sets["k"] = ws
	p.idle = n
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v (at most %d of %d sandboxes were being closed at once)", err, gate.peak.Load(), n)
	}
	if got := gate.peak.Load(); got != n {
		t.Fatalf("peak concurrent closes %d, want %d", got, n)
	}
	if len(ws.ready) != 0 || p.idle != 0 {
		t.Fatalf("after Close: %d ready, idle %d", len(ws.ready), p.idle)
	}
}
