// Package sandboxtest holds what the tests of the sandbox backends share:
// the agent build, the test image, the exec table every backend's sandbox
// passes and a create helper. It is a test helper: product packages never
// import it.
package sandboxtest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/image"
	"go.uber.org/goleak"
)

// ExecTable runs the exec cases on s, a sandbox of Image with
// BASE=b in its environment (every backend's sandbox passes them).
func ExecTable(t *testing.T, s sandbox.Sandbox) {
	ctx := context.Background()
	tests := []struct {
		name       string
		req        sandbox.ExecRequest
		code       int
		stdout     string
		stderr     string
		truncated  bool
		outTotal   int64
		wantErr    error
		stdoutPart string
	}{
		{name: "argv", req: sandbox.ExecRequest{Argv: []string{"echo", "a b", "$HOME"}}, stdout: "a b $HOME\n"},
		{name: "command", req: sandbox.ExecRequest{Command: "echo $BASE; echo e >&2; exit 3"}, code: 3, stdout: "b\n", stderr: "e\n"},
		{name: "home of the user", req: sandbox.ExecRequest{Command: `[ -n "$HOME" ] && [ "$HOME" != /root ] && [ "$USER" = agent ] && echo ok`}, stdout: "ok\n"},
		{name: "merge", req: sandbox.ExecRequest{Command: "echo 1; echo 2 >&2; echo 3", MergeOutput: true}, stdout: "1\n2\n3\n"},
		{name: "stdin", req: sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("in\x00put")}, stdout: "in\x00put"},
		{name: "env", req: sandbox.ExecRequest{Command: "echo $X", Env: map[string]string{"X": "x y"}}, stdout: "x y\n"},
		{name: "cwd", req: sandbox.ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp"}, stdout: "/tmp\n"},
		{name: "user", req: sandbox.ExecRequest{Argv: []string{"id", "-u"}}, stdout: "1000\n"},
		{name: "not found", req: sandbox.ExecRequest{Argv: []string{"no-such-tool"}}, code: 127, stderr: "rollout-agent: no-such-tool: command not found\n"},
		{name: "signal", req: sandbox.ExecRequest{Command: "kill -KILL $$"}, code: 137},
		{name: "cap", req: sandbox.ExecRequest{Command: "seq 1 100000", OutputCap: 100}, truncated: true, outTotal: 588895, stdoutPart: "99999\n100000\n"},
		{name: "both set", req: sandbox.ExecRequest{Command: "x", Argv: []string{"x"}}, wantErr: sandbox.ErrInvalid},
		{name: "none set", req: sandbox.ExecRequest{}, wantErr: sandbox.ErrInvalid},
		{name: "relative cwd", req: sandbox.ExecRequest{Argv: []string{"pwd"}, Cwd: "tmp"}, wantErr: sandbox.ErrInvalid},
		{name: "missing cwd", req: sandbox.ExecRequest{Argv: []string{"pwd"}, Cwd: "/nope"}, wantErr: sandbox.ErrNotFound},
		{name: "negative cap", req: sandbox.ExecRequest{Argv: []string{"true"}, OutputCap: -1}, wantErr: sandbox.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := s.Exec(ctx, tt.req)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.ExitCode != tt.code {
				t.Errorf("exit = %d, want %d (stderr %q)", r.ExitCode, tt.code, r.Stderr)
			}
			if tt.stdoutPart != "" {
				if !strings.HasSuffix(string(r.Stdout), tt.stdoutPart) || !strings.HasPrefix(string(r.Stdout), "1\n2\n") {
					t.Errorf("stdout head/tail = %q", r.Stdout)
				}
			} else if string(r.Stdout) != tt.stdout {
				t.Errorf("stdout = %q, want %q", r.Stdout, tt.stdout)
			}
			if tt.stderr != "" && string(r.Stderr) != tt.stderr {
				t.Errorf("stderr = %q, want %q", r.Stderr, tt.stderr)
			}
			if r.StdoutTruncated != tt.truncated {
				t.Errorf("truncated = %v", r.StdoutTruncated)
			}
			if tt.outTotal != 0 && r.StdoutTotal != tt.outTotal {
				t.Errorf("total = %d, want %d", r.StdoutTotal, tt.outTotal)
			}
			if tt.truncated && len(r.Stdout) != tt.req.OutputCap {
				t.Errorf("kept %d bytes, want %d", len(r.Stdout), tt.req.OutputCap)
			}
		})
	}
}

