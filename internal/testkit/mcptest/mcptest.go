// Package mcptest builds the test MCP server (cmd/mcptest-server, on the
// official Go SDK) as a static binary, for the tests of tools/mcp and the
// end-to-end tests: stdio inside a busybox sandbox, HTTP on loopback.
package mcptest

import (
	"bufio"
	"context"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/internal/testkit/proctest"
)

// Binary builds the server (CGO_ENABLED=0: static, runs in busybox) into
// a temp dir of t and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return proctest.BuildStatic(t, filepath.Dir(file), "./cmd/mcptest-server", "mcptest-server")
}

// ServeHTTP starts the server on a loopback port and returns its MCP
// endpoint URL; the process is killed on cleanup.
func ServeHTTP(t testing.TB, bin string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-http", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("mcptest-server -http: %v", err)
	}
	return strings.TrimSpace(line)
}
