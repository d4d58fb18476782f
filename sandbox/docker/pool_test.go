package docker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

// eventually polls cond (no timing assertion: it only bounds a hang).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPool(t *testing.T) {
	d := needDocker(t)
	ctx := context.Background()
	p := sandbox.NewPool(d, sandbox.PoolOptions{})
	spec := sandbox.Spec{Image: sandboxtest.Image, Env: map[string]string{"POOL": "1"}}
	if err := p.Warm(spec, 2); err != nil {
		t.Fatal(err)
	}
	eventually(t, "2 warm sandboxes", func() bool { return p.Ready(spec) == 2 })

	labelled := spec
	labelled.Labels = map[string]string{sandbox.LabelRollout: "r-7"}
	s, err := p.Acquire(ctx, labelled)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.(sandbox.Labeler).Labels()[sandbox.LabelRollout]; got != "r-7" {
		t.Errorf("acquired sandbox labels: %q", got)
	}
	r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "echo $POOL"})
	if err != nil || string(r.Stdout) != "1\n" {
		t.Fatalf("pooled sandbox: %q %v", r.Stdout, err)
	}
	// The pool refills to its base size.
	eventually(t, "refill to 2", func() bool { return p.Ready(spec) == 2 })

	// A GRPO group: announce G, acquire G at once.
	const g = 4
	if err := p.Expect(spec, g); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	got := make(chan sandbox.Sandbox, g)
	for range g {
		wg.Go(func() {
			sb, err := p.Acquire(ctx, spec)
			if err != nil {
				t.Error(err)
				return
			}
			got <- sb
		})
	}
	wg.Wait()
	close(got)
	ids := map[string]bool{s.ID(): true}
	for sb := range got {
		if ids[sb.ID()] {
			t.Errorf("sandbox %s handed out twice", sb.ID())
		}
		ids[sb.ID()] = true
		if err := sb.Close(ctx); err != nil {
			t.Error(err)
		}
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// A different spec is a different warm set.
	if p.Ready(sandbox.Spec{Image: sandboxtest.Image}) != 0 {
		t.Error("unrelated spec has warm sandboxes")
	}
	if err := p.Warm(sandbox.Spec{Image: sandboxtest.Image, Network: "bogus"}, 1); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("bad spec: %v", err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Acquire(ctx, spec); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("acquire after close: %v", err)
	}
	res, err := d.Client().ContainerList(ctx, client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", sandbox.LabelInstance+"="+d.Instance()).Add("label", sandbox.LabelPool)})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Items) != 0 {
		t.Fatalf("%d pool containers left after Close", len(res.Items))
	}
}

func TestReaper(t *testing.T) {
	d := needDocker(t)
	ctx := context.Background()
	// A backend whose process "died": its pid label names no live process.
	dead, err := newDocker(d.cli, Options{Options: host.Options{Instance: "dead-" + sandbox.RandomID(4), ReapInterval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	dead.labels[sandbox.LabelPID] = "2147480000"
	if dead.sockRoot != "" {
		// Never closed (it "died"): its socket-channel directory goes here.
		t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(dead.sockRoot, dead.opts.Instance)) })
	}
	orphan, err := dead.create(ctx, sandbox.Spec{Image: sandboxtest.Image}, nil, sandbox.SlotWait)
	if err != nil {
		t.Fatal(err)
	}
	// The attach connections stay open until after the reap: closed, they
	// would let the engine remove the containers by itself (owner binding,
	// sandbox/host/owner.go), and the reaper is the second line for what it could not
	// remove (an engine down while the owner died, a create never started).

	// A container of our own instance that we do not track (a create whose
	// answer was lost).
	own, err := newDocker(d.cli, Options{Options: host.Options{Instance: d.Instance(), ReapInterval: -1, LeakGrace: time.Nanosecond}})
	if err != nil {
		t.Fatal(err)
	}
	leaked, err := own.create(ctx, sandbox.Spec{Image: sandboxtest.Image}, nil, sandbox.SlotWait)
	if err != nil {
		t.Fatal(err)
	}
	live := newSandbox(t, sandbox.Spec{})

	own.live = map[string]*dockerSandbox{live.ID(): nil}
	removed, err := own.Reap(ctx, sandbox.ReapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*dockerSandbox{orphan, leaked} {
		s.hj.Close()
		<-s.demux
	}
	reasons := map[string]string{}
	for _, r := range removed {
		reasons[r.ID] = r.Reason
	}
	if reasons[leaked.id] != "leaked" {
		t.Fatalf("reaped %v; want leaked %s", reasons, leaked.id[:12])
	}
	if reasons[orphan.id] != "orphan" {
		// go test runs packages in parallel, and a backend of another test
		// process reaps at start-up with the same rule: it may have removed
		// the orphan first. Either way it must be gone.
		if _, err := d.cli.ContainerInspect(ctx, orphan.id, client.ContainerInspectOptions{}); !isNotFound(err) {
			t.Fatalf("reaped %v; orphan %s neither reaped as orphan nor gone (inspect: %v)", reasons, orphan.id[:12], err)
		}
	}
	if _, ok := reasons[live.ID()]; ok {
		t.Fatal("reaper removed a live sandbox")
	}
	for _, id := range []string{orphan.id, leaked.id} {
		if _, err := d.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{}); err == nil {
			t.Errorf("container %s still exists", id[:12])
		}
	}
	if r, err := live.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("live sandbox hurt by the reaper: %v", err)
	}
}

func TestIdleAndLifetimeLimits(t *testing.T) {
	needDocker(t)
	ctx := context.Background()
	d, err := New(ctx, Options{Options: host.Options{Instance: "limits-" + sandbox.RandomID(4), ReapInterval: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(ctx)
	idle, err := d.Create(ctx, sandbox.Spec{Image: sandboxtest.Image, Limits: sandbox.Limits{IdleTimeout: 300 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	old, err := d.Create(ctx, sandbox.Spec{Image: sandboxtest.Image, Limits: sandbox.Limits{MaxLifetime: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []sandbox.Sandbox{idle, old} {
		eventually(t, "reaper closes the sandbox", func() bool {
			return s.(*dockerSandbox).Closing.Load()
		})
		_, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
		if !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("exec after limit: %v, want ErrClosed", err)
		}
	}
}
