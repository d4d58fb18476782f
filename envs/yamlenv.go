package envs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/tools/mcp"
)

// YAMLSpec defines an env in YAML alone: a prompt template, a sandbox, the
// toolsets, a dataset and weighted rewards. Text fields marked "template"
// are Go text/templates over the item's fields ({{.question}}); a missing
// field is an error naming the item.
type YAMLSpec struct {
	Name         string          `yaml:"name"`
	Description  string          `yaml:"description"`
	SystemPrompt string          `yaml:"system_prompt"`
	Prompt       string          `yaml:"prompt"` // template
	Answer       string          `yaml:"answer"` // template; the reference answer
	Category     string          `yaml:"category"`
	Toolsets     []string        `yaml:"toolsets"`
	MaxTurns     int             `yaml:"max_turns"`
	GroupSize    int             `yaml:"group_size"`
	Sandbox      *YAMLSandbox    `yaml:"sandbox"`
	Dataset      datasets.Config `yaml:"dataset"`
	// Items may be given inline instead of a dataset.
	Items   []map[string]any `yaml:"items"`
	Rewards []rewards.Spec   `yaml:"rewards"` // command, path, want, report and regex are templates
	// MCPServers offer MCP servers' tools (docs/mcp.md); command servers
	// need the sandbox.
	MCPServers []mcp.Server `yaml:"mcp_servers"`
	// Responder answers the model turn by turn (docs/env-feedback.md).
	Responder *ResponderSpec `yaml:"responder,omitempty"`
	// Harness runs an outside agent harness in the sandbox instead of the
	// own agent loop (docs/gateway.md, "Train your own agent").
	Harness *YAMLHarness `yaml:"harness,omitempty"`
	// EnvServer plays each rollout's episode on an env server of an
	// environment protocol (docs/env-protocols.md): its tools, rewards and
	// end of episode.
	EnvServer *YAMLEnvServer `yaml:"env_server,omitempty"`
}

// YAMLHarness is the harness part of a YAMLSpec (envs.Harness).
type YAMLHarness struct {
	Command   string            `yaml:"command"`
	APIs      []string          `yaml:"apis"`
	PromptVia string            `yaml:"prompt_via"`
	Budget    string            `yaml:"budget"` // a Go duration ("5m")
	Port      int               `yaml:"port"`
	Env       map[string]string `yaml:"env"`
	MaxCalls  int               `yaml:"max_calls"`
}

// harness converts y into an envs.Harness (Prompt set per task; a
// templated command or budget rendered per item).
func (y *YAMLHarness) harness() (*Harness, error) {
	h := &Harness{Command: y.Command, APIs: y.APIs, PromptVia: y.PromptVia, Port: y.Port, Env: y.Env, MaxCalls: y.MaxCalls}
	if y.Budget != "" && !strings.Contains(y.Budget, "{{") {
		d, err := time.ParseDuration(y.Budget)
		if err != nil {
			return nil, fmt.Errorf("%w: harness.budget: %v", ErrConfig, err)
		}
		h.Budget = d
	}
	if h.PromptVia == "" {
		h.PromptVia = PromptStdin
	}
	if h.Port == 0 {
		h.Port = DefaultHarnessPort
	}
	return h, h.Validate()
}

// itemHarness is the env's harness for one item: command and budget
// rendered from the item's fields when they are templates.
func (e *YAMLEnv) itemHarness(it datasets.Item) (*Harness, error) {
	h := *e.harness
	var err error
	if h.Command, err = render("harness.command", h.Command, it); err != nil {
		return nil, err
	}
	if b := e.spec.Harness.Budget; strings.Contains(b, "{{") {
		s, err := render("harness.budget", b, it)
		if err != nil {
			return nil, err
		}
		if h.Budget, err = time.ParseDuration(s); err != nil || h.Budget < 0 {
			return nil, fmt.Errorf("%w: %s row %d: harness.budget %q: not a non-negative duration", datasets.ErrInvalid, it.Source, it.Row, s)
		}
	}
	return &h, nil
}

