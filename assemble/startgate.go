package assemble

import (
	"sync"
	"time"
)

// defaultStartRetry is how long a failed backend start is remembered.
const defaultStartRetry = 5 * time.Second

// startGate runs a start function until it has succeeded once. A failure
// is not kept for good, as sync.Once would: rollout serve's backends are
// shared by every job of the process, and an engine or cluster that was
// unreachable for the first job must not fail every later one until the
// server restarts. For retryAfter after a failure, callers get that error
// at once (no storm of connection attempts against an engine that is
// down); the first caller after it tries again. Concurrent callers wait
// for an attempt under way and share its outcome.
type startGate struct {
	mu         sync.Mutex
	done       bool
	err        error
	failed     time.Time
	retryAfter time.Duration // 0: defaultStartRetry
}

// do runs start unless it has succeeded or failed less than retryAfter
// ago. start must leave nothing half set up when it fails.
func (g *startGate) do(start func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done {
		return nil
	}
	wait := g.retryAfter
	if wait <= 0 {
		wait = defaultStartRetry
	}
	if g.err != nil && time.Since(g.failed) < wait {
		return g.err
	}
	if err := start(); err != nil {
		g.err, g.failed = err, time.Now()
		return err
	}
	g.done, g.err = true, nil
	return nil
}

// hold waits for a start under way and keeps any other from beginning
// until release is called (a Close reading what the start set up).
func (g *startGate) hold() (release func()) {
	g.mu.Lock()
	return g.mu.Unlock
}
