package envservertest

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/rollout-rl/rollout/envs/protocol"
	"github.com/rollout-rl/rollout/internal/testkit/proctest"
)

// Binary builds cmd/envservertest-server (CGO_ENABLED=0: static, runs in
// busybox) into a temp dir of t and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return proctest.BuildStatic(t, filepath.Dir(file), "./cmd/envservertest-server", "envservertest-server")
}

// ServerPath is where Image puts the server in the image.
const ServerPath = "/usr/local/bin/envservertest-server"

// Image builds an image FROM base (an existing sandbox image, e.g.
// rollout-sandbox:busybox) with the server at ServerPath, tagged by the
// binary's content, and removes it when the test ends.
func Image(t testing.TB, base string) string {
	t.Helper()
	bin := Binary(t)
	f, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	tag := "rollout-envservertest:" + hex.EncodeToString(h.Sum(nil))[:12]
	dir := filepath.Dir(bin)
	df := "FROM " + base + "\nCOPY --chmod=0755 envservertest-server " + ServerPath + "\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(df), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("docker", "build", "-q", "-t", tag, dir)
	cmd.Env = append(os.Environ(), "DOCKER_BUILDKIT=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		// Docker 20.10 without BuildKit has no COPY --chmod: the binary
		// keeps the mode go build gave it (0755) without it.
		if err2 := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM "+base+"\nCOPY envservertest-server "+ServerPath+"\n"), 0o644); err2 != nil {
			t.Fatal(err2)
		}
		cmd = exec.Command("docker", "build", "-q", "-t", tag, dir)
		if b2, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("docker build %s: %v\n%s\n%s", tag, err, b, b2)
		}
	}
	t.Cleanup(func() { _ = exec.Command("docker", "image", "rm", "-f", tag).Run() })
	return tag
}

// Endpoint serves h on a loopback test server (closed when the test ends)
// and returns the protocol endpoint a session of it is opened on.
func Endpoint(t testing.TB, h http.Handler, name string) protocol.Endpoint {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return protocol.Endpoint{Client: srv.Client(), BaseURL: srv.URL, Name: name}
}
