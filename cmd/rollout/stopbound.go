package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// runStopGrace bounds how long `rollout run`/`eval` may take to stop
// after SIGINT/SIGTERM: in-flight rollouts are cancelled, finished groups
// written, sandboxes removed; past the grace (or at a second signal) the
// process exits at once. Containers then left behind carry the process's
// pid label and are removed by the next backend's start-up reap or
// `rollout sandbox gc`.
const runStopGrace = 60 * time.Second

// boundStop arms the bound for the run under ctx (cancelled by the first
// signal); call the returned func when the run has returned.
func boundStop(ctx context.Context, log *slog.Logger) func() {
	done := make(chan struct{})
	sigs := make(chan os.Signal, 1)
	go func() {
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(sigs)
		t := time.NewTimer(runStopGrace)
		defer t.Stop()
		select {
		case <-done:
		case <-sigs:
			log.Error("second signal: exiting without waiting for the run to stop")
			os.Exit(130)
		case <-t.C:
			log.Error("the run did not stop within its grace after the signal; exiting", "grace", runStopGrace)
			os.Exit(130)
		}
	}()
	return func() { close(done) }
}
