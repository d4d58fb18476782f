package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

// Reap removes labelled containers that no live instance owns: those of
// dead processes on this host, and this backend's own containers it does
// not track (left by a create whose answer was lost) once older than
// LeakGrace.
func (d *Docker) Reap(ctx context.Context, opts sandbox.ReapOptions) ([]sandbox.Reaped, error) {
	d.mu.Lock()
	tracked := make(map[string]bool, len(d.live))
	for id := range d.live {
		tracked[id] = true
	}
	d.mu.Unlock()
	self := map[string]string{sandbox.LabelInstance: d.opts.Instance, sandbox.LabelPID: d.labels[sandbox.LabelPID], sandbox.LabelPIDStart: d.labels[sandbox.LabelPIDStart]}
	return reap(ctx, d.cli, self, tracked, d.opts.LeakGrace, opts, d.removeContainer)
}

// GC removes orphaned sandbox containers of this service (all of them with
// opts.All) using a fresh engine connection.
func GC(ctx context.Context, opts sandbox.ReapOptions) ([]sandbox.Reaped, error) {
	cli, err := dockerclient.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
	}
	defer cli.Close()
	remove := func(ctx context.Context, id string) error {
		_, err := cli.ContainerRemove(context.WithoutCancel(ctx), id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil && !isNotFound(err) {
			return fmt.Errorf("remove container %s: %w: %v", id, sandbox.ErrUnavailable, err)
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
	opts sandbox.ReapOptions, remove func(context.Context, string) error) ([]sandbox.Reaped, error) {
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", sandbox.LabelManaged+"=true")})
	if err != nil {
		return nil, fmt.Errorf("list sandbox containers: %w: %v", sandbox.ErrUnavailable, err)
	}
	hostname, _ := os.Hostname()
	var out []sandbox.Reaped
	var errs []error
	for _, c := range res.Items {
		inst := c.Labels[sandbox.LabelInstance]
		reason := host.ReapReason(c.Labels, tracked[c.ID], time.Unix(c.Created, 0), self, grace, opts, hostname)
		if reason == "" {
			continue
		}
		if err := remove(ctx, c.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		sandbox.MetricReaped.WithLabelValues(reason).Inc()
		name := ""
		if len(c.Names) > 0 {
			name = c.Names[0]
		}
		out = append(out, sandbox.Reaped{ID: c.ID, Name: name, Instance: inst, Reason: reason})
	}
	return out, errors.Join(errs...)
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
		if removed, err := d.Reap(ctx, sandbox.ReapOptions{}); err != nil {
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
	live := make([]host.LiveHandle, 0, len(d.live))
	for _, s := range d.live {
		live = append(live, s)
	}
	d.mu.Unlock()
	host.ExpireLimits(ctx, live, d.log)
}

func isNotFound(err error) bool { return cerrdefs.IsNotFound(err) }
