package runner

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/tools"
	"github.com/rollout-rl/rollout/tools/mcp"
)

// RunGroup runs the G rollouts of one item concurrently and assembles the
// group. Run calls it for every item; trainer-driven collection calls it
// directly. idx seeds the group's toolset sampling.
func (r *Runner) RunGroup(ctx context.Context, idx int, it datasets.Item, o GroupOptions) *Group {
	return r.runBounded(ctx, idx, it, o)
}

func (r *Runner) runGroupOnce(ctx context.Context, idx int, it datasets.Item, o GroupOptions) *Group {
	g := &Group{ID: it.Key(), Item: it, Rollouts: make([]Rollout, r.cfg.GroupSize), PolicyVersion: o.PolicyVersion, RequestID: o.RequestID, Sequence: -1}
	sampling := r.cfg.Sampling
	if o.Sampling != nil {
		sampling = *o.Sampling
	}
	log := r.log.With("group", g.ID)
	ctx, span := r.startGroup(ctx, it, len(g.Rollouts))
	defer endGroup(span, g)
	gr := o.prepared
	if gr == nil || gr.item.Key() != it.Key() {
		gr = r.newGroupRun(ctx, idx, it)
	}
	gr.sampling, gr.log = sampling, log
	g.Task = gr.task
	wave := r.wave(gr)
	if gr.taskErr == nil && gr.setErr == nil && !gr.expected {
		r.expectSandboxes(ctx, gr, wave)
	}
	var eg errgroup.Group
	eg.SetLimit(max(wave, 1))
	for i := range g.Rollouts {
		eg.Go(func() error {
			g.Rollouts[i] = r.runWithRetries(ctx, gr, i)
			if r.deps.Progress != nil {
				ro := g.Rollouts[i]
				r.deps.Progress(Event{Rollout: &ro, Total: int(r.planned.Load())})
			}
			return nil
		})
	}
	_ = eg.Wait()
	assemble(g, r.cfg.Advantage)
	return g
}

// newGroupRun resolves a group's task and tools.
func (r *Runner) newGroupRun(ctx context.Context, idx int, it datasets.Item) *groupRun {
	gr := &groupRun{idx: uint64(idx), item: it, sampling: r.cfg.Sampling, log: r.log.With("group", it.Key())}
	gr.task, gr.taskErr = r.deps.Env.Task(ctx, it)
	gr.set, gr.setErr = r.toolSet(gr.task, uint64(idx))
	if gr.setErr == nil && gr.set != nil && gr.task.Sandbox == nil {
		gr.setErr = needsSandbox(gr.set)
	}
	gr.mcp = append(slices.Clip(r.cfg.MCPServers), gr.task.MCPServers...)
	if gr.setErr == nil && len(gr.mcp) > 0 {
		if err := mcp.Validate(gr.mcp); err != nil {
			gr.setErr = err
		} else if mcp.NeedsSandbox(gr.mcp) && gr.task.Sandbox == nil {
			gr.setErr = errors.New("mcp_servers: a command (stdio) server runs in the rollout's sandbox, and this task has none")
		}
	}
	return gr
}

// wave is how many of a group's rollouts run at once: a group larger than
// the limits runs in waves, at most as many of its rollouts running (and
// holding goroutines) as the limits allow.
func (r *Runner) wave(gr *groupRun) int {
	wave := min(r.cfg.GroupSize, r.cfg.Limits.RolloutsInFlight)
	if gr.task.Sandbox != nil {
		wave = min(wave, r.cfg.Limits.Sandboxes)
	}
	return wave
}

// prepareAhead resolves the next group while every group slot is busy and
// announces its first wave of sandboxes to a pooling backend (building its
// task image on the way), so that they are started from the run's own
// schedule while the running groups finish, instead of when the group
// starts. The pool never lets warm sandboxes block a running group: they
// count against MaxContainers and idle ones of another spec are evicted
// for a rollout that needs a slot.
func (r *Runner) prepareAhead(ctx context.Context, idx int, it datasets.Item) *groupRun {
	gr := r.newGroupRun(ctx, idx, it)
	if _, ok := r.deps.Sandboxes.(Expecter); !ok || gr.taskErr != nil || gr.setErr != nil {
		return gr
	}
	r.expectSandboxes(ctx, gr, r.wave(gr))
	gr.expected = true
	return gr
}

// runWithRetries runs one rollout slot, retrying infra failures with a
// fresh sandbox and rollout id.
// groupRun is what the rollouts of one group share: the item, its task and
// tool set (or why they could not be made), the sampling parameters, and
// the task's sandbox spec, computed once for the group.
type groupRun struct {
	idx      uint64
	mcp      []mcp.Server // run config's and task's MCP servers
	item     datasets.Item
	task     envs.Task
	taskErr  error
	set      *tools.Set
	setErr   error
	sampling inference.Sampling
	log      *slog.Logger

	specMu sync.Mutex
	spec   *sandbox.Spec // nil until computed; failures are not kept

	expected bool // its sandboxes were announced ahead (prepareAhead)
}
