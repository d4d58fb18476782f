package assemble

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

// Fail fast, one writer per run directory, and the exit policy: what Open
// and Run add around the assembled run (job.go).

var (
	// ErrOutputInUse is wrapped when another writer (a run, an eval, a
	// job, in this process or another) holds the output dir.
	ErrOutputInUse = trajectory.ErrLocked
	// ErrRunFailed is wrapped when a run ended without error but fails the
	// exit policy: no ok rollout, more infra_failed rollouts than
	// max_infra_failed_fraction allows, or more sampled ids without a
	// logprob than inference.max_unscored_share allows. Its rows are
	// written.
	ErrRunFailed = errors.New("run failed")
)

// LockOutput takes the writer lock of a run directory (creating it) for
// owner, e.g. "job nightly-7". Callers that write into the directory before
// Open (the Atropos bridge's spool) take it first and pass it as
// Options.Lock; Open takes it otherwise.
func LockOutput(dir, owner string) (*trajectory.DirLock, error) {
	l, err := trajectory.LockDir(dir, owner)
	if err != nil {
		return nil, fmt.Errorf("output.dir: %w", err)
	}
	return l, nil
}

// Open validates cfg and assembles the job. Nothing is started until Run,
// except the output dir's writer lock, which the job holds until Run
// returns or Close: a second writer of the same directory is refused here
// with an error naming the holder (ErrOutputInUse). Open owns opts.Lock
// from the call on: it is released when Open fails. Outside collect mode it
// also runs the runner's preflight (the first item's task against the
// config: a parser for tools in tokens mode).
func Open(ctx context.Context, cfg runner.Config, opts Options) (*Job, error) {
	lock := opts.Lock
	opts.Lock = nil
	if lock == nil && cfg.Output.Dir != "" {
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		owner := "rollout " + opts.Mode
		if opts.Mode == "" {
			owner = "rollout " + ModeRun
		}
		l, err := LockOutput(cfg.Output.Dir, owner)
		if err != nil {
			return nil, err
		}
		lock = l
	}
	j, err := open(ctx, cfg, opts)
	if err != nil {
		_ = lock.Unlock()
		return nil, err
	}
	j.lock = lock
	if opts.Mode != ModeCollect {
		if err := j.Runner.Preflight(ctx); err != nil {
			_ = j.Close(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return j, nil
}

// endpointChecker is the policy's side of fail-fast (*inference.Client).
type endpointChecker interface {
	Ready(ctx context.Context, wait time.Duration) error
	Watch(ctx context.Context, o inference.WatchOptions) error
}

// Run checks the distillation teacher (and hint judge) and the endpoints
// (each must answer within inference.ready_timeout and serve its model),
// collects every group while
// watching them (a run whose endpoints all stay unreachable for
// inference.unreachable_timeout fails with an error naming them, rather
// than retrying forever), closes the output and the sandbox backend (even
// when the run failed or was cancelled), writes the eval report in eval
// mode, applies the exit policy (ErrRunFailed) and releases the output
// dir's lock.
func (j *Job) Run(ctx context.Context) (runner.Summary, error) {
	defer j.lock.Unlock()
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	failStart := func(err error) (runner.Summary, error) {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer ccancel()
		if cerr := j.Close(cctx); cerr != nil {
			j.opts.Logger.Warn("close after the start check failed", "error", cerr)
		}
		return runner.Summary{}, err
	}
	if err := j.StartCheck(rctx); err != nil {
		return failStart(err)
	}
	if hc, ok := j.Runner.Policy().(endpointChecker); ok {
		wctx, wcancel := context.WithCancel(rctx)
		var wg sync.WaitGroup
		wg.Go(func() {
			err := hc.Watch(wctx, inference.WatchOptions{Stopping: j.Runner.Stopping()})
			if err != nil {
				j.opts.Logger.Error("every inference endpoint is unreachable; stopping the run", "error", err)
				cancel(err)
			}
		})
		defer wg.Wait()
		defer wcancel()
	}
	sum, err := j.run(rctx)
	if cause := context.Cause(rctx); err != nil && ctx.Err() == nil && errors.Is(cause, inference.ErrUnreachable) {
		// The watch stopped the run: say why, not "cancelled".
		err = fmt.Errorf("run stopped: %w", cause)
	}
	if err == nil {
		err = exitPolicy(j.Runner.Config(), sum)
	}
	return sum, err
}

// StartCheck is what Run checks before the first rollout, for callers
// that drive the runner themselves (a collect stream): the distillation
// teacher and hint judge, then the inference endpoints, each must answer
// within inference.ready_timeout and serve its model. A model not served
// or a key refused is a config error (runner.ErrConfig); endpoints that do
// not answer wrap inference.ErrUnreachable.
func (j *Job) StartCheck(ctx context.Context) error {
	if j.teacher != nil {
		// The teacher scores every ok rollout: a wrong model or key would
		// fail them all after their generation and sandbox work.
		wait := j.Runner.Config().Inference.ReadyTimeout
		if err := j.ready(ctx, "the distillation start check", func(ctx context.Context) error { return j.teacher.Ready(ctx, wait) }); err != nil {
			return err
		}
	}
	for _, c := range policyChecks(j.Runner.Policy(), j.Runner.Config().Sampling) {
		if err := j.ready(ctx, c.what, c.check); err != nil {
			return err
		}
	}
	return nil
}

// startCheck is one check of a policy before its first generation.
type startCheck struct {
	what  string // names the check in a cancellation's error
	check func(context.Context) error
}

// policyChecks are the policy's start checks, in order: its endpoints
// answer within inference.ready_timeout and serve the model; then, in
// tokens mode, the chat template is one it can work with (it learns the
// assistant-turn closing on the first turn of every rollout: a template
// it cannot work with would fail them all, each as an infra failure,
// retried).
func policyChecks(p inference.Policy, s inference.Sampling) []startCheck {
	var cs []startCheck
	if hc, ok := p.(endpointChecker); ok {
		cs = append(cs, startCheck{"the inference start check", func(ctx context.Context) error { return hc.Ready(ctx, 0) }})
	}
	if tc, ok := p.(templateChecker); ok {
		cs = append(cs, startCheck{"the chat template start check", func(ctx context.Context) error { return tc.CheckTemplate(ctx, s) }})
	}
	return cs
}

// startError makes a start check's failure a config error when the
// config is what is wrong: a model not served, a key refused, a template
// tokens mode cannot use.
func startError(err error) error {
	if errors.Is(err, inference.ErrModelNotServed) || errors.Is(err, inference.ErrEndpointRefused) || errors.Is(err, inference.ErrTemplate) {
		return fmt.Errorf("%w: %w", runner.ErrConfig, err)
	}
	return err
}

// templateChecker is the policy's tokens-mode template check
// (inference.Client.CheckTemplate).
type templateChecker interface {
	CheckTemplate(ctx context.Context, s inference.Sampling) error
}

// ready runs a start check (what names it in the error of a job
// cancelled meanwhile: intake stopped, it stops waiting at once). A model
// not served or a key refused is a config error.
func (j *Job) ready(ctx context.Context, what string, check func(context.Context) error) error {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-j.Runner.Stopping():
			cancel(fmt.Errorf("cancelled during %s: %w", what, runner.ErrIntakeStopped))
		case <-stop:
		}
	}()
	return startError(check(cctx))
}

// exitPolicy fails a run that produced no ok rollout, whose infra_failed
// share of its rollouts exceeds max_infra_failed_fraction, or whose ok
// rollouts left more than inference.max_unscored_share of their sampled
// ids without a logprob. A
// run that ran no rollout (everything resumed, or no items) passes.
func exitPolicy(cfg runner.Config, sum runner.Summary) error {
	if sum.Rollouts == 0 {
		return nil
	}
	kinds := make([]string, 0, len(sum.FailuresByKind))
	for _, k := range slices.Sorted(maps.Keys(sum.FailuresByKind)) {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, sum.FailuresByKind[k]))
	}
	if sum.RolloutsOK == 0 {
		return fmt.Errorf("%w: no rollout succeeded: all %d infra_failed (%s); the rows are written, see `rollout inspect`",
			ErrRunFailed, sum.Rollouts, strings.Join(kinds, ", "))
	}
	limit := cfg.MaxInfraFailed()
	if frac := float64(sum.InfraFailed) / float64(sum.Rollouts); frac > limit {
		return fmt.Errorf("%w: %d of %d rollouts infra_failed (%.0f%%, above max_infra_failed_fraction %g): %s; the rows are written",
			ErrRunFailed, sum.InfraFailed, sum.Rollouts, 100*frac, limit, strings.Join(kinds, ", "))
	}
	if sum.SampledTokens > 0 {
		limit := cfg.Inference.UnscoredLimit()
		if frac := float64(sum.UnscoredTokens) / float64(sum.SampledTokens); frac > limit {
			return fmt.Errorf("%w: %d of %d sampled tokens have no logprob and were not trained (%.2f%%, above inference.max_unscored_share %g); "+
				"the engine withheld them and its scoring pass did not recover them (docs/real-engines.md, llama.cpp); the rows are written, see `rollout inspect`",
				ErrRunFailed, sum.UnscoredTokens, sum.SampledTokens, 100*frac, limit)
		}
	}
	return nil
}
