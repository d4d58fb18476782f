package image

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// runIn runs argv in a fresh container of img as user and returns its
// stdout.
func runIn(t *testing.T, cli *client.Client, img, user string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: img, Cmd: argv, User: user, Labels: map[string]string{"io.rollout.test": "sandbox/image"}},
		HostConfig: &container.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		t.Fatalf("create container from %s: %v", img, err)
	}
	defer cli.ContainerRemove(context.WithoutCancel(ctx), c.ID, client.ContainerRemoveOptions{Force: true})
	if _, err := cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatalf("start: %v", err)
	}
	wait := cli.ContainerWait(ctx, c.ID, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	var code int64
	select {
	case r := <-wait.Result:
		code = r.StatusCode
	case err := <-wait.Error:
		t.Fatalf("wait: %v", err)
	}
	logs, err := cli.ContainerLogs(ctx, c.ID, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatalf("logs: %v", err)
	}
	defer logs.Close()
	var stdout, stderr bytes.Buffer
	if _, err := stdcopy.StdCopy(&stdout, &stderr, logs); err != nil {
		t.Fatalf("read logs: %v", err)
	}
	if code != 0 {
		t.Fatalf("%v exited %d: %s%s", argv, code, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// A private copy of the busybox recipe exercises the whole build path
// (missing → built, current → no-op, recipe change → rebuilt, force)
// without touching rollout-sandbox:busybox that other packages use.
func TestEnsureBuildsAndSkips(t *testing.T) {
	cli := newDocker(t)
	if _, err := findBusybox(); err != nil {
		t.Skipf("needs busybox-static on the host: %v", err)
	}
	const name = "busybox-imagetest"
	r := *recipes["busybox"]
	r.name = name
	r.changes = append([]string{}, r.changes...)
	addRecipe(&r)
	ref := Ref(name)
	ctx := t.Context()
	cleanup := func() {
		_, _ = cli.ImageRemove(context.WithoutCancel(ctx), ref, client.ImageRemoveOptions{Force: true, PruneChildren: true})
	}
	cleanup()
	t.Cleanup(func() { delete(recipes, name); cleanup() })

	steps := []struct {
		step       string
		mutate     func()
		force      bool
		wantBuilt  bool
		wantReason string
	}{
		{step: "missing", wantBuilt: true, wantReason: "missing"},
		{step: "unchanged", wantBuilt: false, wantReason: "current"},
		{step: "recipe changed", mutate: func() { r.changes = append(r.changes, "ENV ROLLOUT_TEST=1") }, wantBuilt: true, wantReason: "recipe changed"},
		{step: "unchanged again", wantBuilt: false, wantReason: "current"},
		{step: "forced", force: true, wantBuilt: true, wantReason: "forced"},
	}
	var prevID string
	for _, s := range steps {
		if s.mutate != nil {
			s.mutate()
		}
		res, err := Ensure(ctx, cli, name, Options{Force: s.force})
		if err != nil {
			t.Fatalf("%s: %v", s.step, err)
		}
		if res.Built != s.wantBuilt || res.Reason != s.wantReason {
			t.Fatalf("%s: built=%v reason=%q, want %v %q", s.step, res.Built, res.Reason, s.wantBuilt, s.wantReason)
		}
		st, err := Inspect(ctx, cli, name)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Current() || st.ID != res.ID || st.HaveHash != res.Hash {
			t.Fatalf("%s: state after Ensure = %+v, result %+v", s.step, st, res)
		}
		if res.Built && prevID != "" {
			// The replaced image is gone, not left dangling.
			if _, err := cli.ImageInspect(ctx, prevID); !cerrdefs.IsNotFound(err) {
				t.Errorf("%s: old image %s still present (err %v)", s.step, shortID(prevID), err)
			}
		}
		prevID = res.ID
	}

	// The image is usable: a shell, the agent user, its workspace, /tmp.
	out := runIn(t, cli, ref, "agent", "/bin/sh", "-c", "id -u; id -g; pwd; touch /workspace/f /tmp/g && echo writable; echo $ROLLOUT_TEST")
	if want := "1000\n1000\n/workspace\nwritable\n1\n"; out != want {
		t.Errorf("container output %q, want %q", out, want)
	}
}

func TestEnsureUnknown(t *testing.T) {
	_, err := Ensure(t.Context(), nil, "no-such-image", Options{})
	if !errors.Is(err, ErrUnknownRecipe) {
		t.Fatalf("err = %v, want ErrUnknownRecipe", err)
	}
	if !strings.Contains(err.Error(), "bookworm") {
		t.Errorf("error should list the known recipes: %v", err)
	}
}

func TestEnsureBusybox(t *testing.T) {
	cli := newDocker(t)
	ref, err := EnsureBusybox(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if ref != "rollout-sandbox:busybox" {
		t.Errorf("ref = %q", ref)
	}
	st, err := Inspect(t.Context(), cli, "busybox")
	if err != nil || !st.Current() {
		t.Fatalf("after EnsureBusybox: %+v, %v", st, err)
	}
	if out := runIn(t, cli, ref, "", "/bin/sh", "-c", "echo ok; ls -ld /tmp | cut -c1-10"); out != "ok\ndrwxrwxrwt\n" {
		t.Errorf("output %q", out)
	}
}

// A build that fails or is cancelled half-way leaves the previous image in
// place and no new image behind.
func TestEnsureFailedBuildKeepsOldImage(t *testing.T) {
	cli := newDocker(t)
	if _, err := findBusybox(); err != nil {
		t.Skipf("needs busybox-static on the host: %v", err)
	}
	const name = "busybox-failtest"
	r := *recipes["busybox"]
	r.name = name
	r.changes = append([]string{}, r.changes...)
	addRecipe(&r)
	ref := Ref(name)
	ctx := t.Context()
	t.Cleanup(func() {
		delete(recipes, name)
		_, _ = cli.ImageRemove(context.WithoutCancel(ctx), ref, client.ImageRemoveOptions{Force: true, PruneChildren: true})
	})
	good, err := Ensure(ctx, cli, name, Options{Force: true})
	if err != nil {
		t.Fatal(err)
	}

	boom := errors.New("rootfs tool crashed")
	// Writes the start of a valid rootfs, then fails or waits for
	// cancellation, like mmdebstrap dying mid-way.
	partial := func(fail bool) func(ctx context.Context, w io.Writer, log io.Writer) error {
		return func(ctx context.Context, w io.Writer, _ io.Writer) error {
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(busyboxRootfs(ctx, pw, nil)) }()
			defer pr.Close()
			if _, err := io.CopyN(w, pr, 64<<10); err != nil {
				return err
			}
			if fail {
				return boom
			}
			<-ctx.Done()
			return ctx.Err()
		}
	}
	tests := []struct {
		name    string
		fail    bool
		wantErr error
	}{
		{name: "producer fails", fail: true, wantErr: boom},
		{name: "cancelled", fail: false, wantErr: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.rootfs = partial(tt.fail)
			r.changes = append(r.changes, "ENV STEP="+strings.ReplaceAll(tt.name, " ", "_"))
			bctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if !tt.fail {
				time.AfterFunc(300*time.Millisecond, cancel)
			}
			_, err := Ensure(bctx, cli, name, Options{})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			st, err := Inspect(ctx, cli, name)
			if err != nil {
				t.Fatal(err)
			}
			if !st.Present || st.ID != good.ID {
				t.Errorf("image after failed build: %+v, want the old %s", st, shortID(good.ID))
			}
		})
	}
}

// Concurrent Ensure calls (here goroutines; the lock is a file, so it works
// the same across test binaries) build a missing image once.
func TestEnsureConcurrentBuildsOnce(t *testing.T) {
	cli := newDocker(t)
	if _, err := findBusybox(); err != nil {
		t.Skipf("needs busybox-static on the host: %v", err)
	}
	const name = "busybox-locktest"
	r := *recipes["busybox"]
	r.name = name
	addRecipe(&r)
	ref := Ref(name)
	ctx := t.Context()
	remove := func() {
		_, _ = cli.ImageRemove(context.WithoutCancel(ctx), ref, client.ImageRemoveOptions{Force: true, PruneChildren: true})
	}
	remove()
	t.Cleanup(func() { delete(recipes, name); remove() })

	const n = 4
	results := make([]Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = Ensure(ctx, cli, name, Options{})
		}()
	}
	wg.Wait()
	built := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if results[i].Built {
			built++
		}
		if results[i].ID != results[0].ID {
			t.Errorf("caller %d got image %s, caller 0 %s", i, shortID(results[i].ID), shortID(results[0].ID))
		}
	}
	if built != 1 {
		t.Errorf("%d of %d concurrent callers built the image, want 1", built, n)
	}
}
