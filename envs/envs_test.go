package envs

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mustEnv(t *testing.T, name, cfg string) Env {
	t.Helper()
	var node *yaml.Node
	if cfg != "" {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(cfg), &doc); err != nil {
			t.Fatal(err)
		}
		node = doc.Content[0]
	}
	e, err := New(name, node)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestRegistry(t *testing.T) {
	want := []string{"agentic-opd", "guess-number", "math-python", "swe-tests", "task-suite", "terminal-bench", "terminal-tasks", "toolcall-match", "web-research"}
	if got := Names(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("Names() = %v", got)
	}
	if _, err := New("nope", nil); err == nil || !strings.Contains(err.Error(), "known envs: agentic-opd, guess-number") {
		t.Errorf("unknown env: %v", err)
	}
	var doc yaml.Node
	_ = yaml.Unmarshal([]byte("# comment\nimage: x\nmax_turnz: 3\n"), &doc)
	_, err := New("terminal-tasks", doc.Content[0])
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "line 3: field max_turnz not found") {
		t.Errorf("unknown key: %v", err)
	}
}

func TestBuiltinItemsAndTasks(t *testing.T) {
	cases := []struct {
		env         string
		train, eval int
		sandbox     bool
		build       bool
		callOnly    bool
	}{
		{"terminal-tasks", 30, 5, true, false, false},
		{"swe-tests", 6, 2, true, false, false},
		{"math-python", 16, 4, true, false, false},
		{"toolcall-match", 7, 1, false, false, true},
		{"terminal-bench", 5, 5, true, true, false},
		{"task-suite", 3, 2, true, true, false},
		{"web-research", 6, 2, false, false, false},
	}
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.env, func(t *testing.T) {
			e := mustEnv(t, c.env, "")
			train, err := e.Items(ctx, "train")
			if err != nil {
				t.Fatal(err)
			}
			eval, err := e.Items(ctx, "eval")
			if err != nil {
				t.Fatal(err)
			}
			if len(train) != c.train || len(eval) != c.eval {
				t.Fatalf("items: %d train, %d eval; want %d, %d", len(train), len(eval), c.train, c.eval)
			}
			for _, it := range append(train, eval...) {
				task, err := e.Task(ctx, it)
				if err != nil {
					t.Fatalf("%s: %v", it.ID, err)
				}
				if (task.Sandbox != nil) != c.sandbox || (task.Build != nil) != c.build || (len(task.CallOnly) > 0) != c.callOnly {
					t.Errorf("%s: sandbox=%v build=%v callOnly=%d", it.ID, task.Sandbox != nil, task.Build != nil, len(task.CallOnly))
				}
				if n := len(task.Messages); n == 0 || task.Messages[n-1].Role != openai.ChatMessageRoleUser {
					t.Errorf("%s: messages must end with the user turn", it.ID)
				}
				if s, ok := e.(Solver); ok {
					raw, ok := s.Solution(it)
					var script struct {
						Steps []json.RawMessage `json:"steps"`
					}
					if !ok || json.Unmarshal(raw, &script) != nil || len(script.Steps) == 0 {
						t.Errorf("%s: no usable reference solution", it.ID)
					}
				}
			}
		})
	}
}

// memBox is a unit-test sandbox: files in a map; commands are not run.
type memBox struct{ files map[string][]byte }

func (b *memBox) Exec(context.Context, sandbox.ExecRequest) (sandbox.ExecResult, error) {
	return sandbox.ExecResult{}, fmt.Errorf("memBox runs no commands: %w", sandbox.ErrUnavailable)
}
func (b *memBox) ReadFile(_ context.Context, p string) ([]byte, error) {
	d, ok := b.files[p]
	if !ok {
		return nil, fmt.Errorf("%s: %w", p, sandbox.ErrNotFound)
	}
	return d, nil
}
func (b *memBox) WriteFile(_ context.Context, p string, d []byte, _ fs.FileMode) error {
	b.files[p] = d
	return nil
}
func (b *memBox) Upload(context.Context, string, io.Reader) error { return nil }

func itemByID(t *testing.T, e Env, split, id string) datasets.Item {
	t.Helper()
	items, err := e.Items(context.Background(), split)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.ID == id {
			return it
		}
	}
	t.Fatalf("no item %s", id)
	return datasets.Item{}
}

