package toolcontext

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/sandbox"
	sbdocker "github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/sandbox/host"
	"github.com/rollout-rl/rollout/tools"
)

const image = "rollout-sandbox:bookworm"

var (
	docker    *sbdocker.Docker
	dockerErr error
)

func TestMain(m *testing.M) {
	code := func() int {
		ctx := context.Background()
		docker, dockerErr = sbdocker.New(ctx, sbdocker.Options{Options: host.Options{Instance: "tctest", ReapInterval: -1}})
		if dockerErr == nil {
			defer docker.Close(ctx)
		} else if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "CI=true and Docker is not usable:", dockerErr)
			return 1
		}
		return m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func newTC(t *testing.T) *ToolContext {
	t.Helper()
	if dockerErr != nil {
		t.Skipf("Docker not usable (CI=true makes this a failure): %v", dockerErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := docker.Create(ctx, sandbox.Spec{Image: image})
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	tc, err := New(tools.NewRuntime(sb, t.Name()), nil)
	if err != nil {
		t.Fatal(err)
	}
	return tc
}

func TestBinaryRoundTrip(t *testing.T) {
	tc := newTC(t)
	ctx := context.Background()
	dir := t.TempDir()
	data := make([]byte, 10<<20)
	rand.Read(data)
	src := filepath.Join(dir, "blob.bin")
	if err := os.WriteFile(src, data, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := tc.UploadFile(ctx, src, "/tmp/in/deep/blob.bin"); err != nil {
		t.Fatal(err)
	}
	// The sandbox sees the same bytes.
	r, err := tc.Exec(ctx, []string{"sha256sum", "/tmp/in/deep/blob.bin"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "back", "blob.bin")
	if err := tc.DownloadFile(ctx, "/tmp/in/deep/blob.bin", out); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	if !bytes.Equal(got, data) {
		t.Fatalf("10 MB file differs after the round trip (sha in sandbox: %s)", r.Stdout)
	}
}

func TestDirRoundTrip(t *testing.T) {
	tc := newTC(t)
	ctx := context.Background()
	src := t.TempDir()
	files := map[string][]byte{
		"a.txt":             []byte("hello\n"),
		"sub/b.bin":         {0, 1, 2, 255, 254, '\n', '\r'},
		"sub/deeper/c.sh":   []byte("#!/bin/sh\necho hi\n"),
		"with space/d e.md": []byte("# title"),
		"empty":             {},
	}
	for name, b := range files {
		p := filepath.Join(src, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		mode := fs.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(src, "emptydir"), 0o755)
	if err := tc.UploadDir(ctx, src, "/workspace/tree"); err != nil {
		t.Fatal(err)
	}
	r, err := tc.Terminal(ctx, "cd /workspace/tree && ./sub/deeper/c.sh && test -d emptydir && echo dir-ok", 0)
	if err != nil || r.ExitCode != 0 || r.Output != "hi\ndir-ok\n" {
		t.Fatalf("in sandbox: %+v %v", r, err)
	}
	dst := t.TempDir()
	if err := tc.DownloadDir(ctx, "/workspace/tree", dst); err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %q %v", name, got, err)
		}
	}
	if st, err := os.Stat(filepath.Join(dst, "sub/deeper/c.sh")); err != nil || st.Mode().Perm()&0o100 == 0 {
		t.Errorf("mode not kept: %v %v", st, err)
	}
	if st, err := os.Stat(filepath.Join(dst, "emptydir")); err != nil || !st.IsDir() {
		t.Errorf("empty dir missing: %v", err)
	}
}

func TestRewardSeesAgentWork(t *testing.T) {
	tc := newTC(t)
	ctx := context.Background()
	// The agent, through its tools, changes directory, exports a variable
	// and writes a file...
	for _, c := range [][2]string{
		{"terminal", `{"command":"mkdir -p /workspace/proj && cd /workspace/proj && export ANSWER=42"}`},
		{"write_file", `{"path":"result.txt","content":"done\n"}`},
	} {
		if _, err := tc.CallTool(ctx, c[0], c[1]); err != nil {
			t.Fatal(err)
		}
	}
	// ...and the reward's terminal sees all of it.
	r, err := tc.Terminal(ctx, `pwd; echo $ANSWER; cat result.txt`, 30*time.Second)
	if err != nil || r.Output != "/workspace/proj\n42\ndone\n" {
		t.Fatalf("terminal: %+v %v", r, err)
	}
	b, err := tc.ReadFile(ctx, "result.txt")
	if err != nil || string(b) != "done\n" {
		t.Fatalf("read: %q %v", b, err)
	}
	m, err := tc.Search(ctx, "don.", "/workspace")
	if err != nil || m["total_count"] != float64(1) {
		t.Fatalf("search: %v %v", m, err)
	}
	r, err = tc.Terminal(ctx, "sleep 5", time.Second)
	if err != nil || !r.TimedOut || r.ExitCode != 124 {
		t.Fatalf("timeout: %+v %v", r, err)
	}
	if _, err := tc.CallTool(ctx, "nope", `{}`); err == nil {
		t.Fatal("unknown tool must be an error")
	}
}

func TestRunRewardClosesOnPanic(t *testing.T) {
	tc := newTC(t)
	_, err := RunReward(context.Background(), tc, 0, func(ctx context.Context, tc *ToolContext) (float64, error) {
		if _, err := tc.CallTool(ctx, "terminal", `{"command":"sleep 300","background":true}`); err != nil {
			return 0, err
		}
		panic("reward bug")
	})
	if !errors.Is(err, ErrReward) || !strings.Contains(err.Error(), "reward bug") {
		t.Fatalf("err %v", err)
	}
	if _, err := tc.Exec(context.Background(), []string{"true"}, 0); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("sandbox still usable after RunReward: %v", err)
	}
	// A cancelled context still gets the teardown.
	tc2 := newTC(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v, err := RunReward(ctx, tc2, 0, func(ctx context.Context, tc *ToolContext) (float64, error) { return 1, nil })
	if err != nil || v != 1 {
		t.Fatalf("%v %v", v, err)
	}
	if _, err := tc2.Exec(context.Background(), []string{"true"}, 0); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("sandbox not closed: %v", err)
	}
}

func TestExtractRefusesEscapes(t *testing.T) {
	mk := func(entries ...[3]string) *bytes.Buffer {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range entries {
			switch e[0] {
			case "file":
				tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e[1], Size: int64(len(e[2])), Mode: 0o644})
				tw.Write([]byte(e[2]))
			case "link":
				tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: e[1], Linkname: e[2]})
			}
		}
		tw.Close()
		return &buf
	}
	dir := t.TempDir()
	dest := filepath.Join(dir, "out")
	// "../x" is cleaned to stay inside dest; an absolute or escaping
	// symlink is skipped, so a later entry cannot write through it.
	err := extract(mk([3]string{"link", "esc", "../../"}, [3]string{"link", "abs", "/etc"}, [3]string{"file", "../../x", "inside"}, [3]string{"file", "ok/a", "a"}), dest)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "x")); string(b) != "inside" {
		t.Fatalf("cleaned entry: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(dest, "esc")); err == nil {
		t.Fatal("escaping symlink created")
	}
	if _, err := os.Lstat(filepath.Join(dest, "abs")); err == nil {
		t.Fatal("absolute symlink created")
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); err == nil {
		t.Fatal("wrote outside the destination")
	}
}
