package image

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/moby/moby/client"
)

func TestFromImages(t *testing.T) {
	tests := []struct {
		name    string
		df      string
		args    map[string]string
		want    []string
		wantErr error
	}{
		{name: "simple", df: "FROM rollout-sandbox:busybox\nRUN true\n", want: []string{"rollout-sandbox:busybox"}},
		{name: "lowercase, platform flag, comments", df: "# syntax comment\nfrom --platform=linux/amd64 a:1 AS build\n", want: []string{"a:1"}},
		{name: "multi-stage refers to stage", df: "FROM a:1 AS build\nRUN x\nFROM build\nFROM scratch\nCOPY --from=build / /\nFROM a:1\n", want: []string{"a:1"}},
		{name: "arg default", df: "ARG BASE=rollout-sandbox:bookworm\nFROM $BASE\n", want: []string{"rollout-sandbox:bookworm"}},
		{name: "arg overridden", df: "ARG BASE=x\nFROM ${BASE}\n", args: map[string]string{"BASE": "y:2"}, want: []string{"y:2"}},
		{name: "arg with fallback", df: "ARG TAG\nFROM img:${TAG:-busybox}\n", want: []string{"img:busybox"}},
		{name: "continuation", df: "FROM \\\n  rollout-sandbox:busybox\n", want: []string{"rollout-sandbox:busybox"}},
		{name: "unresolved arg", df: "FROM $NOPE\n", wantErr: ErrInvalidContext},
		{name: "no from", df: "RUN true\n", wantErr: ErrInvalidContext},
		{name: "from without image", df: "FROM --platform=x\n", wantErr: ErrInvalidContext},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fromImages([]byte(tt.df), tt.args)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// contextDir is a copy of testdata/ctx plus a symlink link -> hello.txt,
// made here because a checkout may not preserve symlinks.
func contextDir(t *testing.T) string {
	t.Helper()
	dir := copyDir(t, "testdata/ctx")
	if err := os.Symlink("hello.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	return dst
}

func contextHash(t *testing.T, spec TaskSpec) string {
	t.Helper()
	if spec.DockerfilePath == "" {
		spec.DockerfilePath = "Dockerfile"
	}
	h := sha256.New()
	if _, err := writeContext(h, spec); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// The context hash follows content and modes, not mtimes.
func TestContextHash(t *testing.T) {
	dir := contextDir(t)
	base := contextHash(t, TaskSpec{Context: dir})

	old := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(filepath.Join(dir, "hello.txt"), old, old); err != nil {
		t.Fatal(err)
	}
	if got := contextHash(t, TaskSpec{Context: dir}); got != base {
		t.Errorf("mtime changed the hash")
	}
	if err := os.Chmod(filepath.Join(dir, "hello.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	chmodded := contextHash(t, TaskSpec{Context: dir})
	if chmodded == base {
		t.Errorf("mode change did not change the hash")
	}
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("changed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if contextHash(t, TaskSpec{Context: dir}) == chmodded {
		t.Errorf("content change did not change the hash")
	}
	// An inline Dockerfile replaces the context's.
	inline := contextHash(t, TaskSpec{Context: dir, Dockerfile: "FROM rollout-sandbox:busybox\n"})
	if inline == contextHash(t, TaskSpec{Context: dir}) {
		t.Errorf("inline Dockerfile ignored")
	}
}

func TestWriteContextErrors(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	notTar := filepath.Join(t.TempDir(), "ctx.tar")
	if err := os.WriteFile(notTar, []byte("this is not a tar archive at all, just text that is long enough"), 0o644); err != nil {
		t.Fatal(err)
	}
	escaping := filepath.Join(t.TempDir(), "evil.tar")
	writeTarFile(t, escaping, false, map[string]string{"../etc/passwd": "x"})
	for name, spec := range map[string]TaskSpec{
		"no Dockerfile in dir": {Context: dir},
		"missing context":      {Context: filepath.Join(dir, "nope")},
		"not a tar":            {Context: notTar, Dockerfile: "FROM x\n"},
		"escaping entry":       {Context: escaping, Dockerfile: "FROM x\n"},
	} {
		t.Run(name, func(t *testing.T) {
			spec.DockerfilePath = "Dockerfile"
			_, err := writeContext(discard{}, spec)
			if !errors.Is(err, ErrInvalidContext) {
				t.Fatalf("err = %v, want ErrInvalidContext", err)
			}
		})
	}
	b := NewTaskBuilder(nil)
	for name, spec := range map[string]TaskSpec{
		"empty spec":             {},
		"dockerfile path escape": {Dockerfile: "FROM x\n", DockerfilePath: "../Dockerfile"},
	} {
		if _, err := b.Build(t.Context(), spec); !errors.Is(err, ErrInvalidContext) {
			t.Errorf("%s: err = %v, want ErrInvalidContext", name, err)
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func writeTarFile(t *testing.T, path string, gz bool, files map[string]string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var tw *tar.Writer
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(f)
		tw = tar.NewWriter(zw)
	} else {
		tw = tar.NewWriter(f)
	}
	for _, name := range sortedKeys(files) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[name]))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[name])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func nonce(t *testing.T) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// removeTaskImage drops a task image built by a test.
func removeTaskImage(t *testing.T, cli *client.Client, ref string) {
	t.Cleanup(func() {
		_, _ = cli.ImageRemove(context.Background(), ref, client.ImageRemoveOptions{Force: true, PruneChildren: true})
	})
}

func TestTaskImageBuildAndCache(t *testing.T) {
	cli := newDocker(t)
	if _, err := EnsureBusybox(t.Context()); err != nil {
		t.Fatal(err)
	}
	dir := contextDir(t)
	// A fresh file per run, so the first build is a real build.
	n := nonce(t)
	if err := os.WriteFile(filepath.Join(dir, "nonce.txt"), []byte(n+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := NewTaskBuilder(cli)
	ctx := t.Context()

	first, err := b.Build(ctx, TaskSpec{Context: dir})
	if err != nil {
		t.Fatal(err)
	}
	removeTaskImage(t, cli, first.Ref)
	if first.Cached || !strings.HasPrefix(first.Ref, "rollout-task:") || first.ID == "" {
		t.Fatalf("first build: %+v", first)
	}
	out := runIn(t, cli, first.Ref, "agent", "/bin/sh", "-c", "cat /workspace/ctx/hello.txt /workspace/ctx/nonce.txt /workspace/ctx/sub/nested.txt; readlink /workspace/ctx/link")
	if want := "hello\n" + n + "\nnested\nhello.txt\n"; out != want {
		t.Errorf("image content %q, want %q", out, want)
	}

	// Same content, new mtimes, a second builder: served from the engine.
	now := time.Now()
	_ = os.Chtimes(filepath.Join(dir, "hello.txt"), now, now)
	second, err := NewTaskBuilder(cli).Build(ctx, TaskSpec{Context: dir})
	if err != nil {
		t.Fatal(err)
	}
	if !second.Cached || second.ID != first.ID || second.Ref != first.Ref {
		t.Errorf("second build not a cache hit: %+v vs %+v", second, first)
	}
	if got := b.builds.Load(); got != 1 {
		t.Errorf("engine builds = %d, want 1", got)
	}

	// The same context as a gzip tarball with an inline Dockerfile.
	tgz := filepath.Join(t.TempDir(), "ctx.tar.gz")
	writeTarFile(t, tgz, true, map[string]string{"data/n.txt": n})
	third, err := b.Build(ctx, TaskSpec{Context: tgz, Dockerfile: "FROM rollout-sandbox:busybox\nCOPY data /workspace/data\n"})
	if err != nil {
		t.Fatal(err)
	}
	removeTaskImage(t, cli, third.Ref)
	if out := runIn(t, cli, third.Ref, "", "cat", "/workspace/data/n.txt"); out != n {
		t.Errorf("tarball image content %q, want %q", out, n)
	}
}

func TestTaskImageSingleflight(t *testing.T) {
	cli := newDocker(t)
	if _, err := EnsureBusybox(t.Context()); err != nil {
		t.Fatal(err)
	}
	b := NewTaskBuilder(cli)
	// The RUN step keeps the build going long enough for every caller to
	// join it.
	spec := TaskSpec{Dockerfile: "FROM rollout-sandbox:busybox\nRUN sleep 1 && echo " + nonce(t) + " > /n\n"}
	const callers = 6
	results := make([]TaskResult, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = b.Build(t.Context(), spec)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("caller %d: %v", i, err)
		}
	}
	removeTaskImage(t, cli, results[0].Ref)
	if got := b.builds.Load(); got != 1 {
		t.Errorf("engine builds = %d for %d concurrent callers, want 1", got, callers)
	}
	for i, r := range results {
		if r.ID != results[0].ID || r.Ref != results[0].Ref {
			t.Errorf("caller %d got %s, caller 0 got %s", i, r.ID, results[0].ID)
		}
	}
}

func TestTaskImageErrors(t *testing.T) {
	cli := newDocker(t)
	if _, err := EnsureBusybox(t.Context()); err != nil {
		t.Fatal(err)
	}
	b := NewTaskBuilder(cli)
	_, err := b.Build(t.Context(), TaskSpec{Dockerfile: "FROM rollout-no-such-image:" + nonce(t) + "\n"})
	if !errors.Is(err, ErrBaseMissing) {
		t.Errorf("missing base: err = %v, want ErrBaseMissing", err)
	}
	_, err = b.Build(t.Context(), TaskSpec{Dockerfile: "FROM rollout-sandbox:busybox\nRUN echo " + nonce(t) + " && exit 3\n"})
	if !errors.Is(err, ErrBuild) || !strings.Contains(err.Error(), "returned a non-zero code: 3") {
		t.Errorf("failing RUN: err = %v, want ErrBuild with the engine's message", err)
	}
}
