package assemble

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestStartGate(t *testing.T) {
	down := errors.New("engine down")
	var calls atomic.Int32
	fail := true
	start := func() error {
		calls.Add(1)
		if fail {
			return down
		}
		return nil
	}
	g := &startGate{retryAfter: 50 * time.Millisecond}
	if err := g.do(start); !errors.Is(err, down) {
		t.Fatalf("first start: %v, want %v", err, down)
	}
	// Within the window: the remembered error, no new attempt.
	if err := g.do(start); !errors.Is(err, down) || calls.Load() != 1 {
		t.Fatalf("within the window: err %v after %d attempts, want %v after 1", err, calls.Load(), down)
	}
	time.Sleep(60 * time.Millisecond)
	fail = false
	if err := g.do(start); err != nil || calls.Load() != 2 {
		t.Fatalf("after the window: err %v after %d attempts, want a second, successful one", err, calls.Load())
	}
	// A success is kept for good.
	fail = true
	time.Sleep(60 * time.Millisecond)
	if err := g.do(start); err != nil || calls.Load() != 2 {
		t.Fatalf("after success: err %v after %d attempts, want nil after 2", err, calls.Load())
	}
}

func TestStartGateConcurrentCallersShareOneAttempt(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	g := &startGate{}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			errs <- g.do(func() error {
				calls.Add(1)
				<-release
				return nil
			})
		})
	}
	time.Sleep(20 * time.Millisecond)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d start attempts for 8 concurrent callers, want 1", n)
	}
}