// YAMLSandbox is the sandbox part of a YAMLSpec.
type YAMLSandbox struct {
	Image        string            `yaml:"image"`
	Workdir      string            `yaml:"workdir"`
	User         string            `yaml:"user"`
	Network      string            `yaml:"network"`
	Env          map[string]string `yaml:"env"`
	MemoryMB     int64             `yaml:"memory_mb"`
	CPUs         float64           `yaml:"cpus"`
	PIDs         int64             `yaml:"pids"`
	ReadOnlyRoot bool              `yaml:"read_only_root"`
	DiskMB       int64             `yaml:"disk_mb"`
	Runtime      string            `yaml:"runtime"`
	Files        []struct {
		Path    string `yaml:"path"`
		Content string `yaml:"content"` // template
		Mode    uint32 `yaml:"mode"`
	} `yaml:"files"`
}

// YAMLEnv is an env defined by a YAMLSpec.
type YAMLEnv struct {
	spec    YAMLSpec
	baseDir string
	prompt  *template.Template
	resp    itemResponder // nil without a responder block
	harness *Harness      // nil without a harness block
	server  *envServer    // nil without an env_server block
}

var (
	_ Env        = (*YAMLEnv)(nil)
	_ Solver     = (*YAMLEnv)(nil)
	_ Responsive = (*YAMLEnv)(nil)
	_ Sessioned  = (*YAMLEnv)(nil)
	_ Harnessed  = (*YAMLEnv)(nil)
)

// RunsHarness implements Harnessed: the env has a harness block.
func (e *YAMLEnv) RunsHarness() bool { return e.harness != nil }

// Solution implements Solver: an item's optional "solution" field (the
// simulator's script), for demos and tests of YAML envs.
func (e *YAMLEnv) Solution(it datasets.Item) (json.RawMessage, bool) { return solution(it) }

// LoadFile reads a YAML env definition. Unknown keys are errors with line
// numbers; a relative dataset path is relative to the file.
func LoadFile(path string) (*YAMLEnv, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("env file: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var spec YAMLSpec
	if err := dec.Decode(&spec); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrConfig, path, err)
	}
	e, err := NewYAMLEnv(spec, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return e, nil
}

// NewYAMLEnv validates spec; baseDir resolves a relative dataset path.
func NewYAMLEnv(spec YAMLSpec, baseDir string) (*YAMLEnv, error) {
	if spec.Name == "" {
		return nil, fmt.Errorf("%w: name is required", ErrConfig)
	}
	server, err := buildEnvServer(spec.EnvServer)
	if err != nil {
		return nil, err
	}
	if err := checkEnvServer(spec, server); err != nil {
		return nil, err
	}
	if spec.Prompt == "" && (server == nil || !server.prompts()) {
		return nil, fmt.Errorf("%w: prompt is required", ErrConfig)
	}
	if (spec.Dataset.Path == "") == (len(spec.Items) == 0) {
		return nil, fmt.Errorf("%w: give exactly one of dataset.path and items", ErrConfig)
	}
	if len(spec.Rewards) == 0 && server == nil {
		return nil, fmt.Errorf("%w: at least one reward is required (types: %s)", ErrConfig, strings.Join(rewards.Types, ", "))
	}
	// Validate reward specs once with placeholder-free fields: templates
	// are rendered per item, so only the shape is checked here.
	for i, r := range spec.Rewards {
		if !containsTemplate(r) {
			if _, err := rewards.Build(r); err != nil {
				return nil, fmt.Errorf("%w: rewards[%d]: %v", ErrConfig, i, err)
			}
		}
	}
	if spec.Sandbox != nil && spec.Sandbox.Image == "" {
		return nil, fmt.Errorf("%w: sandbox.image is required when sandbox is set", ErrConfig)
	}
	if err := mcp.Validate(spec.MCPServers); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if mcp.NeedsSandbox(spec.MCPServers) && spec.Sandbox == nil {
		return nil, fmt.Errorf("%w: mcp_servers: a command server runs in the sandbox; set sandbox", ErrConfig)
	}
	if sb := spec.Sandbox; sb != nil {
		for _, f := range []struct {
			name string
			neg  bool
		}{{"memory_mb", sb.MemoryMB < 0}, {"cpus", sb.CPUs < 0}, {"pids", sb.PIDs < 0}, {"disk_mb", sb.DiskMB < 0}} {
			if f.neg {
				return nil, fmt.Errorf("%w: sandbox.%s: must not be negative (0 = the default)", ErrConfig, f.name)
			}
		}
	}
	t, err := template.New("prompt").Option("missingkey=error").Parse(spec.Prompt)
	if err != nil {
		return nil, fmt.Errorf("%w: prompt template: %v", ErrConfig, err)
	}
	if spec.Dataset.Path != "" && !filepath.IsAbs(spec.Dataset.Path) {
		spec.Dataset.Path = filepath.Join(baseDir, spec.Dataset.Path)
	}
	if spec.MaxTurns == 0 {
		spec.MaxTurns = 10
	}
	if spec.GroupSize == 0 {
		spec.GroupSize = 4
	}
	resp, err := buildResponder(spec.Responder)
	if err != nil {
		return nil, err
	}
	var h *Harness
	if spec.Harness != nil {
		if h, err = spec.Harness.harness(); err != nil {
			return nil, err
		}
		switch {
		case spec.Sandbox == nil:
			return nil, fmt.Errorf("%w: harness: a harness runs in the sandbox; set sandbox (an image with the harness installed)", ErrConfig)
		case len(spec.Toolsets) > 0 || len(spec.MCPServers) > 0:
			return nil, fmt.Errorf("%w: harness: toolsets and mcp_servers are the own agent loop's; a harness brings its own tools", ErrConfig)
		case spec.Responder != nil:
			return nil, fmt.Errorf("%w: harness: a responder answers the own agent loop turn by turn; a harness env has none", ErrConfig)
		}
	}
	return &YAMLEnv{spec: spec, baseDir: baseDir, prompt: t, resp: resp, harness: h, server: server}, nil
}

