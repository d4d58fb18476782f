package assemble

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

// A run directory resumes only under a config that defines the same groups.
func TestSameRun(t *testing.T) {
	base := runner.Config{Env: "terminal-tasks", GroupSize: 4, Seed: 3,
		Inference: inference.Config{Backend: "vllm", Endpoints: []string{"http://127.0.0.1:1"}}}
	prior, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	same := base
	same.Limits.RolloutsInFlight = 7 // concurrency may change
	same.Inference.Endpoints = []string{"http://127.0.0.1:2"}
	if err := sameRun(prior, same); err != nil {
		t.Fatalf("same groups refused: %v", err)
	}
	other := base
	other.GroupSize = 8
	if err := sameRun(prior, other); err == nil || !strings.Contains(err.Error(), "group_size 4") {
		t.Fatalf("changed group size: %v", err)
	}
	other = base
	other.Env = "swe-tests"
	if err := sameRun(prior, other); err == nil || !strings.Contains(err.Error(), "env") {
		t.Fatalf("changed env: %v", err)
	}
	if err := sameRun(nil, other); err != nil {
		t.Fatalf("no prior config: %v", err)
	}
	if err := sameRun(json.RawMessage(`{"group_size":"x"}`), base); err == nil || errors.Is(err, runner.ErrConfig) {
		t.Fatalf("unreadable prior config: %v", err)
	}
}

// run.json records the sampler every request states (neutral where the
// config is silent, the config's non-neutral fields named) and, once the
// server has reported it, the server's own view.
func TestManifestRecordsSampler(t *testing.T) {
	srv, err := sim.Start(context.Background(), sim.Config{Engine: sim.EngineLlamaCpp, Family: "hermes", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	topP := 0.9
	cfg := runner.Config{Env: "terminal-tasks", GroupSize: 2, Seed: 1,
		Inference: inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{srv.URL}},
		Sampling:  inference.Sampling{TopP: &topP, MaxTokens: 32}, Parser: "hermes"}
	cfg.Output.Dir = t.TempDir()
	ctx := context.Background()
	j, err := Open(ctx, cfg, Options{Mode: ModeRun, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	read := func() inference.SamplerReport {
		t.Helper()
		m, err := trajectory.ReadManifest(cfg.Output.Dir)
		if err != nil {
			t.Fatal(err)
		}
		var r inference.SamplerReport
		if err := json.Unmarshal(m.Sampler, &r); err != nil {
			t.Fatalf("run.json sampler %s: %v", m.Sampler, err)
		}
		return r
	}
	r := read()
	if r.Backend != "llamacpp" || r.Neutral || len(r.NonNeutral) != 1 || r.NonNeutral[0] != "top_p" ||
		r.Fields["top_p"] != 0.9 || r.Fields["top_k"] != 0.0 || r.Fields["temperature"] != 1.0 || r.Server != nil {
		t.Fatalf("sampler at start: %+v", r)
	}
	// One generation through the job's policy: the server echoes its view.
	c := j.sampler.(*inference.Client)
	ep, err := c.Start(ctx, inference.EpisodeSpec{ID: "m", Sampling: cfg.Sampling})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.Generate(ctx, []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}}); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(ctx); err != nil {
		t.Fatal(err)
	}
	r = read()
	if r.Server == nil || r.Server["top_p"] != 0.9 || r.Server["top_k"] != 0.0 || len(r.Mismatch) != 0 {
		t.Fatalf("server view: %+v", r)
	}
}

// teacherConfig: agentic-opd's hints: true puts default hints on whichever
// teacher the run uses (the run config's distill block here), keeps a
// hints block the teacher already has, and leaves the caller's config
// unchanged.
func TestTeacherConfigHints(t *testing.T) {
	env, err := envs.New("agentic-opd", yamlNode(t, "hints: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	distill := &inference.TeacherConfig{Endpoint: "http://t:8000", Model: "t"}
	got, err := teacherConfig(runner.Config{Distill: distill}, env)
	if err != nil || got == nil || got.Hints == nil || got.Hints.Votes != 0 {
		t.Fatalf("hints on the run config's teacher: %+v, %v", got, err)
	}
	if distill.Hints != nil {
		t.Fatal("the run config's teacher was changed")
	}
	own := &inference.HintConfig{Votes: 5}
	distill.Hints = own
	if got, _ = teacherConfig(runner.Config{Distill: distill}, env); got.Hints != own {
		t.Fatalf("the teacher's own hints block was replaced: %+v", got.Hints)
	}
	plain, err := envs.New("agentic-opd", nil)
	if err != nil {
		t.Fatal(err)
	}
	distill.Hints = nil
	if got, _ = teacherConfig(runner.Config{Distill: distill}, plain); got.Hints != nil {
		t.Fatal("hints turned on without hints: true")
	}
}

func yamlNode(t *testing.T, text string) *yaml.Node {
	t.Helper()
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(text), &n); err != nil {
		t.Fatal(err)
	}
	return n.Content[0]
}