func TestTerminalTasksReward(t *testing.T) {
	e := mustEnv(t, "terminal-tasks", "")
	it := itemByID(t, e, "train", "greeting")
	for _, c := range []struct {
		content string
		want    float64
	}{
		{"Hello from rollout\n", 1},
		{"Well: Hello from rollout!", 0.5},
		{"bye", 0},
		{"", -1}, // file missing
	} {
		box := &memBox{files: map[string][]byte{}}
		if c.want >= 0 {
			box.files["/workspace/greeting.txt"] = []byte(c.content)
		}
		s, err := e.Reward(context.Background(), it, Outcome{}, box)
		if err != nil {
			t.Fatal(err)
		}
		if want := max(c.want, 0); s.Value != want {
			t.Errorf("content %q: reward %v, want %v", c.content, s.Value, want)
		}
	}
	if _, err := e.Reward(context.Background(), it, Outcome{}, nil); !errors.Is(err, rewards.ErrReward) {
		t.Errorf("no sandbox: %v", err)
	}
}

func call(name, args string) openai.ToolCall {
	return openai.ToolCall{Type: "function", Function: openai.FunctionCall{Name: name, Arguments: args}}
}

func TestToolCallMatchReward(t *testing.T) {
	e := mustEnv(t, "toolcall-match", "")
	two := itemByID(t, e, "train", "weather-two")
	none := itemByID(t, e, "train", "no-call")
	cur := itemByID(t, e, "train", "currency")
	cases := []struct {
		name  string
		item  datasets.Item
		calls []openai.ToolCall
		want  float64
	}{
		{"both, any order", two, []openai.ToolCall{call("get_weather", `{"city":"Oslo"}`), call("get_weather", `{"city":" Tokyo "}`)}, 1},
		{"one of two", two, []openai.ToolCall{call("get_weather", `{"city":"Tokyo"}`)}, 0.5},
		{"extra call costs", two, []openai.ToolCall{call("get_weather", `{"city":"Oslo"}`), call("get_weather", `{"city":"Tokyo"}`), call("get_weather", `{"city":"Rome"}`)}, 2.0 / 3},
		{"extra argument", two, []openai.ToolCall{call("get_weather", `{"city":"Oslo","unit":"celsius"}`), call("get_weather", `{"city":"Tokyo"}`)}, 0.5},
		{"malformed counts", two, []openai.ToolCall{call("get_weather", `{"city":`), call("get_weather", `{"city":"Tokyo"}`)}, 0.5},
		{"no call expected, none made", none, nil, 1},
		{"no call expected, one made", none, []openai.ToolCall{call("get_weather", `{"city":"x"}`)}, 0},
		{"number by value", cur, []openai.ToolCall{call("convert_currency", `{"amount":250.50,"from":"USD","to":"EUR"}`)}, 1},
		{"wrong number", cur, []openai.ToolCall{call("convert_currency", `{"amount":250,"from":"USD","to":"EUR"}`)}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := Outcome{Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "q"}, {Role: "assistant", ToolCalls: c.calls}}}
			s, err := e.Reward(context.Background(), c.item, out, nil)
			if err != nil {
				t.Fatal(err)
			}
			if d := s.Value - c.want; d > 1e-9 || d < -1e-9 {
				t.Errorf("reward %v, want %v (%v)", s.Value, c.want, s.Components)
			}
		})
	}
}

func TestMathReward(t *testing.T) {
	e := mustEnv(t, "math-python", "")
	it := itemByID(t, e, "train", "math-1")
	for final, want := range map[string]float64{`so \boxed{1591}`: 1, "1591": 1, `\boxed{1581}`: 0, "": 0} {
		s, err := e.Reward(context.Background(), it, Outcome{Final: final}, nil)
		if err != nil || s.Value != want {
			t.Errorf("final %q: %v %v, want %v", final, s.Value, err, want)
		}
	}
}

