package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/tools"
)

// Stopping is closed once intake stops (StopIntake): the run is finishing
// its in-flight groups. A caller watching the run's endpoints uses it to
// stop waiting for dead ones.
func (r *Runner) Stopping() <-chan struct{} { return r.intakeStop }

// Policy is the run's policy (Deps.Policy).
func (r *Runner) Policy() inference.Policy { return r.deps.Policy }

// Preflight checks, before any generation, what only a task can tell about
// the config: the first item's task is built and its tool set resolved, and
// a tokens-mode backend offering tools needs a tool-call parser. Errors wrap
// ErrConfig. A task the env cannot build is left to the run, which records
// it as that item's failure. Run calls it too (once); job.Open calls it
// early so that a job is refused before it starts.
func (r *Runner) Preflight(ctx context.Context) error {
	_, err := r.runItems(ctx)
	return err
}

// runItems is Items plus the preflight, both done once per Runner.
func (r *Runner) runItems(ctx context.Context) ([]datasets.Item, error) {
	r.preMu.Lock()
	defer r.preMu.Unlock()
	if r.preDone {
		return r.preItems, nil
	}
	items, err := r.Items(ctx)
	if err != nil {
		return nil, err
	}
	if len(items) > 0 {
		task, terr := r.deps.Env.Task(ctx, items[0])
		if terr == nil {
			if _, err := r.toolSet(task, 0); errors.Is(err, ErrConfig) {
				return nil, err
			} else if err != nil {
				return nil, fmt.Errorf("%w: the tools of item %s: %w", ErrConfig, items[0].Key(), err)
			}
		}
	}
	r.preItems, r.preDone = items, true
	return items, nil
}

// tokensMode reports whether the agent loop parses the model's text: every
// backend but chat (whose server parses) returns raw text.
func (r *Runner) tokensMode() bool {
	b := r.cfg.Inference.Backend
	return b != "" && b != inference.BackendChat
}

// checkParser refuses tools offered in tokens mode without a tool-call
// parser: every call the model makes would be unreadable, and each rollout
// would find out only after spending a generation.
func (r *Runner) checkParser(set *tools.Set) error {
	if set == nil || r.cfg.Parser != "" || !r.tokensMode() {
		return nil
	}
	names := make([]string, 0, 4)
	for _, t := range set.OpenAI() {
		if t.Function != nil && len(names) < 4 {
			names = append(names, t.Function.Name)
		}
	}
	return fmt.Errorf("%w: parser: required: backend %s returns raw text and tools are offered (%s), so a tool-call parser must read the calls (e.g. parser: hermes; `rollout parse --list` names them)",
		ErrConfig, r.cfg.Inference.Backend, strings.Join(names, ", "))
}
