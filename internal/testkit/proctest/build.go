package proctest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BuildStatic builds the Go package pkg (a path relative to dir, e.g.
// "./cmd/x") with CGO_ENABLED=0 — static, so it runs in a busybox
// sandbox — into a temp dir of t as name and returns its path.
func BuildStatic(t testing.TB, dir, pkg, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v: %s", name, err, b)
	}
	return out
}
