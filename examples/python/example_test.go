// Package pythonexample tests examples/python/rollout_example.py: it builds
// the rollout binary, starts `rollout sim` and `rollout serve` on free
// loopback ports and runs the example with Debian's python3.
//
// The scripts use the rollout-client package from the checkout (python/).
// The test skips when python3 cannot import grpc and google.protobuf,
// except with CI=true, where it fails: `make test` installs python3-grpcio
// and python3-protobuf first (scripts/ensure-python-grpc.sh).
package pythonexample

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/internal/testkit/proctest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	groups    = 3
	groupSize = 4
)

func TestPythonExample(t *testing.T) {
	py := proctest.Python()
	if out, err := exec.Command(py, "-c", "import grpc, google.protobuf").CombinedOutput(); err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		msg := fmt.Sprintf("%s cannot import grpc and google.protobuf (%v: %s); install python3-grpcio and python3-protobuf "+
			"(scripts/ensure-python-grpc.sh does it as root)", py, err, lines[len(lines)-1])
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
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/rollout-rl/rollout/cmd/rollout")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build rollout: %v\n%s", err, out)
	}
	dataDir := filepath.Join(dir, "data")
	if err := os.Mkdir(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}

	// The simulator follows toolcall-match's reference solutions on 60% of
	// the episodes, so rewards vary within a group. Its latency keeps the
	// first group from finishing before the example's WatchJob starts
	// (WatchJob does not replay earlier groups).
	simPort := proctest.StartServer(ctx, t, "sim", func(port int) []string {
		return []string{bin, "sim", "--env", "toolcall-match", "--host", "127.0.0.1", "--port", strconv.Itoa(port),
			"--success-prob", "0.6", "--seed", "7", "--ttft", "500ms"}
	}, simHealthy)
	servePort := proctest.StartServer(ctx, t, "serve", func(port int) []string {
		return []string{bin, "serve", "--listen", "127.0.0.1:" + strconv.Itoa(port), "--data-dir", dataDir}
	}, proctest.Listening)

	cmd := exec.CommandContext(ctx, py, "rollout_example.py",
		"--addr", "127.0.0.1:"+strconv.Itoa(servePort),
		"--endpoint", "http://127.0.0.1:"+strconv.Itoa(simPort),
		"--groups", strconv.Itoa(groups), "--group-size", strconv.Itoa(groupSize),
		"--timeout", "300")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("rollout_example.py output:\n%s", stdout.String())
	if stderr.Len() > 0 {
		t.Logf("rollout_example.py stderr:\n%s", stderr.String())
	}
	if err != nil {
		t.Fatalf("rollout_example.py: %v", err)
	}
	checkOutput(t, stdout.String())
}

var groupLine = regexp.MustCompile(`^(watch|collect) group (\S+) (?:request=(\S+) )?item=(\S+) rewards=\[([^\]]*)\] tokens=\[([^\]]*)\] mean=(\S+)(.*)$`)

var trainedCounts = regexp.MustCompile(`trained=\[([^\]]*)\]`)

// checkOutput checks that both parts received every group with its
// rewards and tokens.
func checkOutput(t *testing.T, out string) {
	t.Helper()
	items := map[string]map[string]bool{"watch": {}, "collect": {}}
	for _, line := range strings.Split(out, "\n") {
		m := groupLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		part, item := m[1], m[4]
		if items[part][item] {
			t.Errorf("%s: item %s received twice", part, item)
		}
		items[part][item] = true
		rewards := strings.Split(m[5], ", ")
		tokens := strings.Split(m[6], ", ")
		if len(rewards) != groupSize || len(tokens) != groupSize {
			t.Errorf("%d rewards and %d token counts, want %d: %q", len(rewards), len(tokens), groupSize, line)
			continue
		}
		for i := range rewards {
			r, err := strconv.ParseFloat(rewards[i], 64)
			if err != nil || r < 0 || r > 1 {
				t.Errorf("rollout %d: reward %q is not a number in [0, 1]: %q", i, rewards[i], line)
			}
			if n, err := strconv.Atoi(tokens[i]); err != nil || n <= 0 {
				t.Errorf("rollout %d: token count %q is not positive: %q", i, tokens[i], line)
			}
		}
		// The script asks for the compact token layout and prints the
		// trained tokens of each rollout from its expanded loss mask.
		if tm := trainedCounts.FindStringSubmatch(m[8]); tm == nil {
			t.Errorf("no trained token counts: %q", line)
		} else if trained := strings.Split(tm[1], ", "); len(trained) != groupSize {
			t.Errorf("%d trained token counts, want %d: %q", len(trained), groupSize, line)
		} else {
			for i := range trained {
				n, err := strconv.Atoi(trained[i])
				total, _ := strconv.Atoi(tokens[i])
				if err != nil || n <= 0 || n >= total {
					t.Errorf("rollout %d: trained token count %q not in (0, %d): %q", i, trained[i], total, line)
				}
			}
		}
		if part == "collect" && (m[3] != "step-1" || !strings.Contains(m[8], "policy_version=1")) {
			t.Errorf("collected group without its request id and policy version: %q", line)
		}
	}
	for part, got := range items {
		if len(got) != groups {
			t.Errorf("%s: %d distinct groups printed, want %d", part, len(got), groups)
		}
	}
	for _, want := range []string{
		"connected to rollout ",
		fmt.Sprintf("JOB_STATE_SUCCEEDED, received %d/%d groups", groups, groups),
		fmt.Sprintf("collect: received %d/%d groups, at most 1 in flight", groups, groups),
		"\nOK\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// probe checks the simulator's health without keeping connections (and
// their goroutines) alive.
var probe = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// simHealthy: rollout sim answers /health on port.
func simHealthy(port int) bool {
	resp, err := probe.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
