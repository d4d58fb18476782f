// Package grpocpu tests examples/grpo-cpu: the PyTorch copy of the tiny
// Qwen3 model against llama.cpp, and the closed GRPO loop through
// `rollout serve`.
//
// TestPolicyUnit runs the Python unit tests (GGUF round trip, model
// invariants). TestGRPOLoop starts the llama.cpp engine image
// (rollout-llamacpp:sid, built with `rollout sandbox image build --name
// llamacpp` when missing) on the policy GGUF, `rollout serve`, and runs
// grpo_cpu.py: it asserts the engine–trainer logprob agreement and a rise of
// the mean reward, then shows that breaking tokens, loss mask, logprobs or
// advantages on purpose makes the trainer fail.
//
// Both skip when python3 lacks torch, numpy, matplotlib or grpc (or Docker
// or the engine image is missing), except with CI=true, where they fail:
// `make test` installs the modules (scripts/ensure-python-torch.sh).
package grpocpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/testkit/proctest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// backend is rollout's inference backend for llama-server (tokens mode).
const backend = "llamacpp"

// The loop's size: small enough for two cores within a few minutes.
const (
	steps         = 18
	groupsPerStep = 4
	groupSize     = 8
	minRise       = 0.1
)

func engineImage() string {
	if s := os.Getenv("ROLLOUT_LLAMACPP_IMAGE"); s != "" {
		return s
	}
	return "rollout-llamacpp:sid"
}

func requirePython(t *testing.T, modules string) {
	t.Helper()
	out, err := exec.Command(proctest.Python(), "-c", "import "+modules).CombinedOutput()
	if err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		proctest.Need(t, fmt.Sprintf("%s cannot import %s (%v: %s); install python3-torch python3-numpy python3-matplotlib "+
			"python3-grpcio python3-protobuf (scripts/ensure-python-torch.sh and ensure-python-grpc.sh do it as root)", proctest.Python(), modules, err, lines[len(lines)-1]))
	}
}

func TestPolicyUnit(t *testing.T) {
	requirePython(t, "torch, numpy")
	cmd := exec.Command(proctest.Python(), "-m", "unittest", "-v", "test_tiny_qwen3")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("python unit tests: %v", err)
	}
}

