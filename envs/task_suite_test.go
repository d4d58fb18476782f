package envs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/datasets"
)

// writeSuite writes n TB2-format tasks task-00 … under a temp dir.
func writeSuite(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	for i := range n {
		td := filepath.Join(dir, fmt.Sprintf("task-%02d", i))
		for f, body := range map[string]string{
			"instruction.md":         fmt.Sprintf("Write %d to /app/out.txt.\n", i),
			"task.toml":              "[metadata]\ncategory = \"files\"\n[verifier]\ntimeout_sec = 30\n",
			"environment/Dockerfile": "FROM rollout-sandbox:bookworm\nWORKDIR /app\n",
			"tests/test.sh":          fmt.Sprintf("#!/bin/bash\n[ \"$(cat /app/out.txt)\" = %d ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n", i),
		} {
			p := filepath.Join(td, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

func ids(items []datasets.Item) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.ID)
	}
	return out
}

func TestTaskSuiteHashSplit(t *testing.T) {
	dir := writeSuite(t, 40)
	e := mustEnv(t, "task-suite", "tasks_dir: "+dir+"\neval_fraction: 0.25\n")
	d := e.Defaults()
	if d.EvalOnly || d.GroupSize != 4 || strings.Join(d.Splits, ",") != "train,eval" {
		t.Fatalf("defaults %+v", d)
	}
	ctx := context.Background()
	train, err := e.Items(ctx, "train")
	if err != nil {
		t.Fatal(err)
	}
	eval, err := e.Items(ctx, "eval")
	if err != nil {
		t.Fatal(err)
	}
	if len(train)+len(eval) != 40 || len(eval) == 0 || len(train) == 0 {
		t.Fatalf("split %d/%d", len(train), len(eval))
	}
	for _, it := range eval {
		if TaskSplit(it.ID, 0.25) != "eval" {
			t.Errorf("%s in eval, hash says train", it.ID)
		}
	}
	seen := map[string]bool{}
	for _, id := range append(ids(train), ids(eval)...) {
		if seen[id] {
			t.Errorf("%s in both splits", id)
		}
		seen[id] = true
	}
	// The split depends only on the id: a suite with fewer tasks keeps
	// every remaining task on its side.
	small := mustEnv(t, "task-suite", "tasks_dir: "+dir+"\neval_fraction: 0.25\ntask_filter: ["+strings.Join(ids(eval), ", ")+"]\n")
	if _, err := small.Items(ctx, "train"); !errors.Is(err, datasets.ErrInvalid) || !strings.Contains(err.Error(), `split "train" has no tasks`) {
		t.Errorf("eval-only filter, train split: %v", err)
	}
	if _, err := e.Items(ctx, "test"); err == nil || !strings.Contains(err.Error(), `unknown split "test"`) {
		t.Errorf("unknown split: %v", err)
	}
	task, err := e.Task(ctx, train[0])
	if err != nil || task.Build == nil || task.Sandbox == nil || task.Category != "files" {
		t.Fatalf("task %+v %v", task, err)
	}
}

func TestTaskSuiteSplitFile(t *testing.T) {
	dir := writeSuite(t, 4)
	sf := filepath.Join(t.TempDir(), "split.yaml")
	write := func(body string) {
		if err := os.WriteFile(sf, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("train: [task-00, task-01]\neval: [task-03]\n")
	e := mustEnv(t, "task-suite", "tasks_dir: "+dir+"\nsplit_file: "+sf+"\n")
	ctx := context.Background()
	train, err := e.Items(ctx, "train")
	if err != nil || strings.Join(ids(train), ",") != "task-00,task-01" {
		t.Fatalf("train %v %v", ids(train), err)
	}
	eval, err := e.Items(ctx, "eval")
	if err != nil || strings.Join(ids(eval), ",") != "task-03" {
		t.Fatalf("eval %v %v", ids(eval), err)
	}
	for body, want := range map[string]string{
		"train: [task-00]\neval: [task-00]\n": "in both train and eval",
		"train: [task-09]\n":                  `unknown task "task-09"`,
		"test: [task-00]\n":                   `unknown split "test"`,
		"train: {a: b}\n":                     "split_file",
	} {
		write(body)
		if _, err := e.Items(ctx, "train"); !errors.Is(err, datasets.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
	for cfg, want := range map[string]string{
		"eval_fraction: 1\n":                       "eval_fraction",
		"eval_fraction: -0.1\n":                    "eval_fraction",
		"group_size: 0\n":                          "group_size",
		"split_file: x.yaml\n":                     "split_file needs tasks_dir",
		"tasks_dir: " + filepath.Join(dir, "nope"): "tasks_dir",
		"tasks_dir: " + sf:                         "not a directory",
	} {
		if _, err := newEnvFromText("task-suite", cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", cfg, err, want)
		}
	}
}

func newEnvFromText(name, cfg string) (Env, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(cfg), &doc); err != nil {
		return nil, err
	}
	return New(name, doc.Content[0])
}
