package assemble_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/demo"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

var quiet = slog.New(slog.DiscardHandler)

// dyingRun starts a toolcall-match run (no sandboxes) against a simulator
// behind a front over a real socket. Once the first group is written the
// front stops answering (every connection is dropped) and dyingRun returns
// when a rollout in flight has hit it: from then on no endpoint answers and
// a group is waiting for one.
func dyingRun(t *testing.T, ctx context.Context, unreachable time.Duration) (*assemble.Job, string, <-chan error) {
	t.Helper()
	scripts, err := demo.EnvScripts(ctx, "toolcall-match", "train")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sim.Start(ctx, sim.Config{Family: "hermes", Scripts: scripts, Latency: sim.Latency{TTFT: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	target, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	var dead atomic.Bool
	hit := make(chan struct{})
	var hitOnce sync.Once
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !dead.Load() {
			proxy.ServeHTTP(w, r)
			return
		}
		if r.URL.Path != "/health" {
			hitOnce.Do(func() { close(hit) })
		}
		// A dead server: the connection drops without an answer.
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = c.Close()
		}
	}))
	t.Cleanup(front.Close)
	cfg := runner.Config{Env: "toolcall-match", GroupSize: 2, Parser: "hermes",
		Inference: inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{front.URL}, UnreachableTimeout: unreachable},
		Sampling:  inference.Sampling{MaxTokens: 256},
		Limits:    runner.Limits{GroupsInFlight: 1},
		Output:    runner.Output{Dir: t.TempDir()}}
	j, err := assemble.Open(ctx, cfg, assemble.Options{Logger: quiet, Progress: func(e runner.Event) {
		// The group's slot is released after Progress returns, so the
		// next group starts against the dead front.
		if e.Group != nil {
			dead.Store(true)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		_, err := j.Run(ctx)
		res <- err
	}()
	select {
	case <-hit:
	case err := <-res:
		t.Fatalf("the run ended before a rollout met the dead endpoint: %v", err)
	}
	return j, front.URL, res
}

// A run whose every endpoint stops answering fails after
// unreachable_timeout with an error naming them, instead of retrying
// forever.
func TestRunFailsWhenEveryEndpointIsGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, url, res := dyingRun(t, ctx, time.Second)
	err := <-res
	if !errors.Is(err, inference.ErrUnreachable) || !strings.Contains(err.Error(), url) || !strings.Contains(err.Error(), "unreachable_timeout") {
		t.Fatalf("run with its endpoint gone: %v", err)
	}
}

// A stopping run (intake stopped: CancelJob) does not wait
// unreachable_timeout for dead endpoints to come back.
func TestStoppingRunDoesNotWaitForDeadEndpoints(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	j, url, res := dyingRun(t, ctx, time.Hour)
	j.Runner.StopIntake()
	err := <-res
	if !errors.Is(err, inference.ErrUnreachable) || !strings.Contains(err.Error(), url) {
		t.Fatalf("stopping run with its endpoint gone: %v", err)
	}
}

// The start check refuses a dead endpoint at once (ready_timeout), and a
// model the endpoint does not serve as a config error; the same for the
// distillation teacher and its hint judge; nothing runs.
func TestStartCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := sim.Start(ctx, sim.Config{Family: "hermes"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	base := runner.Config{Env: "toolcall-match", GroupSize: 1, Groups: 1, Parser: "hermes",
		Inference: inference.Config{Backend: inference.BackendVLLM, ReadyTimeout: 300 * time.Millisecond}}
	teacher := func(endpoint, model string, hints *inference.HintConfig) *inference.TeacherConfig {
		return &inference.TeacherConfig{Endpoint: endpoint, Model: model, Hints: hints}
	}
	for _, tc := range []struct {
		name      string
		endpoints []string
		model     string
		distill   *inference.TeacherConfig
		want      error
		wantText  string
	}{
		{"dead", []string{"http://127.0.0.1:1"}, "", nil, inference.ErrUnreachable, "http://127.0.0.1:1"},
		{"wrong model", []string{srv.URL}, "no-such-model", nil, runner.ErrConfig, "no-such-model"},
		// The distillation teacher and the hint judge are checked too.
		{"dead teacher", []string{srv.URL}, "", teacher("http://127.0.0.1:1", "rollout-sim", nil), inference.ErrUnreachable, "distill teacher start check"},
		{"wrong teacher model", []string{srv.URL}, "", teacher(srv.URL, "big-teacher", nil), runner.ErrConfig, "big-teacher"},
		{"wrong judge model", []string{srv.URL}, "", teacher(srv.URL, "rollout-sim", &inference.HintConfig{Model: "judge-9b"}), runner.ErrConfig, "distill hint judge start check"},
	} {
		cfg := base
		cfg.Inference.Endpoints, cfg.Inference.Model = tc.endpoints, tc.model
		cfg.Distill = tc.distill
		cfg.Output.Dir = t.TempDir()
		j, err := assemble.Open(ctx, cfg, assemble.Options{Logger: quiet})
		if err != nil {
			t.Fatalf("%s: open: %v", tc.name, err)
		}
		sum, err := j.Run(ctx)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.wantText) || sum.Rollouts != 0 {
			t.Errorf("%s: %v (%d rollouts)", tc.name, err, sum.Rollouts)
		}
		// The lock is released: the directory can be opened again.
		if l, err := assemble.LockOutput(cfg.Output.Dir, "test"); err != nil {
			t.Errorf("%s: the output dir is still locked: %v", tc.name, err)
		} else {
			_ = l.Unlock()
		}
	}
}

// Open refuses a second writer of a run directory, naming the holder, and
// releases the lock when it fails.
func TestOpenTakesTheOutputLock(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := runner.Config{Env: "toolcall-match", Parser: "hermes", Output: runner.Output{Dir: dir},
		Inference: inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{"http://127.0.0.1:1"}}}
	j, err := assemble.Open(ctx, cfg, assemble.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	_, err = assemble.Open(ctx, cfg, assemble.Options{Logger: quiet, Mode: assemble.ModeEval})
	var le *trajectory.LockedError
	if !errors.Is(err, assemble.ErrOutputInUse) || !errors.As(err, &le) || le.Holder == nil || le.Holder.Owner != "rollout run" {
		t.Fatalf("second writer: %v", err)
	}
	if err := j.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// A config error in the preflight releases the lock too.
	bad := cfg
	bad.Parser = ""
	if _, err := assemble.Open(ctx, bad, assemble.Options{Logger: quiet}); !errors.Is(err, runner.ErrConfig) || !strings.Contains(err.Error(), "parser") {
		t.Fatalf("tokens mode with tools and no parser: %v", err)
	}
	j, err = assemble.Open(ctx, cfg, assemble.Options{Logger: quiet})
	if err != nil {
		t.Fatalf("after Close: %v", err)
	}
	_ = j.Close(ctx)
}

// agentic-opd's hints need a teacher: asked for without one, Open refuses
// the config (and releases the run directory); with the run config's
// distill block, the env's hints apply to that teacher.
func TestHintsNeedATeacher(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := runner.Config{Env: "agentic-opd", Parser: "hermes", Output: runner.Output{Dir: dir},
		Inference: inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{"http://127.0.0.1:1"}}}
	if err := cfg.EnvConfig.Encode(map[string]any{"hints": true}); err != nil {
		t.Fatal(err)
	}
	if _, err := assemble.Open(ctx, cfg, assemble.Options{Logger: quiet}); !errors.Is(err, runner.ErrConfig) || !strings.Contains(err.Error(), "needs a teacher") {
		t.Fatalf("hints without a teacher: %v", err)
	}
	cfg.Distill = &inference.TeacherConfig{Endpoint: "http://127.0.0.1:1", Model: "t", Hints: &inference.HintConfig{Votes: -2}}
	if _, err := assemble.Open(ctx, cfg, assemble.Options{Logger: quiet}); !errors.Is(err, runner.ErrConfig) || !strings.Contains(err.Error(), "hints.votes") {
		t.Fatalf("the distill block's own hints are used: %v", err)
	}
	cfg.Distill.Hints = nil
	j, err := assemble.Open(ctx, cfg, assemble.Options{Logger: quiet})
	if err != nil {
		t.Fatalf("hints on the run config's teacher: %v", err)
	}
	_ = j.Close(ctx)
}