func TestGRPOLoop(t *testing.T) {
	requirePython(t, "torch, numpy, matplotlib, grpc")
	if testing.Short() {
		t.Skip("-short: skipping the GRPO loop")
	}
	if err := exec.Command("docker", "version").Run(); err != nil {
		proctest.Need(t, fmt.Sprintf("docker is not usable: %v", err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "rollout")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/rollout-rl/rollout/cmd/rollout").CombinedOutput(); err != nil {
		t.Fatalf("build rollout: %v\n%s", err, out)
	}
	img := engineImage()
	if err := exec.CommandContext(ctx, "docker", "image", "inspect", img).Run(); err != nil {
		out, err := exec.CommandContext(ctx, bin, "sandbox", "image", "build", "--name", "llamacpp").CombinedOutput()
		if err != nil && bytes.Contains(out, []byte("unknown image recipe")) {
			t.Skipf("engine image %s is missing and this build has no llamacpp recipe:\n%s", img, out)
		}
		if err != nil {
			proctest.Need(t, fmt.Sprintf("engine image %s is missing and could not be built: %v\n%s", img, err, out))
		}
	}

	// The engine serves policyDir/policy.gguf; the trainer rewrites it
	// after every step and restarts the container. The image runs as an
	// unprivileged user, so the bind-mounted directory must be readable.
	policyDir := filepath.Join(dir, "policy")
	if err := os.Mkdir(policyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(policyDir, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	original := filepath.Join(dir, "tiny-qwen3.gguf")
	extract(ctx, t, img, "/models/tiny-qwen3.gguf", original)
	policy := filepath.Join(policyDir, "policy.gguf")
	reset := func() {
		t.Helper()
		b, err := os.ReadFile(original)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(policy, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reset()

	t.Run("roundtrip", func(t *testing.T) {
		cmd := exec.CommandContext(ctx, proctest.Python(), "-m", "unittest", "test_tiny_qwen3.GGUFRoundTrip.test_engine_model_roundtrip_is_byte_identical")
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "ROLLOUT_TINY_GGUF="+original)
		if out, err := cmd.CombinedOutput(); err != nil || !bytes.Contains(out, []byte("OK")) || bytes.Contains(out, []byte("skipped")) {
			t.Fatalf("the engine's GGUF does not round-trip through the PyTorch model byte for byte: %v\n%s", err, out)
		}
	})

	eng := startEngine(ctx, t, img, policyDir)
	endpoint := "http://127.0.0.1:" + strconv.Itoa(eng.port)

	t.Run("engine-agreement", func(t *testing.T) {
		out, code := runPy(ctx, t, "engine_agreement.py", "--endpoint", endpoint, "--policy", policy)
		if code != 0 {
			t.Fatalf("engine_agreement.py exited %d:\n%s", code, out)
		}
		t.Logf("%s", out)
	})

	if !slices.Contains(inference.Backends(), backend) {
		// A fact of this build, not of the machine: skipped under CI too.
		t.Skipf("the loop needs rollout's %q inference backend, not in this build (backends: %v)", backend, inference.Backends())
	}
	dataDir := filepath.Join(dir, "data")
	if err := os.Mkdir(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	servePort := startServe(ctx, t, bin, dataDir, here)
	addr := "127.0.0.1:" + strconv.Itoa(servePort)

	trainer := func(t *testing.T, out string, nsteps int, extra ...string) (string, int) {
		args := []string{"grpo_cpu.py", "--addr", addr, "--endpoint", endpoint, "--policy", policy,
			"--reload-cmd", "docker restart -t 2 " + eng.id, "--out", out, "--backend", backend,
			"--steps", strconv.Itoa(nsteps), "--groups-per-step", strconv.Itoa(groupsPerStep),
			"--group-size", strconv.Itoa(groupSize), "--min-rise", fmt.Sprint(minRise), "--seed", "1"}
		return runPy(ctx, t, args[0], append(args[1:], extra...)...)
	}

	t.Run("train", func(t *testing.T) {
		outDir := filepath.Join(dir, "report")
		out, code := trainer(t, outDir, steps)
		t.Logf("grpo_cpu.py output:\n%s", out)
		if code != 0 {
			t.Fatalf("grpo_cpu.py exited %d", code)
		}
		checkReport(t, out, outDir)
	})

	// Each broken field must make the trainer fail, and for the reason
	// it is meant to: the first three break the alignment of the records
	// (exit 3) or the logprob agreement (exit 2) in the first step; flipped
	// advantages train the policy away from the reward (exit 4).
	for _, c := range []struct {
		field string
		steps int
		codes []int
	}{
		{"tokens", 2, []int{2, 3}},
		{"mask", 2, []int{2, 3}},
		{"logprobs", 2, []int{2, 3}},
		{"advantages", steps, []int{4}},
	} {
		t.Run("corrupt-"+c.field, func(t *testing.T) {
			reset()
			eng.restart(ctx, t)
			out, code := trainer(t, filepath.Join(dir, "corrupt-"+c.field), c.steps, "--corrupt", c.field)
			t.Logf("grpo_cpu.py --corrupt %s output:\n%s", c.field, out)
			ok := false
			for _, want := range c.codes {
				ok = ok || code == want
			}
			if !ok || !strings.Contains(out, "FAILED: ") {
				t.Fatalf("--corrupt %s: exit %d, want one of %v with a FAILED line", c.field, code, c.codes)
			}
		})
	}
}

var (
	agreementLine = regexp.MustCompile(`(?m)^AGREEMENT tokens=(\d+) p50=(\S+) p99=(\S+) max=(\S+) frac_gt_1e-3=(\S+)$`)
	rewardLine    = regexp.MustCompile(`(?m)^REWARD first=(\S+) last=(\S+) `)
	unscoredLine  = regexp.MustCompile(`(?m)^UNSCORED (\d+)$`)
	stepLine      = regexp.MustCompile(`(?m)^step (\d+) policy_version=(\d+) mean_reward=(\S+) `)
)

// checkReport checks the trainer's own verdicts against its numbers, so a
// trainer that printed OK on bad figures fails too.
func checkReport(t *testing.T, out, dir string) {
	t.Helper()
	a := agreementLine.FindStringSubmatch(out)
	r := rewardLine.FindStringSubmatch(out)
	if a == nil || r == nil || !strings.Contains(out, "\nOK\n") {
		t.Fatalf("output lacks the AGREEMENT, REWARD or OK line")
	}
	if n, _ := strconv.Atoi(a[1]); n < steps*groupsPerStep {
		t.Errorf("only %d trained tokens compared", n)
	}
	if p99, err := strconv.ParseFloat(a[3], 64); err != nil || p99 > 1e-3 {
		t.Errorf("p99 |engine - trainer| = %s, want <= 1e-3", a[3])
	}
	// Every sampled id trained (issue 37): llama.cpp's withheld
	// probability entries are recovered by the backend's scoring pass.
	if u := unscoredLine.FindStringSubmatch(out); u == nil || u[1] != "0" {
		t.Errorf("sampled ids without a logprob: %v, want UNSCORED 0", u)
	}
	first, err1 := strconv.ParseFloat(r[1], 64)
	last, err2 := strconv.ParseFloat(r[2], 64)
	if err1 != nil || err2 != nil || last-first < minRise {
		t.Errorf("mean reward %s -> %s: want a rise of at least %v", r[1], r[2], minRise)
	}
	steps := stepLine.FindAllStringSubmatch(out, -1)
	for i, s := range steps {
		if s[1] != strconv.Itoa(i) || s[2] != strconv.Itoa(i) {
			t.Errorf("step line %d has step %s, policy version %s", i, s[1], s[2])
		}
	}
	for _, f := range []string{"metrics.json", "training-proof.png"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Size() == 0 {
			t.Errorf("report file %s missing or empty: %v", f, err)
		}
	}
}

// runPy runs a script of this directory and returns its output and exit
// code (-1 when it did not run to an exit).
func runPy(ctx context.Context, t *testing.T, script string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, proctest.Python(), append([]string{script}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee) && ee.Exited():
		return string(out), ee.ExitCode()
	default:
		t.Fatalf("%s: %v\n%s", script, err, out)
		return "", -1
	}
}

// extract copies one file out of an image.
func extract(ctx context.Context, t *testing.T, img, path, dst string) {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", "run", "--rm", "--label", "io.rollout.test=grpo-cpu", "--network", "none", img, "cat", path)
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("copy %s out of %s: %v\n%s", path, img, err, stderr.String())
	}
}

type engine struct {
	id   string
	port int
}

// startEngine runs llama-server on dir/policy.gguf on a fixed loopback
// port (a restart keeps it), float32 KV cache and no flash attention, so
// its arithmetic is the trainer's (README.md).
func startEngine(ctx context.Context, t *testing.T, img, dir string) *engine {
	t.Helper()
	port := proctest.FreePort(t)
	out, err := exec.CommandContext(ctx, "docker", "run", "-d", "--label", "io.rollout.test=grpo-cpu",
		"-p", fmt.Sprintf("127.0.0.1:%d:8080", port), "-v", dir+":/policy:ro", img,
		"llama-server", "-m", "/policy/policy.gguf", "--jinja", "--host", "0.0.0.0", "--port", "8080",
		"-t", "1", "-c", "8192", "-np", "4", "-fa", "off", "-ctk", "f32", "-ctv", "f32", "--no-prefill-assistant").CombinedOutput()
	if err != nil {
		t.Fatalf("start engine: %v\n%s", err, out)
	}
	e := &engine{id: strings.TrimSpace(string(out)), port: port}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command("docker", "logs", "--tail", "30", e.id).CombinedOutput()
			t.Logf("engine logs:\n%s", logs)
		}
		if out, err := exec.Command("docker", "rm", "-f", e.id).CombinedOutput(); err != nil {
			t.Logf("remove engine container: %v\n%s", err, out)
		}
	})
	e.waitHealthy(ctx, t)
	return e
}