// Responder implements Responsive: nil without a responder block.
func (e *YAMLEnv) Responder(it datasets.Item) agentloop.Responder {
	if e.resp == nil {
		return nil
	}
	return forItem(e.resp, it)
}

// OpenSession implements Sessioned: one episode on the env server for a
// rollout; an env without an env_server block has none (nil, nil).
func (e *YAMLEnv) OpenSession(ctx context.Context, it datasets.Item, rolloutID string, sb sandbox.Sandbox) (Session, error) {
	if e.server == nil {
		return nil, nil
	}
	return e.server.open(ctx, it, rolloutID, sb)
}

func containsTemplate(r rewards.Spec) bool {
	w, _ := r.Want.(string)
	for _, s := range []string{r.Command, r.Path, w, r.Report, r.Regex} {
		if strings.Contains(s, "{{") {
			return true
		}
	}
	return false
}

// Name implements Env.
func (e *YAMLEnv) Name() string { return e.spec.Name }

// Defaults implements Env.
func (e *YAMLEnv) Defaults() Defaults {
	d := Defaults{Description: e.spec.Description, GroupSize: e.spec.GroupSize, MaxTurns: e.spec.MaxTurns, Toolsets: e.spec.Toolsets}
	if e.spec.Sandbox != nil {
		d.Image = e.spec.Sandbox.Image
	}
	if e.server != nil {
		d.Image = e.server.spec.Image
	}
	if e.spec.Dataset.Split != "" {
		d.Splits = []string{e.spec.Dataset.Split}
	}
	return d
}

// Items implements Env. With a dataset, split overrides dataset.split when
// given.
func (e *YAMLEnv) Items(ctx context.Context, split string) ([]datasets.Item, error) {
	if len(e.spec.Items) > 0 {
		rows := make([]datasets.Item, len(e.spec.Items))
		for i, m := range e.spec.Items {
			rows[i] = datasets.Item{Data: normalizeYAML(m).(map[string]any), Source: e.spec.Name + ".yaml items", Row: i + 1}
		}
		return datasets.Prepare(rows, e.spec.Dataset)
	}
	cfg := e.spec.Dataset
	if split != "" {
		cfg.Split = split
	}
	return datasets.Load(ctx, cfg)
}

// normalizeYAML turns yaml.v3's ints into the int64 datasets use.
func normalizeYAML(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalizeYAML(e)
		}
	case []any:
		for i, e := range x {
			x[i] = normalizeYAML(e)
		}
	case int:
		return int64(x)
	}
	return v
}

