package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/jsonstream"
	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
)

// API is the part of the Engine API this package uses.
type API interface {
	ImageInspect(ctx context.Context, ref string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	ImageImport(ctx context.Context, src client.ImageImportSource, ref string, opts client.ImageImportOptions) (client.ImageImportResult, error)
	ImageTag(ctx context.Context, opts client.ImageTagOptions) (client.ImageTagResult, error)
	ImageRemove(ctx context.Context, id string, opts client.ImageRemoveOptions) (client.ImageRemoveResult, error)
	ImageBuild(ctx context.Context, buildContext io.Reader, opts client.ImageBuildOptions) (client.ImageBuildResult, error)
}

var _ API = (*client.Client)(nil)

// Options tune Ensure.
type Options struct {
	// Force rebuilds even when the image is current.
	Force bool
	// Log receives the build tools' progress output (mmdebstrap, apt-get);
	// nil discards it.
	Log io.Writer
}

// Result says what Ensure did.
type Result struct {
	Name string
	Ref  string
	ID   string // image ID after Ensure
	Hash string // recipe hash (the image's io.rollout.recipe-hash)
	// Built is false when the image was already current and nothing was
	// done.
	Built bool
	// Reason is why it was (or was not) built: "current", "missing",
	// "recipe changed", "forced".
	Reason   string
	Duration time.Duration
}

// State is a base image as found on the engine, for `rollout doctor`.
type State struct {
	Name, Ref string
	Present   bool
	ID        string
	// HaveHash is the image's label, WantHash the current recipe's hash;
	// WantErr is set when the recipe hash cannot be computed here (e.g.
	// busybox-static missing on this host).
	HaveHash, WantHash string
	WantErr            error
}

// Current reports whether the image exists and matches its recipe.
func (s State) Current() bool { return s.Present && s.WantErr == nil && s.HaveHash == s.WantHash }

// Inspect reports the state of the named base image without changing
// anything.
func Inspect(ctx context.Context, cli API, name string) (State, error) {
	r, err := lookup(name)
	if err != nil {
		return State{}, err
	}
	st := State{Name: name, Ref: Ref(name)}
	st.WantHash, st.WantErr = r.hash(ctx)
	img, err := cli.ImageInspect(ctx, st.Ref)
	switch {
	case cerrdefs.IsNotFound(err):
		return st, nil
	case err != nil:
		return st, fmt.Errorf("inspect image %s: %w", st.Ref, err)
	}
	st.Present, st.ID = true, img.ID
	if img.Config != nil {
		st.HaveHash = img.Config.Labels[LabelRecipeHash]
	}
	return st, nil
}

// Ensure makes the named base image exist and match its recipe, building it
// when it is missing, stale or opts.Force is set. An unchanged recipe costs
// one image inspect. Builds of one image are serialised across processes
// by a lock file, so parallel test binaries build it once.
func Ensure(ctx context.Context, cli API, name string, opts Options) (res Result, err error) {
	start := time.Now()
	defer func() {
		switch {
		case err != nil:
			metricBuilds.WithLabelValues("base", "failed").Inc()
		case res.Built:
			metricBuilds.WithLabelValues("base", "built").Inc()
			metricBuildSeconds.WithLabelValues("base").Observe(res.Duration.Seconds())
		default:
			metricBuilds.WithLabelValues("base", "current").Inc()
		}
	}()
	r, err := lookup(name)
	if err != nil {
		return Result{}, err
	}
	if r.prepare != nil {
		if err := r.prepare(ctx, opts.Log); err != nil {
			return Result{}, fmt.Errorf("image %s: %w", name, err)
		}
	}
	res = Result{Name: name, Ref: Ref(name)}
	if res.Hash, err = r.hash(ctx); err != nil {
		return Result{}, err
	}
	st, err := Inspect(ctx, cli, name)
	if err != nil {
		return Result{}, err
	}
	if !opts.Force && st.Current() {
		res.ID, res.Reason, res.Duration = st.ID, "current", time.Since(start)
		return res, nil
	}

	unlock, err := lockFile(ctx, name)
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	// Another process may have built it while we waited for the lock.
	if st, err = Inspect(ctx, cli, name); err != nil {
		return Result{}, err
	}
	switch {
	case opts.Force:
		res.Reason = "forced"
	case st.Current():
		res.ID, res.Reason, res.Duration = st.ID, "current", time.Since(start)
		return res, nil
	case !st.Present:
		res.Reason = "missing"
	default:
		res.Reason = "recipe changed"
	}

	id, err := buildBase(ctx, cli, r, res.Hash, opts.Log)
	if err != nil {
		return Result{}, fmt.Errorf("build image %s: %w", res.Ref, err)
	}
	if _, err := cli.ImageTag(ctx, client.ImageTagOptions{Source: id, Target: res.Ref}); err != nil {
		return Result{}, fmt.Errorf("tag image %s as %s: %w", id, res.Ref, err)
	}
	if st.Present && st.ID != id {
		// The old image is now untagged; drop it unless a container still
		// uses it (then the engine refuses and it stays, harmlessly).
		_, _ = cli.ImageRemove(context.WithoutCancel(ctx), st.ID, client.ImageRemoveOptions{PruneChildren: true})
	}
	res.ID, res.Built, res.Duration = id, true, time.Since(start)
	slog.InfoContext(ctx, "sandbox base image built", "image", res.Ref, "id", shortID(id), "recipe_hash", res.Hash[:12], "reason", res.Reason, "duration", res.Duration.Round(time.Millisecond))
	return res, nil
}

// EnsureBusybox makes rollout-sandbox:busybox current using the
// environment's Docker engine and returns its reference. It is the quick
// way for tests in other packages to get a real image.
func EnsureBusybox(ctx context.Context) (string, error) {
	cli, err := dockerclient.New(ctx)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	res, err := Ensure(ctx, cli, "busybox", Options{})
	if err != nil {
		return "", err
	}
	return res.Ref, nil
}

// buildBase streams rootfs → user layer → ImageImport and returns the new image
// ID. The image is imported untagged and only tagged by the caller after
// every stage succeeded, so a failed build never replaces a good image.
func buildBase(ctx context.Context, cli API, r *recipe, hash string, log io.Writer) (id string, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	rootR, rootW := io.Pipe()
	layR, layW := io.Pipe()
	rootDone := make(chan error, 1)
	layDone := make(chan error, 1)
	go func() {
		err := r.rootfs(ctx, rootW, log)
		if err != nil {
			cancel()
		}
		rootW.CloseWithError(orEOF(err))
		rootDone <- err
	}()
	go func() {
		err := addUser(rootR, layW, r.layer, r.prune)
		if err != nil {
			cancel()
		}
		// Unblock the rootfs writer when we stop reading early.
		rootR.CloseWithError(orEOF(err))
		layW.CloseWithError(orEOF(err))
		layDone <- err
	}()

	changes := append([]string{}, r.changes...)
	changes = append(changes,
		fmt.Sprintf("LABEL %s=%s", LabelRecipeHash, hash),
		fmt.Sprintf("LABEL %s=%s", LabelRecipe, r.name),
		fmt.Sprintf("LABEL %s=%s", LabelUser, r.layer.User),
	)
	id, importErr := importTar(ctx, cli, layR, changes)
	if importErr != nil {
		cancel()
	}
	layR.CloseWithError(orEOF(importErr))
	rootErr, layErr := <-rootDone, <-layDone

	// Report the root cause: the producer's error explains a truncated
	// upload better than the import's.
	for _, e := range []error{rootErr, layErr, importErr} {
		if e != nil && !errors.Is(e, io.ErrClosedPipe) {
			err = e
			break
		}
	}
	if err == nil && (rootErr != nil || layErr != nil || importErr != nil) {
		err = errors.Join(rootErr, layErr, importErr)
	}
	if err != nil {
		if id != "" {
			_, _ = cli.ImageRemove(context.WithoutCancel(ctx), id, client.ImageRemoveOptions{Force: true})
		}
		return "", err
	}
	if id == "" {
		return "", errors.New("import finished without reporting an image id")
	}
	return id, nil
}

func orEOF(err error) error {
	if err == nil {
		return io.EOF
	}
	return err
}

// importTar sends a rootfs tar to the engine and returns the image ID from
// the progress stream.
func importTar(ctx context.Context, cli API, tarStream io.Reader, changes []string) (string, error) {
	resp, err := cli.ImageImport(ctx, client.ImageImportSource{Source: tarStream, SourceName: "-"}, "", client.ImageImportOptions{Changes: changes})
	if err != nil {
		return "", fmt.Errorf("image import: %w", err)
	}
	defer resp.Close()
	var id string
	dec := json.NewDecoder(resp)
	for {
		var m jsonstream.Message
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return id, fmt.Errorf("image import: read progress: %w", err)
		}
		if m.Error != nil {
			return id, fmt.Errorf("image import: %s", m.Error.Message)
		}
		if strings.HasPrefix(m.Status, "sha256:") {
			id = strings.TrimSpace(m.Status)
		}
	}
	return id, nil
}

func shortID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// lockFile takes an exclusive lock shared by every rollout process on this
// host for the named image, polling so ctx can cancel the wait.
func lockFile(ctx context.Context, name string) (func(), error) {
	p := filepath.Join(os.TempDir(), "rollout-image-"+name+".lock")
	// Read-only is enough for flock and works on a lock file another user
	// created.
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o666)
	if err != nil {
		return nil, fmt.Errorf("open build lock %s: %w", p, err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", p, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for build lock %s: %w", p, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
