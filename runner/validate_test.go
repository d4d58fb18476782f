package runner

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/rewards"
)

// Every numeric field is range-checked before anything runs, and the
// error names the field by its YAML path.
func TestValidateRanges(t *testing.T) {
	const base = "env: unit\ninference:\n  endpoints: [http://127.0.0.1:1]\n"
	for _, tc := range []struct {
		yaml, field string
	}{
		{"rollout_timeout: -1s", "rollout_timeout"},
		{"sandbox: {reuse: true}", "sandbox.reuse"},
		{"sandbox: {reuse: true, read_only_root: true, runtime: runsc}", "sandbox.reuse"},
		{"sandbox: {reuse: true, read_only_root: true, warm_pool: -1}", "sandbox.reuse"},
		{"sandbox: {reuse: true, read_only_root: true, backend: kubernetes}", "sandbox.reuse"},
		{"async: {max_staleness: -1}", "async.max_staleness"},
		{"async: {max_staleness: 1, on_stale: keep}", "async.on_stale"},
		{"async: {on_stale: drop}", "async.on_stale"},
		{"async: {max_staleness: 1, max_regenerations: -1}", "async.max_regenerations"},
		{"reward_timeout: -5m", "reward_timeout"},
		{"max_consecutive_invalid: -1", "max_consecutive_invalid"},
		{"sampling: {temperature: -0.5}", "sampling.temperature"},
		{"sampling: {top_p: 0}", "sampling.top_p"},
		{"sampling: {top_p: 1.5}", "sampling.top_p"},
		{"sampling: {top_k: -2}", "sampling.top_k"},
		{"sampling: {min_p: 2}", "sampling.min_p"},
		{"sampling: {max_tokens: -1}", "sampling.max_tokens"},
		{"sampling: {repetition_penalty: 0}", "sampling.repetition_penalty"},
		{"sampling: {presence_penalty: 3}", "sampling.presence_penalty"},
		{"sampling: {frequency_penalty: -2.5}", "sampling.frequency_penalty"},
		{"sampling: {stop: [\"\"]}", "sampling.stop[0]"},
		{"sampling: {temperature: .nan}", "sampling.temperature"},
		{"parser: nonesuch", "parser"},
		{"reasoning_parser: nonesuch", "reasoning_parser"},
		{"output: {max_rows_per_file: -3}", "output.max_rows_per_file"},
		{"eval: {k: -1}", "eval.k"},
		{"dataset: {path: x.jsonl, limit: -1}", "dataset.limit"},
		{"max_infra_failed_fraction: 1.5", "max_infra_failed_fraction"},
		{"max_infra_failed_fraction: -0.1", "max_infra_failed_fraction"},
		{"atropos: {weight: -1}", "atropos.weight"},
		{"atropos: {min_batch_allocation: 2}", "atropos.min_batch_allocation"},
	} {
		cfg, err := ParseConfig([]byte(base + tc.yaml + "\n"))
		if err != nil {
			t.Fatalf("%s: parse: %v", tc.yaml, err)
		}
		err = cfg.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), ": "+tc.field+": ") {
			t.Errorf("%s: %v, want a config error naming %s", tc.yaml, err, tc.field)
		}
	}
	for _, tc := range []struct {
		yaml, field string
	}{
		{"timeout: -1s", "inference.timeout"},
		{"health_timeout: -1s", "inference.health_timeout"},
		{"ready_timeout: -1s", "inference.ready_timeout"},
		{"unreachable_timeout: -1s", "inference.unreachable_timeout"},
		{"backoff_base: 10s\n  backoff_max: 1s", "inference.backoff_base"},
		{"retries: -2", "inference.retries"},
		{"breaker_failures: -1", "inference.breaker_failures"},
		{"max_concurrent_per_endpoint: -1", "inference.max_concurrent_per_endpoint"},
		{"sampling: {top_p: -1}", "inference.sampling.top_p"},
	} {
		cfg, err := ParseConfig([]byte(base + "  " + tc.yaml + "\n"))
		if err != nil {
			t.Fatalf("%s: parse: %v", tc.yaml, err)
		}
		err = cfg.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), ": "+tc.field+": ") {
			t.Errorf("%s: %v, want a config error naming %s", tc.yaml, err, tc.field)
		}
	}
	// Zero means the default; in-range values pass.
	cfg, err := ParseConfig([]byte(base + "rollout_timeout: 0s\nparser: hermes\nmax_infra_failed_fraction: 0\n" +
		"sampling: {temperature: 0, top_p: 1, top_k: -1, min_p: 0, max_tokens: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("valid config refused: %v", err)
	}
	if got := cfg.MaxInfraFailed(); got != 0 {
		t.Errorf("max_infra_failed_fraction 0 read as %v", got)
	}
	if got := (Config{}).MaxInfraFailed(); got != DefaultMaxInfraFailedFraction {
		t.Errorf("default max_infra_failed_fraction: %v", got)
	}
}

// toolEnv offers a call-only tool on the items whose "tools" field is
// true (toolcall-match's shape).
type toolEnv struct{ scoreEnv }

func (e *toolEnv) Task(ctx context.Context, it datasets.Item) (envs.Task, error) {
	task, err := e.scoreEnv.Task(ctx, it)
	if on, _ := it.Data["tools"].(bool); on {
		task.CallOnly = []openai.Tool{{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{Name: "get_weather"}}}
	}
	return task, err
}

