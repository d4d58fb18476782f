package main

import (
	"errors"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/runner"
)

// Exit codes of `rollout run` and `rollout eval` (README, docs/config.md).
const (
	exitConfig      = 2 // invalid config or flags, including a model the endpoints do not serve
	exitRunFailed   = 3 // the run ended, but no rollout succeeded or too many infra-failed (max_infra_failed_fraction)
	exitUnreachable = 4 // the inference endpoints did not answer (at start, or for unreachable_timeout while running)
)

// exitStatus gives a run's error its exit code; other errors exit 1.
func exitStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, runner.ErrConfig):
		return withExitCode(exitConfig, err)
	case errors.Is(err, assemble.ErrRunFailed):
		return withExitCode(exitRunFailed, err)
	case errors.Is(err, inference.ErrUnreachable):
		return withExitCode(exitUnreachable, err)
	}
	return err
}
