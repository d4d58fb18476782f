package docker

import (
	"context"
	"fmt"
	"github.com/rollout-rl/rollout/sandbox"
	"time"
)

var _ sandbox.Resetter = (*dockerSandbox)(nil)

func (s *dockerSandbox) OnClose(fn func(ctx context.Context) bool) { s.recycle = fn }

func (s *dockerSandbox) Resets() int { return s.resetCount }

// writableMounts are the places a read-only-root container's user can
// write to: the backend's tmpfs mounts and the engine's /dev/shm and
// /dev/mqueue.
func (s *dockerSandbox) writableMounts() []string {
	return []string{"/tmp", s.Hello.Workdir, "/dev/shm", "/dev/mqueue"}
}

func (s *dockerSandbox) ResetInPlace(ctx context.Context, spec sandbox.Spec) (sandbox.Warmable, error) {
	if !s.spec.Limits.ReadOnlyRoot || (s.spec.Runtime != "" && s.spec.Runtime != sandbox.RuntimeRunc) {
		return nil, fmt.Errorf("reset sandbox %s: %w: only a read-only root under runc can be reset in place", s.Short(), sandbox.ErrInvalid)
	}
	res, err := sandbox.ResetAgent(ctx, &s.ChannelOps, s.Short(), s.writableMounts())
	if err != nil {
		return nil, err
	}
	ns := &dockerSandbox{d: s.d, id: s.id, name: s.name, spec: spec, imageID: s.imageID, hj: s.hj, demux: s.demux,
		attach: s.attach, sock: s.sock, stderr: s.stderr, Hello: s.Hello, created: time.Now(), log: s.log,
		applied: s.applied, upperDir: s.upperDir, resetCount: s.resetCount + 1}
	ns.Bind(ns.Short(), ns.broken)
	ns.ChannelOps = sandbox.NewChannelOps(s.Conn, ns)
	ns.Touch()
	s.d.mu.Lock()
	if s.d.closed {
		s.d.mu.Unlock()
		return nil, fmt.Errorf("reset sandbox %s: %w: backend closed", s.Short(), sandbox.ErrClosed)
	}
	// From here the new handle owns the container and its slot: on failure
	// its Close removes both, and the previous handle's Close finds nothing
	// left to release.
	s.d.live[s.id] = ns
	s.d.mu.Unlock()
	sandbox.LogReset(s.log, ns.resetCount, res)
	return ns, nil
}