func render(name, text string, it datasets.Item) (string, error) {
	if !strings.Contains(text, "{{") {
		return text, nil
	}
	t, err := template.New(name).Option("missingkey=error").Parse(text)
	if err != nil {
		return "", fmt.Errorf("%w: %s template: %v", ErrConfig, name, err)
	}
	var b strings.Builder
	if err := t.Execute(&b, it.Data); err != nil {
		return "", fmt.Errorf("%w: %s row %d: %s: %v", datasets.ErrInvalid, it.Source, it.Row, name, err)
	}
	return b.String(), nil
}

// Task implements Env.
func (e *YAMLEnv) Task(_ context.Context, it datasets.Item) (Task, error) {
	var b strings.Builder
	if err := e.prompt.Execute(&b, it.Data); err != nil {
		return Task{}, fmt.Errorf("%w: %s row %d: prompt: %v", datasets.ErrInvalid, it.Source, it.Row, err)
	}
	t := Task{Messages: chat(e.spec.SystemPrompt, b.String()), Toolsets: e.spec.Toolsets, MaxTurns: e.spec.MaxTurns,
		MCPServers: e.spec.MCPServers}
	var err error
	if e.server != nil {
		if t.Messages, err = e.server.messages(e.spec.SystemPrompt, e.spec.Prompt, b.String(), it); err != nil {
			return Task{}, err
		}
		t.Sandbox = e.server.sandboxSpec()
	}
	if t.Answer, err = render("answer", e.spec.Answer, it); err != nil {
		return Task{}, err
	}
	if t.Category, err = render("category", e.spec.Category, it); err != nil {
		return Task{}, err
	}
	if sb := e.spec.Sandbox; sb != nil {
		spec := &sandbox.Spec{Image: sb.Image, Workdir: sb.Workdir, User: sb.User, Network: sb.Network, Env: sb.Env,
			Runtime: sb.Runtime,
			Limits: sandbox.Limits{MemoryBytes: sb.MemoryMB << 20, CPUs: sb.CPUs, PIDs: sb.PIDs, ReadOnlyRoot: sb.ReadOnlyRoot,
				DiskBytes: sb.DiskMB << 20}}
		for _, f := range sb.Files {
			body, err := render("sandbox.files "+f.Path, f.Content, it)
			if err != nil {
				return Task{}, err
			}
			spec.Files = append(spec.Files, sandbox.File{Path: f.Path, Data: []byte(body), Mode: os.FileMode(f.Mode)})
		}
		t.Sandbox = spec
	}
	if e.harness != nil {
		h, err := e.itemHarness(it)
		if err != nil {
			return Task{}, err
		}
		h.Prompt = b.String()
		t.Harness = h
	}
	return t, nil
}

// Reward implements Env: the weighted sum of the configured rewards, with
// their templates rendered for this item.
func (e *YAMLEnv) Reward(ctx context.Context, it datasets.Item, out Outcome, sb Sandbox) (rewards.Score, error) {
	if e.server != nil {
		s, ok := out.Session.(*serverSession)
		if !ok {
			return rewards.Score{}, fmt.Errorf("env %s: no env-server session to score (the runner did not open one)", e.spec.Name)
		}
		return s.score(ctx, out.Messages)
	}
	specs := make([]rewards.Spec, len(e.spec.Rewards))
	for i, r := range e.spec.Rewards {
		var err error
		for _, f := range []*string{&r.Command, &r.Path, &r.Report, &r.Regex} {
			if *f, err = render(fmt.Sprintf("rewards[%d]", i), *f, it); err != nil {
				return rewards.Score{}, err
			}
		}
		if w, ok := r.Want.(string); ok {
			if r.Want, err = render(fmt.Sprintf("rewards[%d].want", i), w, it); err != nil {
				return rewards.Score{}, err
			}
		}
		specs[i] = r
	}
	sum, err := rewards.BuildSum(specs)
	if err != nil {
		return rewards.Score{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	answer, err := render("answer", e.spec.Answer, it)
	if err != nil {
		return rewards.Score{}, err
	}
	in := rewards.Input{Answer: answer, Final: out.Final, Messages: out.Messages}
	if sb != nil {
		in.Box = sb
	}
	return sum.Score(ctx, in)
}
