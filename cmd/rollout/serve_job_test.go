package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/demo"
)

// runRollout runs the CLI in-process and returns its output and exit code.
func runRollout(ctx context.Context, args ...string) (string, int) {
	root := newRootCmd()
	var out bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.ExecuteContext(ctx)
	code := 0
	if err != nil {
		code = 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		}
		out.WriteString("\nerror: " + err.Error())
	}
	return out.String(), code
}

// startServe runs `rollout serve --listen addr ARGS...` in the background
// until it answers `rollout job list`. The returned stop cancels it (as a
// signal would) and fails the test unless it shuts down cleanly.
func startServe(t *testing.T, ctx context.Context, addr string, args ...string) (stop func()) {
	t.Helper()
	serveCtx, cancel := context.WithCancel(ctx)
	served := make(chan string, 1)
	go func() {
		out, code := runRollout(serveCtx, append([]string{"serve", "--listen", addr}, args...)...)
		if code != 0 {
			out += "\nexit code " + strconv.Itoa(code)
		}
		served <- out
	}()
	for {
		if _, code := runRollout(ctx, "job", "list", "--addr", addr); code == 0 {
			break
		}
		select {
		case out := <-served:
			cancel()
			t.Fatalf("serve ended early:\n%s", out)
		case <-ctx.Done():
			cancel()
			t.Fatal("the server never came up")
		case <-time.After(20 * time.Millisecond):
		}
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case out := <-served:
				if strings.Contains(out, "exit code") {
					t.Errorf("serve did not stop cleanly:\n%s", out)
				}
			case <-time.After(3 * time.Minute):
				t.Fatal("serve did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestServeAndJobCommands serves on a unix socket and drives it with
// `rollout job ...`, then stops the server as a signal would.
func TestServeAndJobCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	scripts, err := demo.EnvScripts(ctx, "toolcall-match", "train")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sim.Start(ctx, sim.Config{Family: "hermes", Scripts: scripts})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	dir := t.TempDir()
	cfg := filepath.Join(dir, "run.yaml")
	text := "env: toolcall-match\ngroups: 3\ngroup_size: 2\ninference:\n  backend: vllm\n  endpoints: [" + srv.URL + "]\nparser: hermes\nsampling: {max_tokens: 256}\noutput:\n  dir: runs/default\n"
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "unix://" + filepath.Join(dir, "rollout.sock")

	stopServe := startServe(t, ctx, addr, "--data-dir", dir)
	job := func(args ...string) (string, int) {
		return runRollout(ctx, append(append([]string{"job"}, args...), "--addr", addr)...)
	}

	out, code := job("start", "-c", cfg, "--id", "cli-1", "--out", "runs/cli", "--groups", "2", "--watch", "--include-groups")
	if code != 0 || !strings.Contains(out, "SUCCEEDED") || !strings.Contains(out, "group ") {
		t.Fatalf("job start --watch: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, filepath.Join(dir, "runs/cli")) {
		t.Errorf("--out did not reach the server:\n%s", out)
	}
	out, code = job("get", "cli-1", "--json")
	if code != 0 || !strings.Contains(out, `"state": "JOB_STATE_SUCCEEDED"`) || !strings.Contains(out, `"groups_done": 2`) {
		t.Errorf("job get --json: exit %d\n%s", code, out)
	}
	// A second job started without --watch prints only its id.
	out, code = job("start", "-c", cfg)
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "job_") || strings.Contains(id, "\n") {
		t.Fatalf("job start: exit %d\n%s", code, out)
	}
	out, code = job("watch", id, "--json")
	if code != 0 || !strings.Contains(out, `"finished"`) {
		t.Errorf("job watch --json: exit %d\n%s", code, out)
	}
	out, code = job("list")
	if code != 0 || !strings.Contains(out, "cli-1") || !strings.Contains(out, id) || !strings.Contains(out, "SUCCEEDED") {
		t.Errorf("job list: exit %d\n%s", code, out)
	}
	out, code = job("cancel", "cli-1")
	if code != 0 || !strings.Contains(out, "already ended") {
		t.Errorf("job cancel of an ended job: exit %d\n%s", code, out)
	}
	if out, code = job("get", "nope"); code != 1 || !strings.Contains(out, "not found") {
		t.Errorf("job get of an unknown id: exit %d\n%s", code, out)
	}
	if out, code = job("start", "-c", cfg, "--out", "/etc/rollout-test"); code != 1 || !strings.Contains(out, "outside the server's data dir") {
		t.Errorf("job start outside the data dir: exit %d\n%s", code, out)
	}
	if out, code = job("start", "-c", cfg, "--groups", "-3"); code != 2 || !strings.Contains(out, "groups") {
		t.Errorf("job start with invalid groups: exit %d\n%s", code, out)
	}
	if out, code = job("start"); code != 2 {
		t.Errorf("job start without -c: exit %d\n%s", code, out)
	}

	stopServe()
	if _, err := os.Stat(filepath.Join(dir, ".rollout-server", "jobs", "cli-1.json")); err != nil {
		t.Errorf("job state not kept in the default state dir: %v", err)
	}
}

func TestServeRefusals(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:0"}, "non-loopback"},
		{[]string{"--listen", ":0"}, "non-loopback"},
		{[]string{"--tls-cert", "x.pem"}, "--tls-cert and --tls-key"},
		{[]string{"--auth-token-file", filepath.Join(dir, "missing")}, "auth token"},
		{[]string{"--max-msg-size", "0"}, "--max-msg-size"},
		{[]string{"--tenants-file", filepath.Join(dir, "missing.yaml")}, "tenants"},
		{[]string{"--allow-net", "10.0.0.0/33"}, "--allow-net"},
	} {
		out, code := runRollout(ctx, append([]string{"serve", "--data-dir", dir}, tc.args...)...)
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("serve %v: exit %d, want 2 with %q\n%s", tc.args, code, tc.want, out)
		}
	}
}

func TestSetYAML(t *testing.T) {
	in := "# run\nenv: toolcall-match\noutput:\ngroups: 5\ninference: {endpoints: [http://x]}\n"
	out, err := setYAML([]byte(in), []yamlSet{{[]string{"output", "dir"}, "runs/x", "!!str"}, {[]string{"groups"}, "2", "!!int"},
		{[]string{"sandbox", "image"}, "img:1", "!!str"}})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Env       string
		Groups    int
		Output    struct{ Dir string }
		Sandbox   struct{ Image string }
		Inference struct{ Endpoints []string }
	}
	if err := yaml.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if got.Env != "toolcall-match" || got.Groups != 2 || got.Output.Dir != "runs/x" || got.Sandbox.Image != "img:1" || len(got.Inference.Endpoints) != 1 {
		t.Errorf("setYAML:\n%s", out)
	}
	if _, err := setYAML([]byte("env: x\ngroups: {a: 1}\n"), []yamlSet{{[]string{"groups", "x", "y"}, "1", "!!int"}}); err != nil {
		t.Errorf("nested mapping: %v", err)
	}
	if _, err := setYAML([]byte("- a\n"), []yamlSet{{[]string{"groups"}, "1", "!!int"}}); err == nil {
		t.Error("a YAML list accepted as a run config")
	}
	if _, err := setYAML([]byte("env: x\n"), []yamlSet{{[]string{"env", "dir"}, "1", "!!int"}}); err == nil {
		t.Error("a scalar treated as a mapping")
	}
}
