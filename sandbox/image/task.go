package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/build"
	"github.com/moby/moby/api/types/jsonstream"
	"github.com/moby/moby/client"
	"golang.org/x/sync/singleflight"
)

// Task image naming and labels.
const (
	// TaskRepository is the repository of task images; the tag is a prefix
	// of the context hash.
	TaskRepository = "rollout-task"
	// LabelContextHash holds the full content hash a task image was built
	// from.
	LabelContextHash = "io.rollout.context-hash"
)

// TaskSpec describes an env's image: a Dockerfile, a build context, or both.
type TaskSpec struct {
	// Dockerfile is the Dockerfile text. When set it replaces any file at
	// DockerfilePath in the context; when empty the context must have one.
	Dockerfile string
	// Context is a build-context directory or a tarball (.tar, optionally
	// gzip-compressed). Empty means the Dockerfile alone. .dockerignore is
	// not applied: the context is sent as it is.
	Context string
	// DockerfilePath is the Dockerfile's path inside the context; default
	// "Dockerfile".
	DockerfilePath string
	// BuildArgs are passed to the build and are part of the hash.
	BuildArgs map[string]string
}

// TaskResult says which image serves a TaskSpec.
type TaskResult struct {
	Ref    string // rollout-task:<hash prefix>
	ID     string
	Hash   string // full content hash
	Cached bool   // an image with this hash existed; nothing was built
	// Shared is true when this call waited for a build another call
	// started.
	Shared   bool
	Duration time.Duration
}

// TaskBuilder builds task images. Share one per process: concurrent Build
// calls for the same content run a single engine build.
type TaskBuilder struct {
	cli API
	// Timeout bounds one engine build; the build is detached from the
	// caller's context because other callers may be waiting for it.
	Timeout time.Duration
	// Log receives the engine's build output; nil discards it.
	Log io.Writer

	group  singleflight.Group
	builds atomic.Int64 // engine builds started, for tests and metrics
}

// NewTaskBuilder returns a builder using cli.
func NewTaskBuilder(cli API) *TaskBuilder {
	return &TaskBuilder{cli: cli, Timeout: 30 * time.Minute}
}

// Build returns the image for spec, building it when no image with the same
// content hash exists. The hash covers the canonical context tar (paths,
// modes, contents, link targets; not mtimes or owners), the Dockerfile path,
// the build args and the IDs of the FROM images, so a rebuilt base image
// means a new task image.
func (b *TaskBuilder) Build(ctx context.Context, spec TaskSpec) (TaskResult, error) {
	start := time.Now()
	if spec.DockerfilePath == "" {
		spec.DockerfilePath = "Dockerfile"
	}
	dfPath := path.Clean(filepath.ToSlash(spec.DockerfilePath))
	if dfPath == "." || dfPath == ".." || strings.HasPrefix(dfPath, "../") || path.IsAbs(dfPath) {
		return TaskResult{}, fmt.Errorf("%w: Dockerfile path %q is outside the context", ErrInvalidContext, spec.DockerfilePath)
	}
	spec.DockerfilePath = dfPath
	if spec.Dockerfile == "" && spec.Context == "" {
		return TaskResult{}, fmt.Errorf("%w: neither a Dockerfile nor a build context given", ErrInvalidContext)
	}

	h := sha256.New()
	dockerfile, err := writeContext(h, spec)
	if err != nil {
		return TaskResult{}, err
	}
	bases, err := fromImages(dockerfile, spec.BuildArgs)
	if err != nil {
		return TaskResult{}, err
	}
	fmt.Fprintf(h, "\ndockerfile=%s\n", spec.DockerfilePath)
	for _, k := range sortedKeys(spec.BuildArgs) {
		fmt.Fprintf(h, "arg %s=%s\n", k, spec.BuildArgs[k])
	}
	for _, base := range bases {
		img, err := b.cli.ImageInspect(ctx, base)
		if cerrdefs.IsNotFound(err) {
			return TaskResult{}, fmt.Errorf("%w: %s (this engine cannot pull; build it first, e.g. `rollout sandbox image build`)", ErrBaseMissing, base)
		}
		if err != nil {
			return TaskResult{}, fmt.Errorf("inspect base image %s: %w", base, err)
		}
		fmt.Fprintf(h, "from %s=%s\n", base, img.ID)
	}
	hash := hex.EncodeToString(h.Sum(nil))
	ref := TaskRepository + ":" + hash[:32]

	ch := b.group.DoChan(hash, func() (any, error) {
		// Detached: the build serves every waiter, not just the first.
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.Timeout)
		defer cancel()
		return b.buildOnce(bctx, spec, hash, ref)
	})
	select {
	case <-ctx.Done():
		return TaskResult{}, fmt.Errorf("build task image %s: %w", ref, ctx.Err())
	case r := <-ch:
		if r.Err != nil {
			metricBuilds.WithLabelValues("task", "failed").Inc()
			return TaskResult{}, r.Err
		}
		res := r.Val.(TaskResult)
		res.Shared = r.Shared
		res.Duration = time.Since(start)
		switch {
		case res.Cached:
			metricBuilds.WithLabelValues("task", "cached").Inc()
		case res.Shared:
			metricBuilds.WithLabelValues("task", "shared").Inc()
		default:
			metricBuilds.WithLabelValues("task", "built").Inc()
		}
		return res, nil
	}
}

