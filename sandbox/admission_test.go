package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestCreateGateAdapts(t *testing.T) {
	g := NewCreateGate(8, time.Second)
	now := time.Unix(1000, 0)
	steps := []struct {
		d     time.Duration
		after time.Duration
		want  int
	}{
		{d: 100 * time.Millisecond, want: 8},
		{d: 2 * time.Second, after: 2 * time.Second, want: 4},
		{d: 3 * time.Second, after: 100 * time.Millisecond, want: 4}, // one cut per slow interval
		{d: 3 * time.Second, after: 2 * time.Second, want: 2},
		{d: 3 * time.Second, after: 2 * time.Second, want: 1},
		{d: 3 * time.Second, after: 2 * time.Second, want: 1},
		{d: 10 * time.Millisecond, want: 2},
		{d: 10 * time.Millisecond, want: 3},
	}
	for i, st := range steps {
		now = now.Add(st.after)
		g.mu.Lock()
		g.observeLocked(st.d, now)
		got := g.limit
		g.mu.Unlock()
		if got != st.want {
			t.Fatalf("step %d: limit %d, want %d", i, got, st.want)
		}
	}
}

func TestCreateGateWaitAndCancel(t *testing.T) {
	g := NewCreateGate(1, time.Hour)
	ctx := context.Background()
	if err := g.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := g.Acquire(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled acquire: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- g.Acquire(ctx) }()
	for {
		g.mu.Lock()
		n := len(g.waiters)
		g.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	g.Release(time.Millisecond, true)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	g.Release(time.Millisecond, true)
	if g.inflight != 0 {
		t.Fatalf("inflight %d", g.inflight)
	}
}