func TestYAMLEnv(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "qs.jsonl"), []byte(`{"id":"q1","q":"2+2","a":"4","file":"four.txt"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	def := `name: my-env
description: test
system_prompt: be brief
prompt: "Answer: {{.q}}"
answer: "{{.a}}"
toolsets: [terminal]
sandbox:
  image: rollout-sandbox:busybox
  files:
    - path: /workspace/hint.txt
      content: "the answer is near {{.a}}"
dataset:
  path: qs.jsonl
rewards:
  - type: numeric_match
    weight: 0.5
  - type: file_content
    path: "/workspace/{{.file}}"
    want: "{{.a}}"
    trim_space: true
    weight: 0.5
`
	p := filepath.Join(dir, "env.yaml")
	if err := os.WriteFile(p, []byte(def), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	items, err := e.Items(context.Background(), "")
	if err != nil || len(items) != 1 {
		t.Fatalf("items %v %v", items, err)
	}
	task, err := e.Task(context.Background(), items[0])
	if err != nil {
		t.Fatal(err)
	}
	if task.Messages[1].Content != "Answer: 2+2" || task.Answer != "4" || string(task.Sandbox.Files[0].Data) != "the answer is near 4" {
		t.Errorf("task = %+v", task)
	}
	box := &memBox{files: map[string][]byte{"/workspace/four.txt": []byte("4\n")}}
	s, err := e.Reward(context.Background(), items[0], Outcome{Final: `\boxed{4}`}, box)
	if err != nil || s.Value != 1 || s.Components["file_content"] != 1 {
		t.Errorf("reward %+v %v", s, err)
	}

	bad := []struct{ body, want string }{
		{"name: x\nprompt: p\nitems: [{a: 1}]\nrewards: [{type: nope}]\n", `unknown reward type "nope"`},
		{"name: x\nprompt: p\nrewards: [{type: numeric_match}]\n", "exactly one of dataset.path and items"},
		{"name: x\nprompt: p\nitems: [{a: 1}]\n", "at least one reward"},
		{"name: x\nprompt: p\nitems: [{a: 1}]\nrewards: [{type: format}]\nsandbox: {workdir: /w}\n", "sandbox.image is required"},
		{"name: x\nprompt: p\nitemz: []\n", "line 3: field itemz not found"},
		{"name: x\nprompt: '{{.q'\nitems: [{a: 1}]\nrewards: [{type: format}]\n", "prompt template"},
	}
	for _, b := range bad {
		if err := os.WriteFile(p, []byte(b.body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadFile(p); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%q: err = %v, want %q", b.body, err, b.want)
		}
	}
	if err := os.WriteFile(p, []byte("name: x\nprompt: '{{.missing}}'\nitems: [{a: 1}]\nrewards: [{type: format}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e, _ = LoadFile(p)
	items, _ = e.Items(context.Background(), "")
	if _, err := e.Task(context.Background(), items[0]); !errors.Is(err, datasets.ErrInvalid) || !strings.Contains(err.Error(), "row 1: prompt") {
		t.Errorf("missing template field: %v", err)
	}
}

func TestTerminalBenchRowsAndTars(t *testing.T) {
	if got := tomlValue("[metadata]\ncategory = \"x-y\"\n[verifier]\ntimeout_sec = 60.0\n", "verifier", "timeout_sec"); got != "60.0" {
		t.Errorf("tomlValue = %q", got)
	}
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	_ = tw.WriteHeader(&tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"})
	_ = tw.Close()
	if _, err := sanitizeTar(evil.Bytes()); err == nil || !strings.Contains(err.Error(), "only files and directories") {
		t.Errorf("symlink accepted: %v", err)
	}
	evil.Reset()
	tw = tar.NewWriter(&evil)
	_ = tw.WriteHeader(&tar.Header{Name: "../x", Typeflag: tar.TypeReg, Size: 0})
	_ = tw.Close()
	if _, err := sanitizeTar(evil.Bytes()); err == nil || !strings.Contains(err.Error(), "escapes") {
		t.Errorf("escaping path accepted: %v", err)
	}

	tarball, err := tarOf(map[string]string{"tests/test_x.py": "assert True\n"}, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	row := map[string]any{"task_name": "row-task", "category": "c", "instruction": "do it",
		"environment_tar": b64(t, map[string]string{"Dockerfile": "FROM rollout-sandbox:bookworm\n"}),
		"tests_tar":       base64Std(tarball), "test_sh": "#!/bin/bash\nexit 0\n"}
	dir := t.TempDir()
	b, _ := json.Marshal(row)
	if err := os.WriteFile(filepath.Join(dir, "tb.jsonl"), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	e := mustEnv(t, "terminal-bench", "dataset:\n  path: "+filepath.Join(dir, "tb.jsonl")+"\n")
	items, err := e.Items(context.Background(), "eval")
	if err != nil || len(items) != 1 || items[0].ID != "row-task" {
		t.Fatalf("items %v %v", items, err)
	}
	task, err := e.Task(context.Background(), items[0])
	if err != nil || task.Build == nil || !bytes.Contains(task.Build.ContextTar, []byte("FROM rollout-sandbox")) {
		t.Fatalf("task %+v %v", task, err)
	}
	if !e.Defaults().EvalOnly {
		t.Error("terminal-bench must be eval-only by default")
	}
}

func TestEvalMetrics(t *testing.T) {
	var env EvalMetricser = &TerminalTasks{}
	ms := env.EvalMetrics([]ScoredRollout{
		{Reward: 1, Turns: 3, Components: map[string]float64{"check_0": 1, "check_1": 1}},
		{Reward: 0.5, Turns: 9, Components: map[string]float64{"check_0": 1, "check_1": 0}},
		{Reward: 1, Turns: 5, Components: map[string]float64{"check_0": 1}},
	})
	if ms["check_pass_rate"] != 0.8 || ms["turns_when_solved_mean"] != 4 {
		t.Fatalf("metrics %v", ms)
	}
	if ms := env.EvalMetrics(nil); len(ms) != 0 {
		t.Fatalf("no rollouts: %v", ms)
	}
}