func (b *TaskBuilder) buildOnce(ctx context.Context, spec TaskSpec, hash, ref string) (TaskResult, error) {
	res := TaskResult{Ref: ref, Hash: hash}
	img, err := b.cli.ImageInspect(ctx, ref)
	if err == nil && img.Config != nil && img.Config.Labels[LabelContextHash] == hash {
		res.ID, res.Cached = img.ID, true
		return res, nil
	}
	if err != nil && !cerrdefs.IsNotFound(err) {
		return res, fmt.Errorf("inspect task image %s: %w", ref, err)
	}
	b.builds.Add(1)
	start := time.Now()

	pr, pw := io.Pipe()
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		_, err := writeContext(pw, spec)
		pw.CloseWithError(orEOF(err))
	}()
	// However the build ends, stop the context writer and wait for it.
	defer func() {
		pr.CloseWithError(io.ErrClosedPipe)
		<-writerDone
	}()
	args := map[string]*string{}
	for k, v := range spec.BuildArgs {
		args[k] = &v
	}
	resp, err := b.cli.ImageBuild(ctx, pr, client.ImageBuildOptions{
		Tags:        []string{ref},
		Dockerfile:  spec.DockerfilePath,
		BuildArgs:   args,
		Labels:      map[string]string{LabelContextHash: hash},
		Remove:      true,
		ForceRemove: true,
		// The engine cannot pull here; FROM images were checked above.
		PullParent: false,
		// Docker 20.10's BuildKit needs a session; the classic builder
		// works over the plain API.
		Version: build.BuilderV1,
	})
	if err != nil {
		return res, fmt.Errorf("%w: %s: %v", ErrBuild, ref, err)
	}
	id, streamErr := readBuildStream(resp.Body, b.Log)
	resp.Body.Close()
	if streamErr != nil {
		return res, fmt.Errorf("%w: %s: %v", ErrBuild, ref, streamErr)
	}
	img, err = b.cli.ImageInspect(ctx, ref)
	if err != nil {
		return res, fmt.Errorf("%w: %s: built image %s not found: %v", ErrBuild, ref, shortID(id), err)
	}
	res.ID = img.ID
	metricBuildSeconds.WithLabelValues("task").Observe(time.Since(start).Seconds())
	slog.InfoContext(ctx, "task image built", "image", ref, "id", shortID(img.ID), "duration", time.Since(start).Round(time.Millisecond))
	return res, nil
}

// readBuildStream follows the engine's JSON progress stream and returns the
// built image ID, or the build error with the last lines of output.
func readBuildStream(r io.Reader, log io.Writer) (string, error) {
	tail := &tailBuffer{max: 2048}
	out := io.Writer(tail)
	if log != nil {
		out = io.MultiWriter(tail, log)
	}
	var id string
	dec := json.NewDecoder(r)
	for {
		var m jsonstream.Message
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return id, fmt.Errorf("read build output: %w", err)
		}
		if m.Stream != "" {
			io.WriteString(out, m.Stream)
		}
		if m.Error != nil {
			return id, fmt.Errorf("%s\n%s", m.Error.Message, tail.String())
		}
		if m.Aux != nil {
			var aux struct{ ID string }
			if json.Unmarshal(*m.Aux, &aux) == nil && aux.ID != "" {
				id = aux.ID
			}
		}
	}
	if id == "" {
		return "", fmt.Errorf("build output ended without an image id\n%s", tail.String())
	}
	return id, nil
}

