package pythonexample

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/proctest"
)

// TestPythonAsyncTrainer runs examples/python/async_trainer.py: an
// asynchronous loop of CollectGroups → pretend train step →
// BeginPolicyUpdate / weight load / EndPolicyUpdate while collection goes
// on, in abort mode, checking the version and lag fields of every group.
func TestPythonAsyncTrainer(t *testing.T) {
	py := proctest.Python()
	if out, err := exec.Command(py, "-c", "import grpc, google.protobuf").CombinedOutput(); err != nil {
		msg := fmt.Sprintf("%s cannot import grpc and google.protobuf (%v: %s)", py, err, strings.TrimSpace(string(out)))
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: " + msg)
		}
		t.Skip(msg)
	}
	if testing.Short() {
		t.Skip("-short: skipping the end-to-end Python example")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "rollout")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/rollout-rl/rollout/cmd/rollout").CombinedOutput(); err != nil {
		t.Fatalf("build rollout: %v\n%s", err, out)
	}
	dataDir := filepath.Join(dir, "data")
	if err := os.Mkdir(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	simPort := proctest.StartServer(ctx, t, "sim", func(port int) []string {
		return []string{bin, "sim", "--env", "toolcall-match", "--host", "127.0.0.1", "--port", strconv.Itoa(port),
			"--success-prob", "0.6", "--seed", "7", "--ttft", "50ms", "--per-token", "4ms"}
	}, simHealthy)
	servePort := proctest.StartServer(ctx, t, "serve", func(port int) []string {
		return []string{bin, "serve", "--listen", "127.0.0.1:" + strconv.Itoa(port), "--data-dir", dataDir}
	}, proctest.Listening)
	const groups = 5
	cmd := exec.CommandContext(ctx, py, "async_trainer.py",
		"--addr", "127.0.0.1:"+strconv.Itoa(servePort), "--endpoint", "http://127.0.0.1:"+strconv.Itoa(simPort),
		"--groups", strconv.Itoa(groups), "--group-size", "4", "--mode", "abort", "--max-staleness", "1", "--timeout", "300")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("async_trainer.py output:\n%s", stdout.String())
	if stderr.Len() > 0 {
		t.Logf("stderr:\n%s", stderr.String())
	}
	if err != nil {
		t.Fatalf("async_trainer.py: %v", err)
	}
	out := stdout.String()
	lines := regexp.MustCompile(`(?m)^async group (\S+) versions=\[(\d+)\.\.(\d+)\] lag=(\d+) `).FindAllStringSubmatch(out, -1)
	if len(lines) != groups {
		t.Fatalf("%d groups printed, want %d", len(lines), groups)
	}
	seen := map[string]bool{}
	for _, m := range lines {
		if seen[m[1]] {
			t.Errorf("group %s twice", m[1])
		}
		seen[m[1]] = true
		if lag, _ := strconv.Atoi(m[4]); lag > 1 {
			t.Errorf("group %s lag %d beyond max_staleness 1", m[1], lag)
		}
	}
	if n := strings.Count(out, "\nupdate v"); n != groups-1 {
		t.Errorf("%d updates printed, want %d", n, groups-1)
	}
	for _, want := range []string{fmt.Sprintf("async: received %d/%d groups, %d updates", groups, groups, groups-1), "\nOK\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
