package runner

import (
	"context"
	"log/slog"
	"slices"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/tools"
)

// episode is what a driver is given for one rollout: its group, its
// sandbox (nil when the task has none), the tools' runtime and set.
type episode struct {
	gr  *groupRun
	sb  sandbox.Sandbox
	rt  *tools.Runtime
	set *tools.Set
	// sess is the rollout's env-server session (envs.Sessioned), or nil.
	sess envs.Session
	log  *slog.Logger
}

// driver drives one rollout's episode, the part between the sandbox and
// the reward: rollout's own agent loop, or an outside harness against a
// gateway session. It fills ro.Result (the reward's Outcome is built from
// it), ro.Session and ro.Timings; a non-nil error is an infrastructure
// failure of kind. Model misbehaviour is never an error: it is
// ro.Result's stop reason.
type driver interface {
	drive(ctx context.Context, ep episode, ro *Rollout) (kind string, err error)
}

// driverFor picks the task's driver.
func (r *Runner) driverFor(t envs.Task) driver {
	if t.Harness != nil {
		return harnessDriver{r: r}
	}
	return loopDriver{r: r}
}

// loopDriver runs rollout's own agent loop.
type loopDriver struct{ r *Runner }

func (d loopDriver) drive(ctx context.Context, ep episode, ro *Rollout) (string, error) {
	r := d.r
	lcfg := r.loopConfig(ep.gr, ro.ID, ep.set)
	if ep.sess != nil {
		lcfg.Messages = append(slices.Clip(lcfg.Messages), ep.sess.Opening()...)
		lcfg.Responder = ep.sess.Responder()
	}
	res, err := agentloop.Run(ctx, lcfg, agentloop.Deps{Policy: r.deps.Policy, Runtime: ep.rt, Logger: ep.log})
	ro.Result = res
	for _, t := range res.Turns {
		ro.Timings.Generation += t.Generation
		ro.Timings.Tools += t.Tools
	}
	return r.checkEpisode(ctx, ep.gr, ro, err)
}
