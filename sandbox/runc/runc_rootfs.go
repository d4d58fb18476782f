package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/sandbox"
	"golang.org/x/sync/singleflight"
)

// The runc backend's images. The local Docker engine stays the image store
// (`rollout sandbox image build` imports there); the backend unpacks each
// image once per host into a directory named by its content-addressed id,
// the read-only lower layer of every sandbox of that image.

// runcImage is an unpacked image.
type runcImage struct {
	id     string   // sha256:…
	rootfs string   // host directory, never written after unpacking
	user   string   // the image's configured user
	env    []string // the image's configured environment
}

// rootfsCache unpacks images into dir/<id hex>.
type rootfsCache struct {
	dir    string
	cli    *client.Client
	labels map[string]string // on the short-lived export containers, for the reaper

	mu     sync.Mutex
	images map[string]runcImage // by reference
	flight singleflight.Group
}

// get returns ref's unpacked image, unpacking it on first use.
func (c *rootfsCache) get(ctx context.Context, ref string) (runcImage, error) {
	c.mu.Lock()
	img, ok := c.images[ref]
	c.mu.Unlock()
	if ok {
		return img, nil
	}
	v, err, _ := c.flight.Do(ref, func() (any, error) { return c.load(context.WithoutCancel(ctx), ref) })
	if err != nil {
		return runcImage{}, err
	}
	img = v.(runcImage)
	c.mu.Lock()
	c.images[ref] = img
	c.mu.Unlock()
	return img, nil
}

func (c *rootfsCache) load(ctx context.Context, ref string) (runcImage, error) {
	res, err := c.cli.ImageInspect(ctx, ref)
	if cerrdefs.IsNotFound(err) {
		return runcImage{}, fmt.Errorf("%w: image %s is not present in the local engine (build it first, e.g. `rollout sandbox image build`)", sandbox.ErrInvalid, ref)
	}
	if err != nil {
		return runcImage{}, fmt.Errorf("%w: inspect image %s: %v", sandbox.ErrUnavailable, ref, err)
	}
	img := runcImage{id: res.ID}
	if res.Config != nil {
		img.user, img.env = res.Config.User, res.Config.Env
	}
	hex := strings.TrimPrefix(res.ID, "sha256:")
	if hex == "" || strings.ContainsAny(hex, "/.") {
		return runcImage{}, fmt.Errorf("%w: image %s has an unexpected id %q", sandbox.ErrUnavailable, ref, res.ID)
	}
	img.rootfs = filepath.Join(c.dir, hex)
	if fi, err := os.Stat(img.rootfs); err == nil && fi.IsDir() {
		return img, nil
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return runcImage{}, fmt.Errorf("%w: rootfs cache: %v", sandbox.ErrUnavailable, err)
	}
	tmp, err := os.MkdirTemp(c.dir, ".unpack-"+hex[:12]+"-")
	if err != nil {
		return runcImage{}, fmt.Errorf("%w: rootfs cache: %v", sandbox.ErrUnavailable, err)
	}
	defer os.RemoveAll(tmp)
	if err := c.export(ctx, ref, tmp); err != nil {
		return runcImage{}, fmt.Errorf("unpack image %s: %w", ref, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return runcImage{}, fmt.Errorf("%w: rootfs cache: %v", sandbox.ErrUnavailable, err)
	}
	// Another process may have unpacked the same image meanwhile: its
	// directory is as good as ours.
	if err := os.Rename(tmp, img.rootfs); err != nil {
		if fi, serr := os.Stat(img.rootfs); serr != nil || !fi.IsDir() {
			return runcImage{}, fmt.Errorf("%w: rootfs cache: %v", sandbox.ErrUnavailable, err)
		}
	}
	return img, nil
}

// export writes the image's flattened filesystem into dir: a created (never
// started) container of it, exported by the engine and unpacked by tar as
// root, so owners, modes and device nodes are kept.
func (c *rootfsCache) export(ctx context.Context, ref, dir string) error {
	cr, err := c.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		// Imported images have no command; this one never runs.
		Config:     &container.Config{Image: ref, Cmd: []string{"/.rollout-export"}, Labels: c.labels},
		HostConfig: &container.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		return fmt.Errorf("%w: create export container: %v", sandbox.ErrUnavailable, err)
	}
	defer func() {
		_, _ = c.cli.ContainerRemove(context.WithoutCancel(ctx), cr.ID, client.ContainerRemoveOptions{Force: true})
	}()
	rc, err := c.cli.ContainerExport(ctx, cr.ID, client.ContainerExportOptions{})
	if err != nil {
		return fmt.Errorf("%w: export: %v", sandbox.ErrUnavailable, err)
	}
	defer rc.Close()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "tar", "-x", "--numeric-owner", "--same-permissions", "-C", dir, "-f", "-")
	cmd.Stdin, cmd.Stderr = rc, &stderr
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("%w: unpacking an image needs tar on the host: %v", sandbox.ErrInvalid, err)
		}
		return fmt.Errorf("%w: tar: %v: %s", sandbox.ErrUnavailable, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// prune removes the unpacked images whose image the engine no longer has
// and that no mount on this host uses (a sandbox's overlay names its lower
// directory), and returns their ids.
func (c *rootfsCache) prune(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("%w: rootfs cache: %v", sandbox.ErrUnavailable, err)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("%w: read mounts: %v", sandbox.ErrUnavailable, err)
	}
	var pruned []string
	var errs []error
	for _, e := range ents {
		hex := e.Name()
		if !e.IsDir() || strings.HasPrefix(hex, ".") {
			continue
		}
		dir := filepath.Join(c.dir, hex)
		if bytes.Contains(mounts, []byte(dir)) {
			continue
		}
		_, err := c.cli.ImageInspect(ctx, "sha256:"+hex)
		if err == nil {
			continue
		}
		if !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("%w: inspect image %s: %v", sandbox.ErrUnavailable, hex[:12], err))
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		pruned = append(pruned, "sha256:"+hex)
	}
	return pruned, errors.Join(errs...)
}
