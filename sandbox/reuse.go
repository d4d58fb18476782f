package sandbox

// Reset in place (PoolOptions.Reuse). A sandbox with a read-only root can
// only write to its tmpfs mounts, /dev/mqueue and its IPC namespace, all of
// which the agent can empty (agent.OpReset). Instead of removing such a
// sandbox when its holder closes it and creating a new container for the
// next rollout of the same spec, the pool asks the agent to reset it and
// hands the same container out again under a new handle. The previous
// holder's handle stays closed: its calls not yet sent are refused, the
// ones under way are waited for (after a kill of every process) before the
// reset starts. Any failure or doubt removes the container as before.
// docs/security.md ("Reuse") says why this keeps the isolation between
// rollouts.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/rollout-rl/rollout/sandbox/agent"
)

// resetTimeout bounds a whole reset in place; past it the container is
// removed instead.
const resetTimeout = 15 * time.Second

// resetter is a warmable the pool can reset in place for its next holder.
type Resetter interface {
	Warmable
	// onClose installs fn, which Close runs first: when fn returns true
	// the container belongs to a new holder and Close removes nothing.
	OnClose(fn func(ctx context.Context) bool)
	// resetInPlace returns the container to the state of a fresh sandbox
	// of spec and returns the new holder's handle; spec's files are not
	// placed (the pool places the next holder's at hand-out). The receiver
	// is closed (its Close is under way) and stays closed.
	ResetInPlace(ctx context.Context, spec Spec) (Warmable, error)
	// resets is how many times the container was reset so far.
	Resets() int
}