func (e *engine) restart(ctx context.Context, t *testing.T) {
	t.Helper()
	if out, err := exec.CommandContext(ctx, "docker", "restart", "-t", "2", e.id).CombinedOutput(); err != nil {
		t.Fatalf("restart engine: %v\n%s", err, out)
	}
	e.waitHealthy(ctx, t)
}

func (e *engine) waitHealthy(ctx context.Context, t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if healthy(e.port) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("engine on port %d not healthy within 2 minutes", e.port)
}

// healthy asks llama-server's /health with a raw HTTP/1.0 request (no
// client, no pooled connections left behind).
func healthy(port int) bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		return false
	}
	b, _ := io.ReadAll(c)
	return bytes.HasPrefix(b, []byte("HTTP/1.1 200")) || bytes.HasPrefix(b, []byte("HTTP/1.0 200"))
}

// startServe runs `rollout serve` on a free loopback port until the test
// ends; job configs may name files under allow (the env YAML).
func startServe(ctx context.Context, t *testing.T, bin, dataDir, allow string) int {
	t.Helper()
	for attempt := 0; attempt < 3; attempt++ {
		port := proctest.FreePort(t)
		cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:"+strconv.Itoa(port), "--data-dir", dataDir, "--allow-path", allow)
		out := &proctest.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start serve: %v", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		stop := func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(time.Minute):
				_ = cmd.Process.Kill()
				<-exited
			}
		}
		for up := false; !up; {
			select {
			case err := <-exited:
				t.Logf("serve on port %d ended during startup (%v):\n%s", port, err, out.String())
				goto next
			case <-ctx.Done():
				stop()
				t.Fatal(ctx.Err())
			case <-time.After(50 * time.Millisecond):
				if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second); err == nil {
					c.Close()
					up = true
				}
			}
		}
		t.Cleanup(func() {
			stop()
			if t.Failed() {
				t.Logf("serve output:\n%s", out.String())
			}
		})
		return port
	next:
	}
	t.Fatal("rollout serve could not start")
	return 0
}