// writeContext writes the canonical build-context tar for spec to w and
// returns the Dockerfile text. Canonical: entries in a fixed order, owners
// 0, mtimes fixed, so equal content gives equal bytes.
func writeContext(w io.Writer, spec TaskSpec) ([]byte, error) {
	tw := tar.NewWriter(w)
	var dockerfile []byte
	keep := func(name string, data []byte) {
		if name == spec.DockerfilePath && spec.Dockerfile == "" {
			dockerfile = data
		}
	}
	switch {
	case spec.Context == "":
	case isDir(spec.Context):
		if err := dirToTar(tw, spec.Context, spec.DockerfilePath, spec.Dockerfile != "", keep); err != nil {
			return nil, err
		}
	default:
		if err := tarballToTar(tw, spec.Context, spec.DockerfilePath, spec.Dockerfile != "", keep); err != nil {
			return nil, err
		}
	}
	if spec.Dockerfile != "" {
		dockerfile = []byte(spec.Dockerfile)
		if err := writeFile(tw, spec.DockerfilePath, 0o644, dockerfile); err != nil {
			return nil, err
		}
	}
	if dockerfile == nil {
		return nil, fmt.Errorf("%w: no %s in context %s and no Dockerfile given", ErrInvalidContext, spec.DockerfilePath, spec.Context)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("write build context: %w", err)
	}
	return dockerfile, nil
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

const maxDockerfile = 1 << 20

func dirToTar(tw *tar.Writer, root, dfPath string, skipDF bool, keep func(string, []byte)) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidContext, err)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		name := filepath.ToSlash(rel)
		if skipDF && name == dfPath {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidContext, err)
		}
		switch {
		case d.IsDir():
			return writeHeader(tw, &tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: int64(info.Mode().Perm())})
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("%w: %v", ErrInvalidContext, err)
			}
			return writeHeader(tw, &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
		case d.Type().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return fmt.Errorf("%w: %v", ErrInvalidContext, err)
			}
			defer f.Close()
			if err := writeHeader(tw, &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(info.Mode().Perm()), Size: info.Size()}); err != nil {
				return err
			}
			var src io.Reader = f
			var buf bytes.Buffer
			if name == dfPath && info.Size() <= maxDockerfile {
				src = io.TeeReader(f, &buf)
			}
			// Exactly Size bytes: a file growing under us must not corrupt
			// the stream.
			if _, err := io.CopyN(tw, src, info.Size()); err != nil {
				return fmt.Errorf("%w: read %s: %v", ErrInvalidContext, p, err)
			}
			if buf.Len() > 0 || (name == dfPath && info.Size() == 0) {
				keep(name, buf.Bytes())
			}
			return nil
		default:
			return fmt.Errorf("%w: %s is a %s, only files, directories and symlinks are supported", ErrInvalidContext, p, d.Type())
		}
	})
}

func tarballToTar(tw *tar.Writer, file, dfPath string, skipDF bool, keep func(string, []byte)) error {
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidContext, err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalidContext, file, err)
		}
		defer gz.Close()
		r = gz
	}
	tr := tar.NewReader(r)
	n := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %s is not a readable tar: %v", ErrInvalidContext, file, err)
		}
		n++
		name := cleanName(hdr.Name)
		if name == "" || name == "." {
			continue
		}
		if strings.HasPrefix(hdr.Name, "/") || strings.HasPrefix(path.Clean(hdr.Name), "..") {
			return fmt.Errorf("%w: %s: entry %q leaves the context", ErrInvalidContext, file, hdr.Name)
		}
		if skipDF && name == dfPath {
			continue
		}
		out := &tar.Header{Name: name, Mode: hdr.Mode & 0o7777}
		switch hdr.Typeflag {
		case tar.TypeDir:
			out.Typeflag, out.Name = tar.TypeDir, name+"/"
			if err := writeHeader(tw, out); err != nil {
				return err
			}
		case tar.TypeSymlink:
			out.Typeflag, out.Linkname = tar.TypeSymlink, hdr.Linkname
			if err := writeHeader(tw, out); err != nil {
				return err
			}
		case tar.TypeLink:
			out.Typeflag, out.Linkname = tar.TypeLink, cleanName(hdr.Linkname)
			if err := writeHeader(tw, out); err != nil {
				return err
			}
		case tar.TypeReg:
			out.Typeflag, out.Size = tar.TypeReg, hdr.Size
			if err := writeHeader(tw, out); err != nil {
				return err
			}
			var buf bytes.Buffer
			var src io.Reader = tr
			if name == dfPath && hdr.Size <= maxDockerfile {
				src = io.TeeReader(tr, &buf)
			}
			if _, err := io.CopyN(tw, src, hdr.Size); err != nil {
				return fmt.Errorf("%w: %s: read %s: %v", ErrInvalidContext, file, name, err)
			}
			if name == dfPath {
				keep(name, buf.Bytes())
			}
		case tar.TypeXGlobalHeader:
		default:
			return fmt.Errorf("%w: %s: entry %q has unsupported type %q", ErrInvalidContext, file, hdr.Name, hdr.Typeflag)
		}
	}
	if n == 0 {
		return fmt.Errorf("%w: %s is an empty tar", ErrInvalidContext, file)
	}
	return nil
}