// A tokens-mode backend offering tools without a parser is a config error
// found before any generation (it used to cost a generation per rollout and
// end in config_error rollouts and exit 0).
func TestParserRequiredBeforeAnyGeneration(t *testing.T) {
	its := items(3)
	for i := range its {
		its[i].Data["tools"] = true
	}
	env := &toolEnv{scoreEnv{items: its, reward: func(envs.Outcome) (rewards.Score, error) { return rewards.Score{Value: 1}, nil }}}
	cfg := baseConfig()
	cfg.Inference.Backend = "vllm"
	pol := &scriptPolicy{}
	sink := &memSink{}
	r, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: pol, Sinks: []Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Preflight(context.Background())
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "parser: required") || !strings.Contains(err.Error(), "get_weather") {
		t.Fatalf("Preflight: %v", err)
	}
	if _, err := r.Run(context.Background()); !errors.Is(err, ErrConfig) {
		t.Fatalf("Run: %v", err)
	}
	if n := pol.calls.Load(); n != 0 || len(sink.groups) != 0 {
		t.Errorf("%d generations and %d groups after a config error", n, len(sink.groups))
	}

	// With a parser, or with the chat backend (the server parses), it runs.
	for _, fix := range []func(*Config){
		func(c *Config) { c.Parser = "hermes" },
		func(c *Config) { c.Inference.Backend = "chat" },
	} {
		c := cfg
		c.Groups = 1
		fix(&c)
		r, err := New(c, Deps{Logger: quiet, Env: env, Policy: &scriptPolicy{}})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Preflight(context.Background()); err != nil {
			t.Errorf("parser %q backend %s: %v", c.Parser, c.Inference.Backend, err)
		}
	}

	// Only a later item offers tools: its group fails as a task error,
	// still without spending a generation on it.
	its = items(2)
	its[1].Data["tools"] = true
	env = &toolEnv{scoreEnv{items: its, reward: func(envs.Outcome) (rewards.Score, error) { return rewards.Score{Value: 1}, nil }}}
	var asked sync.Map
	pol = &scriptPolicy{fail: func(prompt string) error { asked.Store(prompt, true); return nil }}
	c := cfg
	c.GroupSize = 2
	r, err = New(c, Deps{Logger: quiet, Env: env, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := asked.Load("q1"); ok || sum.FailuresByKind[FailTask] != 2 {
		t.Errorf("summary %+v: want item-1's 2 rollouts failed as task errors without a generation", sum)
	}
	if _, ok := asked.Load("q0"); !ok {
		t.Error("item-0 (no tools) was not generated")
	}
}

func TestDistillConfigChecks(t *testing.T) {
	base := Config{Env: "guess-number", Inference: inference.Config{Backend: "vllm", Endpoints: []string{"http://127.0.0.1:1"}}}
	for _, c := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Distill = &inference.TeacherConfig{Model: "t"} }, "distill: endpoint and model"},
		{func(c *Config) { c.Distill = &inference.TeacherConfig{Endpoint: "http://t", Model: "t", TopK: -2} }, "distill.top_k"},
		{func(c *Config) {
			c.Distill = &inference.TeacherConfig{Endpoint: "http://t", Model: "t"}
			c.Inference.Backend = inference.BackendChat
		}, "token ids"},
	} {
		cfg := base
		c.mod(&cfg)
		if err := cfg.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want %q, got %v", c.want, err)
		}
	}
	ok := base
	ok.Distill = &inference.TeacherConfig{Endpoint: "http://t", Model: "t"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	ok.Inference.Backend, ok.Inference.ChatTokenIDs = inference.BackendChat, true
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
}

// docs/security.md's limits table, the refused rows: every key a backend
// cannot enforce is a config error naming the key and the backend, before
// anything runs; the same key on a backend that enforces it passes.
func TestValidateLimitsPerBackend(t *testing.T) {
	const base = "env: unit\ninference:\n  endpoints: [http://127.0.0.1:1]\n"
	for _, tc := range []struct {
		sandbox, field string // field "" = accepted
	}{
		{"{backend: kubernetes, pids: 256}", "sandbox.pids"},
		{"{backend: kubernetes, runtime: runsc}", "sandbox.runtime"},
		{"{backend: kubernetes, network: bridge}", "sandbox.network"},
		{"{backend: runc, network: bridge}", "sandbox.network"},
		{"{backend: runc, network: open}", "sandbox.network"},
		{"{backend: runc, runtime: runsc}", "sandbox.runtime"},
		{"{backend: kubernetes, read_only_root: true, reuse: true}", "sandbox.reuse"},
		{"{backend: kubernetes, memory_mb: 256, cpus: 0.5, disk_mb: 512, read_only_root: true, network: open}", ""},
		{"{backend: kubernetes, network: none}", ""},
		{"{backend: docker, pids: 256, runtime: runsc, network: none}", ""},
		{"{backend: docker, network: bridge}", ""},
		{"{backend: runc, pids: 256, memory_mb: 256, cpus: 0.5, disk_mb: 512, read_only_root: true, reuse: true}", ""},
	} {
		cfg, err := ParseConfig([]byte(base + "sandbox: " + tc.sandbox + "\n"))
		if err != nil {
			t.Fatalf("%s: parse: %v", tc.sandbox, err)
		}
		err = cfg.Validate()
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v, want it accepted", tc.sandbox, err)
			}
			continue
		}
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), ": "+tc.field+": ") {
			t.Errorf("%s: %v, want a config error naming %s", tc.sandbox, err, tc.field)
			continue
		}
		backend := strings.TrimSuffix(strings.Fields(strings.TrimPrefix(tc.sandbox, "{backend: "))[0], ",")
		if !strings.Contains(err.Error(), backend) {
			t.Errorf("%s: %v does not name the %s backend", tc.sandbox, err, backend)
		}
	}
}
