package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
)

// ReapOptions select what Reap removes besides orphans of dead instances on
// this host.
type ReapOptions struct {
	// All removes every container of this service, live instances'
	// included (`rollout sandbox gc --all`).
	All bool
	// OtherHosts also removes containers whose instance ran on another host
	// (a shared engine); their liveness cannot be checked from here.
	OtherHosts bool
}

// Reaped describes one removed container.
type Reaped struct {
	ID       string
	Name     string
	Instance string
	Reason   string // orphan, leaked, all, other-host
}

// Reap removes labelled containers that no live instance owns: those of
// dead processes on this host, and this backend's own containers it does
// not track (left by a create whose answer was lost) once older than
// LeakGrace.
func (d *Docker) Reap(ctx context.Context, opts ReapOptions) ([]Reaped, error) {
	d.mu.Lock()
	tracked := make(map[string]bool, len(d.live))
	for id := range d.live {
		tracked[id] = true
	}
	d.mu.Unlock()
	self := map[string]string{LabelInstance: d.opts.Instance, LabelPID: d.labels[LabelPID], LabelPIDStart: d.labels[LabelPIDStart]}
	return reap(ctx, d.cli, self, tracked, d.opts.LeakGrace, opts, d.removeContainer)
}

// GC removes orphaned sandbox containers of this service (all of them with
// opts.All) using a fresh engine connection.
func GC(ctx context.Context, opts ReapOptions) ([]Reaped, error) {
	cli, err := dockerclient.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer cli.Close()
	remove := func(ctx context.Context, id string) error {
		_, err := cli.ContainerRemove(context.WithoutCancel(ctx), id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil && !isNotFound(err) {
			return fmt.Errorf("remove container %s: %w: %v", id, ErrUnavailable, err)
		}
		return nil
	}
	return reap(ctx, cli, nil, nil, 0, opts, remove)
}

// reap lists the service's containers and removes those opts and the
// liveness rules select. self holds the instance, pid and pid start labels
// of the calling backend (nil for the CLI): only containers with all three
// equal are its own, so two processes reusing an instance name cannot reap
// each other's live sandboxes.
func reap(ctx context.Context, cli *client.Client, self map[string]string, tracked map[string]bool, grace time.Duration,
	opts ReapOptions, remove func(context.Context, string) error) ([]Reaped, error) {
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", LabelManaged+"=true")})
	if err != nil {
		return nil, fmt.Errorf("list sandbox containers: %w: %v", ErrUnavailable, err)
	}
	host, _ := os.Hostname()
	var out []Reaped
	var errs []error
	for _, c := range res.Items {
		inst := c.Labels[LabelInstance]
		reason := reapReason(c.Labels, tracked[c.ID], time.Unix(c.Created, 0), self, grace, opts, host)
		if reason == "" {
			continue
		}
		if err := remove(ctx, c.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		metricReaped.WithLabelValues(reason).Inc()
		name := ""
		if len(c.Names) > 0 {
			name = c.Names[0]
		}
		out = append(out, Reaped{ID: c.ID, Name: name, Instance: inst, Reason: reason})
	}
	return out, errors.Join(errs...)
}

// reapReason says why a sandbox container with these labels, created at
// created, is to be removed ("" keeps it): every one with opts.All; other
// hosts' with opts.OtherHosts; the calling backend's own (self: its
// instance, pid and pid start labels) when it does not track it and it is
// older than grace; any other whose creating process is gone.
func reapReason(labels map[string]string, isTracked bool, created time.Time, self map[string]string, grace time.Duration, opts ReapOptions, host string) string {
	switch {
	case opts.All:
		return "all"
	case labels[LabelHost] != host:
		if opts.OtherHosts {
			return "other-host"
		}
	case self != nil && labels[LabelInstance] == self[LabelInstance] && labels[LabelPID] == self[LabelPID] && labels[LabelPIDStart] == self[LabelPIDStart]:
		if !isTracked && time.Since(created) > grace {
			return "leaked"
		}
	case !alive(labels[LabelPID], labels[LabelPIDStart], labels[LabelBoot]):
		return "orphan"
	}
	return ""
}

// alive reports whether the process that labelled a container still runs
// (same boot, same pid and same start time, so a recycled pid does not
// count). Containers without a boot label (older releases) are judged by
// pid and start time alone.
func alive(pidLabel, startLabel, bootLabel string) bool {
	if bootLabel != "" {
		if b := bootID(); b != "" && b != bootLabel {
			return false
		}
	}
	pid, err := strconv.Atoi(pidLabel)
	if err != nil || pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	return startLabel == "" || pidStart(pid) == startLabel
}

func (d *Docker) reapLoop(ctx context.Context) {
	t := time.NewTicker(d.opts.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.enforceLimits(ctx)
		if removed, err := d.Reap(ctx, ReapOptions{}); err != nil {
			if ctx.Err() == nil {
				d.log.Warn("periodic reap failed", "err", err)
			}
		} else if len(removed) > 0 {
			d.log.Info("reaped sandbox containers", "count", len(removed))
		}
	}
}

// enforceLimits closes sandboxes past their idle or lifetime limit.
func (d *Docker) enforceLimits(ctx context.Context) {
	d.mu.Lock()
	live := make([]liveHandle, 0, len(d.live))
	for _, s := range d.live {
		live = append(live, s)
	}
	d.mu.Unlock()
	expireLimits(ctx, live, d.log)
}

func isNotFound(err error) bool { return cerrdefs.IsNotFound(err) }
