// Package pythonpkg tests the Python package in this directory
// (rollout-client, docs/python.md) the way a user installs it: pip installs
// it from a copy of the checkout into a fresh virtual environment that sees
// only Debian's packages (python3 -m venv --without-pip
// --system-site-packages; Debian's pip with --no-index --no-build-isolation), then its unittest suite runs against a
// real `rollout serve` and the real llama.cpp engine: the client, and each
// trainer adapter driven by a stand-in of its trainer (tests/standins).
//
// It skips when /usr/bin/python3 (ROLLOUT_PYTHON) lacks grpc, protobuf,
// pip, setuptools or wheel, or without Docker and the rollout-llamacpp:sid image;
// with CI=true each of those is a failure (`make test` installs the
// modules with scripts/ensure-python-grpc.sh and builds the image).
package pythonpkg

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

	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
	"github.com/rollout-rl/rollout/internal/testkit/proctest"
)

const groupSize = 2

func TestPythonPackage(t *testing.T) {
	py := proctest.Python()
	if out, err := exec.Command(py, "-c", "import grpc, google.protobuf, venv, setuptools, wheel, pip").CombinedOutput(); err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		proctest.Need(t, fmt.Sprintf("%s cannot import grpc, google.protobuf, venv, setuptools, wheel and pip (%v: %s); install "+
			"python3-grpcio python3-protobuf python3-pip python3-setuptools python3-wheel (scripts/ensure-python-grpc.sh does it as root)",
			py, err, lines[len(lines)-1]))
	}
	if testing.Short() {
		t.Skip("-short: skipping the Python package's install and live suite")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	e := llamacpptest.Start(t, llamacpptest.Options{Slots: 2, Ctx: 8192, Threads: 1})
	dir := t.TempDir()
	bin := filepath.Join(dir, "rollout")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/rollout-rl/rollout/cmd/rollout").CombinedOutput(); err != nil {
		t.Fatalf("build rollout: %v\n%s", err, out)
	}
	dataDir := filepath.Join(dir, "data")
	if err := os.Mkdir(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	port := proctest.StartServer(ctx, t, "serve", func(port int) []string {
		return []string{bin, "serve", "--listen", "127.0.0.1:" + strconv.Itoa(port), "--data-dir", dataDir}
	}, proctest.Listening)

	// The streams' run config: toolcall-match (no sandbox) on the real
	// engine, short generations.
	cfg := filepath.Join(dir, "run.yaml")
	config := fmt.Sprintf("env: toolcall-match\ngroup_size: %d\ninference:\n  backend: llamacpp\n  endpoints: [%s]\n  retries: 3\n  timeout: 2m\n"+
		"parser: hermes\nsampling: {temperature: 1.0, max_tokens: 24}\n", groupSize, e.URL)
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}

	// A standalone gateway on the same engine, for GatewayClient's tests
	// (its front doors on a second port; its gRPC port is the one waited on).
	gwCfg := filepath.Join(dir, "gateway.yaml")
	gwConfig := fmt.Sprintf("inference:\n  backend: llamacpp\n  endpoints: [%s]\n  retries: 3\n  timeout: 2m\n"+
		"parser: hermes\nsampling: {temperature: 1.0, max_tokens: 16}\noutput: {dir: %s}\n", e.URL, filepath.Join(dir, "gateway-run"))
	if err := os.WriteFile(gwCfg, []byte(gwConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	gwPort := proctest.StartServer(ctx, t, "gateway", func(port int) []string {
		return []string{bin, "gateway", "-c", gwCfg, "--listen", "127.0.0.1:" + strconv.Itoa(port),
			"--http-listen", "127.0.0.1:" + strconv.Itoa(proctest.FreePort(t))}
	}, proctest.Listening)

	// pip builds in the source directory: install from a copy, so the
	// checkout stays clean and parallel runs do not meet.
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"pyproject.toml", "rollout", "tests"} {
		if out, err := exec.Command("cp", "-r", p, filepath.Join(src, p)).CombinedOutput(); err != nil {
			t.Fatalf("copy %s: %v\n%s", p, err, out)
		}
	}
	venv := filepath.Join(dir, "venv")
	run := func(name string, cmd *exec.Cmd) string {
		t.Helper()
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.WaitDelay = 10 * time.Second
		start := time.Now()
		err := cmd.Run()
		t.Logf("%s (%s):\n%s", name, time.Since(start).Round(100*time.Millisecond), out.String())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return out.String()
	}
	// --without-pip: Debian's pip (seen through the system site packages)
	// installs into the venv; ensurepip would add a copy of pip, ~20-50 s
	// on a loaded machine, for nothing.
	run("venv", exec.CommandContext(ctx, py, "-m", "venv", "--without-pip", "--system-site-packages", venv))
	run("pip install", exec.CommandContext(ctx, filepath.Join(venv, "bin", "python"), "-m", "pip", "install", "--no-index",
		"--no-build-isolation", "--disable-pip-version-check", src))

	items, err := filepath.Abs(filepath.Join("..", "envs", "data", "toolcall_match.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	tests := filepath.Join(src, "tests")
	cmd := exec.CommandContext(ctx, filepath.Join(venv, "bin", "python"), "-m", "unittest", "discover", "-v", "-s", tests, "-t", tests)
	// Not src: the tests must import the installed package.
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1",
		"ROLLOUT_ADDR=127.0.0.1:"+strconv.Itoa(port), "ROLLOUT_CONFIG="+cfg, "ROLLOUT_GROUP_SIZE="+strconv.Itoa(groupSize),
		"ROLLOUT_ITEMS="+items, "ROLLOUT_EXPECT_INSTALLED=1", "ROLLOUT_GATEWAY_ADDR=127.0.0.1:"+strconv.Itoa(gwPort))
	out := run("unittest", cmd)
	m := regexp.MustCompile(`(?m)^Ran (\d+) tests? in`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("unittest printed no summary")
	}
	if n, _ := strconv.Atoi(m[1]); n < 20 {
		t.Errorf("unittest ran %d tests, want the whole suite (>= 20)", n)
	}
	if strings.Contains(out, "skipped") {
		t.Errorf("tests were skipped: the live suite must run here")
	}
}