// A chat template tokens mode cannot work with is a configuration error
// found by the start check, before any rollout: Llama 3.1 in ipython mode
// (chat_template_kwargs builtin_tools) ends a turn that calls a tool with
// <|eom_id|>, not the <|eot_id|> that closes its other turns.
func TestStartCheckTemplate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := sim.Start(ctx, sim.Config{Family: "llama3_json"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, tc := range []struct {
		name   string
		kwargs map[string]any
		want   error
	}{
		{"ipython mode", map[string]any{"builtin_tools": []any{"brave_search"}}, runner.ErrConfig},
		{"json tools", nil, nil},
	} {
		cfg := runner.Config{Env: "toolcall-match", GroupSize: 1, Groups: 1, Parser: "llama3_json",
			Inference: inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}},
			Sampling:  inference.Sampling{MaxTokens: 64, ChatTemplateKwargs: tc.kwargs}}
		cfg.Output.Dir = t.TempDir()
		j, err := assemble.Open(ctx, cfg, assemble.Options{Logger: quiet})
		if err != nil {
			t.Fatalf("%s: open: %v", tc.name, err)
		}
		err = j.StartCheck(ctx)
		_ = j.Close(ctx)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) || !errors.Is(err, inference.ErrTemplate) || !strings.Contains(err.Error(), "does not end with the assistant closing") {
			t.Errorf("%s: %v, want a config error naming the template problem", tc.name, err)
		}
	}
}

// The teacher scores a harness env's session branches, but hints judge
// the own loop's turns: a config asking for hints on a harness env fails
// at Open with a clear error, before any rollout; distillation without
// hints opens.
func TestDistillHintsRefusedForHarnessEnv(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	env := filepath.Join(dir, "harness.yaml")
	yaml := "name: h\nprompt: do it\nsandbox: {image: rollout-harness:sid}\n" +
		"harness: {command: \"python3 /opt/agent.py\", apis: [openai]}\n" +
		"items: [{id: a}]\nrewards: [{type: exit_code, command: \"true\"}]\n"
	if err := os.WriteFile(env, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := runner.Config{Env: env, Parser: "hermes", Output: runner.Output{Dir: filepath.Join(dir, "out")},
		Inference: inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{"http://127.0.0.1:1"}},
		Distill:   &inference.TeacherConfig{Endpoint: "http://127.0.0.1:1", Model: "t", Hints: &inference.HintConfig{}}}
	_, err := assemble.Open(ctx, cfg, assemble.Options{Logger: quiet})
	if !errors.Is(err, runner.ErrConfig) || !strings.Contains(err.Error(), "not implemented for harness envs") {
		t.Fatalf("distill hints on a harness env: %v", err)
	}
	for _, d := range []*inference.TeacherConfig{{Endpoint: "http://127.0.0.1:1", Model: "t"}, nil} {
		cfg.Distill = d
		j, err := assemble.Open(ctx, cfg, assemble.Options{Logger: quiet})
		if err != nil {
			t.Fatalf("harness env, distill %+v: %v", d, err)
		}
		_ = j.Close(ctx)
	}
}
