// Package simtest starts the in-process vLLM simulator for a test and
// stops it when the test ends.
package simtest

import (
	"context"
	"testing"

	"github.com/rollout-rl/rollout/inference/sim"
)

// Start starts the simulator with cfg; it is closed at the end of t.
func Start(t testing.TB, cfg sim.Config) *sim.Server {
	t.Helper()
	srv, err := sim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start simulator: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}
