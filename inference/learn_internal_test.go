package inference

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A caller waiting on another's lookup neither inherits that caller's
// cancellation nor outlives its own.
func TestLearnCancellation(t *testing.T) {
	c := &Client{}
	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	started := make(chan struct{})
	leaderDone := make(chan error, 1)
	go func() {
		_, err := c.learn(leaderCtx, "k", func(ctx context.Context) (any, error) {
			close(started)
			<-ctx.Done()
			return nil, ctx.Err()
		})
		leaderDone <- err
	}()
	<-started

	// A follower whose own context ends stops waiting at once.
	fctx, cancelF := context.WithCancel(context.Background())
	cancelF()
	if _, err := c.learn(fctx, "k", func(context.Context) (any, error) { return "never", nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled follower: %v, want context.Canceled", err)
	}

	// A live follower of a leader that is then cancelled gets its own
	// answer (it runs the lookup again), not the leader's cancellation.
	got := make(chan any, 1)
	go func() {
		v, err := c.learn(context.Background(), "k", func(context.Context) (any, error) { return "ok", nil })
		if err != nil {
			v = err
		}
		got <- v
	}()
	time.Sleep(20 * time.Millisecond) // let it join the flight (passes either way)
	cancelLeader()
	if err := <-leaderDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("leader: %v, want context.Canceled", err)
	}
	if v := <-got; v != "ok" {
		t.Fatalf("follower got %v, want ok", v)
	}
}