// Image is rollout-sandbox:busybox from sandbox/image or, when that
// cannot be built, a stand-in imported from the host's static busybox with
// the same layout (user agent, uid 1000, /workspace).
var Image = "rollout-sandbox-test:busybox"

func ensureTestImage(ctx context.Context, cli *client.Client) error {
	if _, err := cli.ImageInspect(ctx, Image); err == nil {
		return nil
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("test image needs a static /bin/busybox (busybox-static): %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	dir := func(name string, mode int64, uid int) {
		_ = tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: mode, Uid: uid, Gid: uid, ModTime: now})
	}
	file := func(name string, mode int64, data []byte) {
		_ = tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(data)), ModTime: now})
		_, _ = tw.Write(data)
	}
	dir("bin/", 0o755, 0)
	dir("etc/", 0o755, 0)
	dir("tmp/", 0o1777, 0)
	dir("workspace/", 0o755, 1000)
	dir("root/", 0o700, 0)
	file("bin/busybox", 0o755, bb)
	list, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, a := range strings.Fields(string(list)) {
		if a == "busybox" {
			continue
		}
		_ = tw.WriteHeader(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", ModTime: now})
	}
	file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/workspace:/bin/sh\n"))
	file("etc/group", 0o644, []byte("root:x:0:\nagent:x:1000:\n"))
	if err := tw.Close(); err != nil {
		return err
	}
	res, err := cli.ImageImport(ctx, client.ImageImportSource{Source: &buf, SourceName: "-"}, Image,
		client.ImageImportOptions{Changes: []string{"ENV PATH=/bin", "WORKDIR /workspace"}})
	if err != nil {
		return fmt.Errorf("import test image: %w", err)
	}
	defer res.Close()
	_, _ = bytes.NewBuffer(nil).ReadFrom(res)
	return nil
}

// CreateOn creates a sandbox of spec (image img when spec has none) on b
// within timeout, closed when the test ends.
func CreateOn(t testing.TB, b sandbox.Backend, spec sandbox.Spec, img string, timeout time.Duration) sandbox.Sandbox {
	t.Helper()
	if spec.Image == "" {
		spec.Image = img
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// EnsureImage makes Image usable: rollout-sandbox:busybox from
// sandbox/image or, when that cannot be built, the stand-in.
func EnsureImage(ctx context.Context) error {
	cli, err := dockerclient.New(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	ref, err := image.EnsureBusybox(ctx)
	if err == nil {
		Image = ref
		return nil
	}
	fmt.Fprintf(os.Stderr, "image.EnsureBusybox: %v; using a stand-in image\n", err)
	return ensureTestImage(ctx, cli)
}

// BuildAgent builds the static in-sandbox agent at path and points
// ROLLOUT_AGENT at it, so every backend under test delivers this build.
func BuildAgent(path string) error {
	build := exec.Command("go", "build", "-o", path, "github.com/rollout-rl/rollout/sandbox/agent/cmd/rollout-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build agent: %v\n%s", err, out)
	}
	return os.Setenv("ROLLOUT_AGENT", path)
}

// Hooks are a backend test package's parts of Main.
type Hooks struct {
	// Children maps an environment variable to the function a re-executed
	// test binary runs instead of the tests (owner-death tests).
	Children map[string]func() int
	// Setup makes the backend under test; its error is the caller's to keep
	// (its tests skip on it) and fails the run under CI=true.
	Setup func(ctx context.Context) error
	// Teardown closes what Setup and the tests made.
	Teardown func(ctx context.Context) error
}

// Main is the TestMain of a backend's tests: it builds the agent into a
// temporary directory, runs the tests between Setup and Teardown and fails
// the run when a goroutine outlives them.
func Main(m *testing.M, h Hooks) {
	for env, child := range h.Children {
		if os.Getenv(env) != "" {
			os.Exit(child())
		}
	}
	code := func() int {
		dir, err := os.MkdirTemp("", "rollout-agent-test")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if err := BuildAgent(filepath.Join(dir, "rollout-agent")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		ctx := context.Background()
		if h.Setup != nil {
			if err := h.Setup(ctx); err != nil && os.Getenv("CI") == "true" {
				fmt.Fprintln(os.Stderr, "CI=true and the backend under test is not usable:", err)
				return 1
			}
		}
		code := m.Run()
		if h.Teardown != nil {
			if err := h.Teardown(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "close the backend under test:", err)
				code = 1
			}
		}
		return code
	}()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent()); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