// resetAgent is the agent's side of a reset in place, the same for every
// backend: the previous holder's gate is shut (its calls under way are
// stopped by killing every process, then waited for), and the agent
// empties paths, kills what is left and clears IPC.
func ResetAgent(ctx context.Context, o *ChannelOps, short string, paths []string) (*agent.ResetResult, error) {
	if err := o.Conn.Broken(); err != nil {
		return nil, fmt.Errorf("reset sandbox %s: %w: %v", short, ErrUnavailable, err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resetTimeout)
	defer cancel()
	if pending, idle := o.calls.close(); pending > 0 {
		// The previous holder still has calls under way (a command, a
		// wait): stop every process so that they return.
		if _, err := o.Conn.roundTrip(ctx, agent.Request{Op: agent.OpKillAll}, nil, nil); err != nil {
			return nil, fmt.Errorf("reset sandbox %s: stop the previous holder's processes: %w", short, err)
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return nil, fmt.Errorf("reset sandbox %s: %d calls of the previous holder did not return: %w", short, pending, ctx.Err())
		}
	}
	resp, err := o.Conn.roundTrip(ctx, agent.Request{Op: agent.OpReset, Paths: paths, TimeoutNS: int64(resetTimeout * 2 / 3)}, nil, nil)
	if err == nil {
		err = responseError("reset", resp)
	}
	if err == nil && resp.Reset == nil {
		err = fmt.Errorf("%w: agent sent no reset result", ErrUnavailable)
	}
	if err != nil {
		return nil, fmt.Errorf("reset sandbox %s: %w", short, err)
	}
	return resp.Reset, nil
}

func LogReset(log *slog.Logger, count int, res *agent.ResetResult) {
	log.Debug("sandbox reset in place", "resets", count, "killed", res.Killed,
		"removed", res.Removed, "ipc", res.IPC, "agent_ms", float64(res.DurationNS)/1e6)
}

// spareKey files a reset sandbox: it serves only the scope whose rollout
// used it, and specs of that reuseKey.
type spareKey struct {
	scope    *PoolScope
	reuseKey string
}

// reusable says whether sandboxes of spec acquired through sc are reset in
// place by p.
func (p *Pool) reusable(spec Spec, sc *PoolScope) bool {
	return p.opts.Reuse && sc.opts.Reuse && spec.Limits.ReadOnlyRoot && (spec.Runtime == "" || spec.Runtime == RuntimeRunc)
}

// hook makes sb's Close hand the container back to sc's spares for ws
// after a reset in place, when sc reuses sandboxes of ws's spec. Until
// then it counts as returning (unless it has no use left), so that demand
// announced meanwhile does not start containers it will serve.
func (p *Pool) hook(sb Warmable, ws *WarmSet, sc *PoolScope) {
	if !p.reusable(ws.spec, sc) {
		return
	}
	r, ok := sb.(Resetter)
	if !ok {
		return
	}
	counted := r.Resets() < p.opts.MaxUses
	if counted {
		p.mu.Lock()
		p.returning[spareKey{sc, ws.reuseKey}]++
		p.mu.Unlock()
	}
	r.OnClose(func(ctx context.Context) bool { return p.recycle(ctx, ws, sc, r, counted) })
}

// reuseKey identifies the specs a reset sandbox can serve: everything but
// Files (placed at hand-out) and Labels. ws.spec is validated.
func reuseKey(ws *WarmSet) string {
	spec := ws.spec
	spec.Files = nil
	k, err := fingerprint(spec)
	if err != nil {
		return ws.key // never shared: the set's own key
	}
	return k
}

// coverLocked is how much of ws's demand in sc the scope's spares and
// held sandboxes of ws's reuseKey serve (refillLocked). Every set of sc
// with that key (specs that differ only in files or labels) draws on the
// same sandboxes, in key order, so that none stands for two sets' demand.
func (p *Pool) coverLocked(ws *WarmSet, sc *PoolScope) int {
	k := spareKey{sc, ws.reuseKey}
	left := len(p.spares[k]) + p.returning[k]
	for o := range sc.demanding[ws.reuseKey] {
		if o.key < ws.key {
			left -= o.demand[sc]
		}
	}
	return min(max(left, 0), ws.demand[sc])
}

// popSpareLocked takes a healthy reset sandbox of sc that can serve ws's
// spec.
func (p *Pool) popSpareLocked(ws *WarmSet, sc *PoolScope) Warmable {
	if !p.reusable(ws.spec, sc) {
		return nil
	}
	k := spareKey{sc, ws.reuseKey}
	q := p.spares[k]
	sb := p.popHealthyLocked(&q)
	if len(q) == 0 {
		delete(p.spares, k)
	} else {
		p.spares[k] = q
	}
	return sb
}

// placeFiles writes a spec's files into a sandbox before hand-out.
func PlaceFiles(ctx context.Context, sb Sandbox, files []File) error {
	for _, f := range files {
		if err := sb.WriteFile(ctx, f.Path, f.Data, f.Mode); err != nil {
			return fmt.Errorf("place %s: %w", f.Path, err)
		}
	}
	return nil
}

// recycle resets r in place and keeps it as a spare for sc's next Acquire
// of a spec like ws's (files aside). It returns false when the container
// should be removed instead: the pool or the scope is closed, the
// container was reset MaxUses times, or the reset failed. counted says
// that hook counted r as returning: recycle settles that count, with the
// spare when there is one, and otherwise starts what the scope's demand
// (of any spec r could have served) now lacks.
func (p *Pool) recycle(ctx context.Context, ws *WarmSet, sc *PoolScope, r Resetter, counted bool) bool {
	k := spareKey{sc, ws.reuseKey}
	settled := !counted
	settleLocked := func(kept bool) {
		if settled {
			return
		}
		settled = true
		if p.returning[k]--; p.returning[k] <= 0 {
			delete(p.returning, k)
		}
		if !kept && !p.closed && !sc.closed {
			// It may have stood for demand of any spec it could serve.
			for _, o := range p.sets {
				if o.reuseKey == ws.reuseKey {
					p.refillLocked(o)
				}
			}
		}
	}
	// Every way out without a spare settles here.
	defer func() {
		if !settled {
			p.mu.Lock()
			settleLocked(false)
			p.mu.Unlock()
		}
	}()
	if r.Resets() >= p.opts.MaxUses || r.Broken() != nil {
		return false
	}
	p.mu.Lock()
	closed := p.closed || sc.closed
	p.mu.Unlock()
	if closed {
		return false
	}
	bare := ws.spec
	bare.Files = nil // the next holder's go in at hand-out
	fresh, err := r.ResetInPlace(ctx, bare)
	if err != nil {
		metricResets.WithLabelValues("failed").Inc()
		p.resetsFailed.Add(1)
		if !errors.Is(err, ErrClosed) {
			p.d.Logger().Warn("warm pool: reset in place failed, removing the sandbox", "image", ws.spec.Image, "err", err)
		}
		return false
	}
	metricResets.WithLabelValues("ok").Inc()
	p.resetsOK.Add(1)
	p.mu.Lock()
	if !p.closed && !sc.closed && p.idle >= p.opts.MaxIdle {
		// The spare serves the scope's next rollout of any task; a
		// never-used sandbox no one announced serves no one: it goes.
		if surplus := p.surplusReadyLocked(); surplus != nil {
			p.wg.Go(func() { _ = surplus.Close(context.WithoutCancel(ctx)) })
		}
	}
	if p.closed || sc.closed || p.idle >= p.opts.MaxIdle {
		// Settled before the removal, which can take long.
		settleLocked(false)
		p.mu.Unlock()
		_ = fresh.Close(ctx)
		return true
	}
	defer p.mu.Unlock()
	defer p.changedLocked()
	settleLocked(true)
	fresh.SetPooled(true)
	p.spares[k] = append(p.spares[k], fresh)
	p.idle++
	return true
}
