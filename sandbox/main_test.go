package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox/image"
)

// testImage is rollout-sandbox:busybox from sandbox/image or, when that
// cannot be built, a stand-in imported from the host's static busybox with
// the same layout (user agent, uid 1000, /workspace).
var testImage = "rollout-sandbox-test:busybox"

var (
	dockerErr  error // why Docker tests cannot run
	agentPath  string
	testDocker *Docker
)

func TestMain(m *testing.M) {
	if os.Getenv(ownerChildEnv) != "" {
		os.Exit(ownerChild())
	}
	if os.Getenv(runcOwnerChildEnv) != "" {
		os.Exit(runcOwnerChild())
	}
	if os.Getenv(runcSubreaperChildEnv) != "" {
		os.Exit(runcSubreaperChild())
	}
	code := func() int {
		dir, err := os.MkdirTemp("", "rollout-agent-test")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		agentPath = filepath.Join(dir, "rollout-agent")
		build := exec.Command("go", "build", "-o", agentPath, "./agent/cmd/rollout-agent")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build agent: %v\n%s", err, out)
			return 1
		}
		os.Setenv("ROLLOUT_AGENT", agentPath)
		ctx := context.Background()
		dockerErr = setupDocker(ctx)
		if dockerErr != nil && os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "CI=true and Docker is not usable:", dockerErr)
			return 1
		}
		code := m.Run()
		if err := closeTestKube(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "close kubernetes test backend:", err)
			code = 1
		}
		if err := closeTestRunc(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "close runc test backend:", err)
			code = 1
		}
		if testDocker != nil {
			if err := testDocker.Close(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "close test backend:", err)
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

func setupDocker(ctx context.Context) error {
	cli, err := dockerclient.New(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	if ref, err := image.EnsureBusybox(ctx); err == nil {
		testImage = ref
	} else {
		fmt.Fprintf(os.Stderr, "image.EnsureBusybox: %v; using a stand-in image\n", err)
		if err := ensureTestImage(ctx, cli); err != nil {
			return err
		}
	}
	d, err := NewDocker(ctx, Options{Instance: "test-" + randomID(4), ReapInterval: -1})
	if err != nil {
		return err
	}
	testDocker = d
	return nil
}

func ensureTestImage(ctx context.Context, cli *client.Client) error {
	if _, err := cli.ImageInspect(ctx, testImage); err == nil {
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
	res, err := cli.ImageImport(ctx, client.ImageImportSource{Source: &buf, SourceName: "-"}, testImage,
		client.ImageImportOptions{Changes: []string{"ENV PATH=/bin", "WORKDIR /workspace"}})
	if err != nil {
		return fmt.Errorf("import test image: %w", err)
	}
	defer res.Close()
	_, _ = bytes.NewBuffer(nil).ReadFrom(res)
	return nil
}

// needDocker skips (or fails under CI=true, already handled in TestMain)
// when the engine is unusable.
func needDocker(t testing.TB) *Docker {
	t.Helper()
	if dockerErr != nil {
		t.Skipf("Docker not usable (set CI=true to make this a failure): %v", dockerErr)
	}
	return testDocker
}

func newSandbox(t testing.TB, spec Spec) Sandbox {
	t.Helper()
	return createOn(t, needDocker(t), spec, testImage, time.Minute)
}

// createOn creates a sandbox of spec (image img when spec has none) on b
// within timeout, closed when the test ends.
func createOn(t testing.TB, b Backend, spec Spec, img string, timeout time.Duration) Sandbox {
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
