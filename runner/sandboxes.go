package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/sandbox"
)

// sandboxSpec is the group's sandbox spec. The first rollout computes it
// (building the task image, which hashes the whole build context) and the
// others reuse it; a failure is not kept, so a retry tries again.
func (gr *groupRun) sandboxSpec(ctx context.Context, r *Runner) (sandbox.Spec, string, error) {
	gr.specMu.Lock()
	defer gr.specMu.Unlock()
	if gr.spec != nil {
		return *gr.spec, "", nil
	}
	spec, kind, err := r.sandboxSpec(ctx, gr.task)
	if err != nil {
		return spec, kind, err
	}
	gr.spec = &spec
	return spec, "", nil
}

// expectSandboxes tells a pooling backend that a group is about to create
// n sandboxes of the task's spec, so it starts them all at once while the
// group sets up. Errors are left to the rollouts, which meet them again
// and record them.
func (r *Runner) expectSandboxes(ctx context.Context, gr *groupRun, n int) {
	ex, ok := r.deps.Sandboxes.(Expecter)
	if !ok || gr.task.Sandbox == nil {
		return
	}
	spec, _, err := gr.sandboxSpec(ctx, r)
	if err != nil {
		return
	}
	if err := ex.Expect(spec, n); err != nil {
		r.log.Debug("warm pool: expect failed", "err", err)
	}
}

// sandboxSpec is the spec of the task's sandbox with the run's overrides,
// building the task image when needed.
func (r *Runner) sandboxSpec(ctx context.Context, task envs.Task) (sandbox.Spec, string, error) {
	spec := *task.Sandbox
	if task.Build != nil {
		if r.deps.Images == nil {
			return spec, FailImageBuild, errors.New("this task needs an image build and the runner has no image builder")
		}
		img, err := r.deps.Images.BuildTask(ctx, *task.Build)
		if err != nil {
			return spec, FailImageBuild, err
		}
		spec.Image = img
	}
	c := r.cfg.Sandbox
	if c.Image != "" && task.Build == nil {
		spec.Image = c.Image
	}
	if c.Network != "" {
		spec.Network = c.Network
	}
	if c.MemoryMB > 0 {
		spec.Limits.MemoryBytes = c.MemoryMB << 20
	}
	if c.CPUs > 0 {
		spec.Limits.CPUs = c.CPUs
	}
	if c.PIDs > 0 {
		spec.Limits.PIDs = c.PIDs
	}
	if c.DiskMB > 0 {
		spec.Limits.DiskBytes = c.DiskMB << 20
	}
	if c.ReadOnlyRoot {
		spec.Limits.ReadOnlyRoot = true
	}
	if c.Runtime != "" {
		spec.Runtime = c.Runtime
	}
	if spec.Image == "" {
		return spec, FailTask, errors.New("no sandbox image: set sandbox.image in the run config or the env's image")
	}
	if c.Backend == sandbox.BackendKubernetes && spec.Limits.PIDs > 0 {
		// The run config's sandbox.pids is refused before the run; this is
		// the env's own (its sandbox block), which no pod can be held to.
		return spec, FailTask, fmt.Errorf("the env's sandbox pids %d: %s: remove pids from the env's sandbox block", spec.Limits.PIDs, kubernetesPIDsUnenforced)
	}
	return spec, "", nil
}

// openSandbox creates the rollout's sandbox under the sandbox limit.
func (r *Runner) openSandbox(ctx context.Context, gr *groupRun, ro *Rollout) (sandbox.Sandbox, string, error) {
	if r.deps.Sandboxes == nil {
		return nil, FailSandbox, errors.New("this task needs a sandbox and the runner has no sandbox backend")
	}
	spec, kind, err := gr.sandboxSpec(ctx, r)
	if err != nil {
		return nil, kind, err
	}
	spec.Labels = map[string]string{sandbox.LabelRun: r.info.RunID, sandbox.LabelRollout: ro.ID}
	ro.Image, ro.Limits, ro.Network, ro.Runtime = spec.Image, spec.Limits, spec.Network, spec.Runtime
	if err := r.boxes.Acquire(ctx, 1); err != nil {
		return nil, FailCancelled, err
	}
	t0 := time.Now()
	sb, err := r.deps.Sandboxes.Create(ctx, spec)
	ro.Timings.SandboxStart = time.Since(t0)
	if err != nil {
		r.boxes.Release(1)
		if ctx.Err() != nil {
			return nil, FailCancelled, err
		}
		// A bad spec (a missing image, impossible limits) fails the same
		// way every time: never retried.
		ro.deterministic = errors.Is(err, sandbox.ErrInvalid)
		return nil, FailSandbox, err
	}
	if im, ok := sb.(sandbox.ImageIdentifier); ok {
		ro.ImageID = im.ImageID()
	}
	// The manifest records what the container got, not what was asked.
	if lr, ok := sb.(sandbox.LimitsReporter); ok {
		a := lr.Applied()
		ro.Limits.MemoryBytes, ro.Limits.CPUs, ro.Limits.PIDs = a.MemoryBytes, a.CPUs, a.PIDs
		ro.Limits.DiskBytes, ro.Limits.ReadOnlyRoot = a.DiskBytes, a.ReadOnlyRoot
		ro.Network, ro.Runtime, ro.Backend = a.Network, a.Runtime, a.Backend
	}
	return sb, "", nil
}
