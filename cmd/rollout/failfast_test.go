package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/demo"
	"github.com/rollout-rl/rollout/trajectory"
)

// writeRunConfig writes a toolcall-match run config (no sandboxes) for
// endpoint into dir and returns its path. extra is appended verbatim.
func writeRunConfig(t *testing.T, dir, name, endpoint, out, extra string) string {
	t.Helper()
	text := "env: toolcall-match\ngroups: 4\ngroup_size: 2\ninference:\n  backend: vllm\n  endpoints: [" + endpoint +
		"]\nparser: hermes\nsampling: {max_tokens: 256}\noutput:\n  dir: " + out + "\n" + extra
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func startToolcallSim(t *testing.T, ctx context.Context, cfg sim.Config) *sim.Server {
	t.Helper()
	scripts, err := demo.EnvScripts(ctx, "toolcall-match", "train")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Family, cfg.Scripts = "hermes", scripts
	srv, err := sim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// Issue 16, defect 4: `rollout run` against an endpoint nothing listens on
// used to never end. It now fails its start check (ready_timeout, default
// 10s) with exit code 4 and an error naming the endpoint.
func TestRunDeadEndpointFailsFast(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cfg := writeRunConfig(t, dir, "run.yaml", "http://127.0.0.1:1", filepath.Join(dir, "out"), "")
	out, code := runRollout(ctx, "run", "-c", cfg)
	if code != exitUnreachable || !strings.Contains(out, "http://127.0.0.1:1") || !strings.Contains(out, "ready_timeout") {
		t.Fatalf("run against a dead endpoint: exit %d, want %d naming it\n%s", code, exitUnreachable, out)
	}
}

// Issue 16, defect 6: a run whose every rollout failed exited 0; and a
// tokens-mode run offering tools without a parser found out only after a
// generation per rollout.
func TestRunExitStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	// Every generation gets a 500: all rollouts infra_failed → exit 3,
	// rows written.
	srv := startToolcallSim(t, ctx, sim.Config{Faults: sim.Faults{ErrorRate: 1}})
	outDir := filepath.Join(dir, "failing")
	cfg := writeRunConfig(t, dir, "failing.yaml", srv.URL, outDir, "retries: -1\ninference_retries_unused: 0\n")
	if out, code := runRollout(ctx, "run", "-c", cfg); code != exitConfig || !strings.Contains(out, "inference_retries_unused") {
		t.Fatalf("unknown key: exit %d\n%s", code, out)
	}
	cfg = writeRunConfig(t, dir, "failing.yaml", srv.URL, outDir, "retries: -1\n")
	out, code := runRollout(ctx, "run", "-c", cfg)
	if code != exitRunFailed || !strings.Contains(out, "no rollout succeeded") || !strings.Contains(out, "inference 8") {
		t.Fatalf("run with every rollout failed: exit %d, want %d\n%s", code, exitRunFailed, out)
	}
	if m, err := trajectory.ReadManifest(outDir); err != nil || m.Counts.Rows != 8 || m.Counts.InfraFailed != 8 {
		t.Errorf("the failed rollouts should be written: %+v, %v", m, err)
	}

	// Tokens mode, tools offered, no parser: exit 2 before any generation.
	ok := startToolcallSim(t, ctx, sim.Config{})
	cfg = writeRunConfig(t, dir, "noparser.yaml", ok.URL, filepath.Join(dir, "noparser"), "")
	text, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(strings.Replace(string(text), "parser: hermes\n", "", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code = runRollout(ctx, "run", "-c", cfg)
	if code != exitConfig || !strings.Contains(out, "parser: required") {
		t.Fatalf("tokens mode without a parser: exit %d, want %d\n%s", code, exitConfig, out)
	}
	if n := ok.Stats().ByRoute["/v1/completions"]; n != 0 {
		t.Errorf("%d generations before the config error", n)
	}

	// rollout_timeout: -1s is refused naming the field.
	cfg = writeRunConfig(t, dir, "timeout.yaml", ok.URL, filepath.Join(dir, "timeout"), "rollout_timeout: -1s\n")
	if out, code := runRollout(ctx, "run", "-c", cfg); code != exitConfig || !strings.Contains(out, "rollout_timeout") {
		t.Fatalf("rollout_timeout -1s: exit %d\n%s", code, out)
	}

	// The same sim without faults: exit 0.
	cfg = writeRunConfig(t, dir, "ok.yaml", ok.URL, filepath.Join(dir, "ok"), "")
	if out, code := runRollout(ctx, "run", "-c", cfg); code != 0 {
		t.Fatalf("healthy run: exit %d\n%s", code, out)
	}
}

// Issue 16, defect 5: two runs writing one output dir at once. The second
// is refused naming the first; the first's rows and manifest are intact.
func TestTwoRunsOneDir(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv := startToolcallSim(t, ctx, sim.Config{Latency: sim.Latency{TTFT: 300 * time.Millisecond}})
	outDir := filepath.Join(dir, "shared")
	cfg := writeRunConfig(t, dir, "run.yaml", srv.URL, outDir, "limits: {groups_in_flight: 1}\n")
	first := make(chan string, 1)
	go func() {
		out, code := runRollout(ctx, "run", "-c", cfg)
		first <- fmt.Sprintf("exit %d\n%s", code, out)
	}()
	for {
		h, err := trajectory.ReadLockHolder(outDir)
		if err == nil && h != nil && h.PID != 0 {
			break
		}
		select {
		case out := <-first:
			t.Fatalf("the first run ended before the second started: %s", out)
		case <-time.After(10 * time.Millisecond):
		}
	}
	out, code := runRollout(ctx, "run", "-c", cfg)
	if code == 0 || !strings.Contains(out, "in use by another writer") || !strings.Contains(out, fmt.Sprintf("pid %d", os.Getpid())) || !strings.Contains(out, "rollout run") {
		t.Fatalf("second writer: exit %d\n%s", code, out)
	}
	if res := <-first; !strings.HasPrefix(res, "exit 0\n") {
		t.Fatalf("first run: %s", res)
	}
	m, err := trajectory.ReadManifest(outDir)
	if err != nil {
		t.Fatal(err)
	}
	if m.State != trajectory.RunClosed || m.Counts.Rows != 8 || m.Counts.Lost != 0 || m.Error != "" {
		t.Errorf("the first run's manifest: state %s, rows %d, lost %d, error %q", m.State, m.Counts.Rows, m.Counts.Lost, m.Error)
	}
	// Once the first run is done, the directory is free again (resume).
	if out, code := runRollout(ctx, "run", "-c", cfg); code != 0 || !strings.Contains(out, "4 already done") {
		t.Errorf("resume after the first run: exit %d\n%s", code, out)
	}
}

// Issue 16, defect 4, served: a job against a dead endpoint fails naming
// it; a job waiting for its endpoints ends within seconds of `job cancel`;
// a job into a directory another process writes is refused.
func TestServeJobDeadEndpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	addr := "unix://" + filepath.Join(dir, "rollout.sock")
	startServe(t, ctx, addr, "--data-dir", dir)
	job := func(args ...string) (string, int) {
		return runRollout(ctx, append(append([]string{"job"}, args...), "--addr", addr)...)
	}
	dead := "http://127.0.0.1:1"

	cfg := writeRunConfig(t, dir, "dead.yaml", dead, "runs/dead", "")
	out, code := job("start", "-c", cfg, "--id", "dead-1", "--watch")
	if code == 0 || !strings.Contains(out, "FAILED") || !strings.Contains(out, dead) {
		t.Fatalf("job against a dead endpoint: exit %d\n%s", code, out)
	}

	// A long ready_timeout: the job waits for its endpoint (a server
	// still starting); cancel ends it at once.
	cfg = writeRunConfig(t, dir, "waiting.yaml", dead, "runs/waiting", "")
	text, _ := os.ReadFile(cfg)
	text = []byte(strings.Replace(string(text), "  backend: vllm\n", "  backend: vllm\n  ready_timeout: 10m\n", 1))
	if err := os.WriteFile(cfg, text, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := job("start", "-c", cfg, "--id", "wait-1"); code != 0 {
		t.Fatalf("job start: exit %d\n%s", code, out)
	}
	if out, code := job("cancel", "wait-1"); code != 0 {
		t.Fatalf("job cancel: exit %d\n%s", code, out)
	}
	out, code = job("watch", "wait-1")
	if code == 0 || !strings.Contains(out, "CANCELLED") {
		t.Fatalf("cancelled job: exit %d\n%s", code, out)
	}

	// Another process's writer holds the directory: refused, named.
	held, err := trajectory.LockDir(filepath.Join(dir, "runs/held"), "other writer")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock()
	cfg = writeRunConfig(t, dir, "held.yaml", dead, "runs/held", "")
	out, code = job("start", "-c", cfg, "--id", "held-1")
	if code == 0 || !strings.Contains(out, "in use by another writer") || !strings.Contains(out, "other writer") {
		t.Fatalf("job into a held dir: exit %d\n%s", code, out)
	}
}