func writeHeader(tw *tar.Writer, h *tar.Header) error {
	h.ModTime = epoch
	h.Format = tar.FormatPAX
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("write build context %s: %w", h.Name, err)
	}
	return nil
}

func writeFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	if err := writeHeader(tw, &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("write build context %s: %w", name, err)
	}
	return nil
}

// fromImages returns the images a Dockerfile builds FROM, without stage
// names and scratch, after ARG substitution. They must exist locally.
func fromImages(dockerfile []byte, buildArgs map[string]string) ([]string, error) {
	args := map[string]string{}
	stages := map[string]bool{}
	var out []string
	seen := map[string]bool{}
	sawFrom := false
	for _, line := range logicalLines(string(dockerfile)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "ARG":
			// Only ARGs before the first FROM apply to FROM lines.
			if sawFrom || len(f) < 2 {
				continue
			}
			k, v, hasDefault := strings.Cut(f[1], "=")
			if bv, ok := buildArgs[k]; ok {
				v = bv
			} else if !hasDefault {
				v = ""
			}
			args[k] = strings.Trim(v, `"'`)
		case "FROM":
			sawFrom = true
			rest := f[1:]
			for len(rest) > 0 && strings.HasPrefix(rest[0], "--") {
				rest = rest[1:]
			}
			if len(rest) == 0 {
				return nil, fmt.Errorf("%w: FROM without an image: %q", ErrInvalidContext, line)
			}
			img := expandArgs(rest[0], args)
			if img == "" || strings.Contains(img, "$") {
				return nil, fmt.Errorf("%w: FROM %s: cannot resolve the image name", ErrInvalidContext, rest[0])
			}
			if img != "scratch" && !stages[strings.ToLower(img)] && !seen[img] {
				seen[img] = true
				out = append(out, img)
			}
			// Stage names become visible to later FROM lines only.
			if len(rest) >= 3 && strings.EqualFold(rest[1], "AS") {
				stages[strings.ToLower(rest[2])] = true
			}
		}
	}
	if !sawFrom {
		return nil, fmt.Errorf("%w: the Dockerfile has no FROM line", ErrInvalidContext)
	}
	return out, nil
}

// logicalLines joins backslash continuations and drops comments and
// parser directives.
func logicalLines(s string) []string {
	var out []string
	var cur strings.Builder
	for _, raw := range strings.Split(s, "\n") {
		l := strings.TrimRight(raw, "\r")
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "#") {
			continue
		}
		if strings.HasSuffix(t, "\\") {
			cur.WriteString(strings.TrimSuffix(t, "\\"))
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(t)
		out = append(out, cur.String())
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

func expandArgs(s string, args map[string]string) string {
	return os.Expand(s, func(k string) string {
		// ${name:-default} and ${name:+alt}, the forms FROM lines use.
		if name, def, ok := strings.Cut(k, ":-"); ok {
			if v := args[name]; v != "" {
				return v
			}
			return def
		}
		if name, alt, ok := strings.Cut(k, ":+"); ok {
			if args[name] != "" {
				return alt
			}
			return ""
		}
		if v, ok := args[k]; ok {
			return v
		}
		return "$" + k // unresolved: reported by the caller
	})
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
