package envs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
)

// TerminalBench runs tasks in the Terminal-Bench 2 format, eval-only by
// default. Tasks come from a directory (one sub-directory per task with
// instruction.md, task.toml, environment/Dockerfile and its context, and
// tests/test.sh) or from dataset rows (task_name, category, instruction,
// docker_image, environment_tar and tests_tar as base64 tar.gz, test_sh).
// Each task's image is built FROM a local base image. Verification follows
// TB2: the tests are uploaded to /tests after the episode, test.sh runs,
// and /logs/verifier/reward.txt is the reward, with the exit code as the
// fallback.
type TerminalBench struct {
	name  string // "terminal-bench" or "task-suite"
	cfg   tbConfig
	tasks fs.FS // task directories; nil when items come from rows
}

type tbConfig struct {
	// TasksDir is a directory of TB2 task directories; empty means the five
	// tasks shipped with rollout.
	TasksDir string `yaml:"tasks_dir"`
	// Dataset, when its path is set, reads TB2 dataset rows instead.
	Dataset      datasets.Config `yaml:"dataset"`
	SystemPrompt string          `yaml:"system_prompt"`
	MaxTurns     int             `yaml:"max_turns"`
	TestTimeout  time.Duration   `yaml:"test_timeout"`
	TaskFilter   []string        `yaml:"task_filter"`
	SkipTasks    []string        `yaml:"skip_tasks"`
	AllowTrain   bool            `yaml:"allow_train"`
	// EvalFraction splits the tasks into train and eval by a hash of the
	// task id (task-suite; 0 = every split yields every task).
	EvalFraction float64 `yaml:"eval_fraction"`
	// SplitFile names a YAML/JSON file {train: [ids], eval: [ids]} that
	// fixes the split instead of the hash; tasks it does not list are in
	// neither split.
	SplitFile string `yaml:"split_file"`
	// GroupSize is the env's default group size.
	GroupSize int `yaml:"group_size"`
}

func init() {
	Register("terminal-bench", func(node *yaml.Node) (Env, error) {
		c := tbConfig{SystemPrompt: DefaultSystemPrompt, MaxTurns: 30, TestTimeout: 3 * time.Minute, GroupSize: 1}
		return newTerminalBench("terminal-bench", c, node)
	})
	// task-suite is the same loader for training: a directory of TB2-format
	// tasks with train/eval splits, runnable by `rollout run`.
	Register("task-suite", func(node *yaml.Node) (Env, error) {
		c := tbConfig{SystemPrompt: DefaultSystemPrompt, MaxTurns: 30, TestTimeout: 3 * time.Minute, GroupSize: 4,
			AllowTrain: true, EvalFraction: 0.2}
		return newTerminalBench("task-suite", c, node)
	})
}

func newTerminalBench(name string, c tbConfig, node *yaml.Node) (Env, error) {
	if err := decodeStrict(node, &c); err != nil {
		return nil, err
	}
	if c.EvalFraction < 0 || c.EvalFraction >= 1 {
		return nil, fmt.Errorf("%w: eval_fraction %v must be in [0, 1)", ErrConfig, c.EvalFraction)
	}
	if c.GroupSize < 1 {
		return nil, fmt.Errorf("%w: group_size %d must be at least 1", ErrConfig, c.GroupSize)
	}
	if c.SplitFile != "" && c.Dataset.Path == "" && c.TasksDir == "" {
		return nil, fmt.Errorf("%w: split_file needs tasks_dir or dataset", ErrConfig)
	}
	e := &TerminalBench{name: name, cfg: c}
	switch {
	case c.Dataset.Path != "":
	case c.TasksDir != "":
		st, err := os.Stat(c.TasksDir)
		if err != nil {
			return nil, fmt.Errorf("%w: tasks_dir: %v", ErrConfig, err)
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("%w: tasks_dir %s is not a directory", ErrConfig, c.TasksDir)
		}
		e.tasks = os.DirFS(c.TasksDir)
	default:
		sub, err := fs.Sub(dataFS, "data/terminal-bench")
		if err != nil {
			return nil, err
		}
		e.tasks = sub
	}
	return e, nil
}

var (
	_ Env    = (*TerminalBench)(nil)
	_ Solver = (*TerminalBench)(nil)
)

// Name implements Env.
func (e *TerminalBench) Name() string { return e.name }

// Defaults implements Env.
func (e *TerminalBench) Defaults() Defaults {
	if e.name == "task-suite" {
		return Defaults{
			Description: "A directory of Terminal-Bench-format tasks as a training dataset: train/eval split by task-id hash or split file, task images built locally, reward from each task's tests",
			GroupSize:   e.cfg.GroupSize, MaxTurns: e.cfg.MaxTurns, Toolsets: []string{"terminal", "file"},
			EvalOnly: !e.cfg.AllowTrain, Splits: []string{"train", "eval"},
		}
	}
	return Defaults{
		Description: "Terminal-Bench 2 tasks (task directories or dataset rows); eval-only by default; 5 small tasks ship with rollout",
		GroupSize:   e.cfg.GroupSize, MaxTurns: e.cfg.MaxTurns, Toolsets: []string{"terminal", "file"},
		EvalOnly: !e.cfg.AllowTrain, Splits: []string{"eval"},
	}
}

// Items implements Env. Without eval_fraction or split_file every split
// yields all tasks (TB2 has one); with them, "train" and "eval" yield
// their part and any other split is an error.
func (e *TerminalBench) Items(ctx context.Context, split string) ([]datasets.Item, error) {
	var items []datasets.Item
	if e.tasks == nil {
		rows, err := datasets.Load(ctx, e.cfg.Dataset)
		if err != nil {
			return nil, err
		}
		for _, it := range rows {
			name, err := it.String("task_name")
			if err != nil {
				return nil, err
			}
			it.ID = name
			items = append(items, it)
		}
	} else {
		entries, err := fs.ReadDir(e.tasks, ".")
		if err != nil {
			return nil, fmt.Errorf("terminal-bench tasks: %w", err)
		}
		for _, d := range entries {
			if !d.IsDir() {
				continue
			}
			it, err := e.dirItem(d.Name())
			if err != nil {
				return nil, err
			}
			items = append(items, it)
		}
	}
	items = filterTasks(items, e.cfg.TaskFilter, e.cfg.SkipTasks)
	if len(items) == 0 {
		return nil, fmt.Errorf("%w: %s: no tasks (after task_filter/skip_tasks)", datasets.ErrInvalid, e.name)
	}
	items, err := e.splitItems(items, split)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("%w: %s: split %q has no tasks", datasets.ErrInvalid, e.name, split)
	}
	return items, nil
}

// splitItems keeps the items of one split: by the split file when set,
// else by eval_fraction over a hash of the task id, else all of them.
func (e *TerminalBench) splitItems(items []datasets.Item, split string) ([]datasets.Item, error) {
	if e.cfg.SplitFile == "" && e.cfg.EvalFraction == 0 {
		return items, nil
	}
	if split != "train" && split != "eval" {
		return nil, fmt.Errorf("%w: %s: unknown split %q (train, eval)", datasets.ErrInvalid, e.name, split)
	}
	var keep func(id string) bool
	if e.cfg.SplitFile != "" {
		sf, err := e.readSplitFile()
		if err != nil {
			return nil, err
		}
		known := map[string]bool{}
		for _, it := range items {
			known[it.ID] = true
		}
		in := map[string]bool{}
		for _, id := range sf[split] {
			if !known[id] {
				return nil, fmt.Errorf("%w: %s: split_file %s: %s lists unknown task %q", datasets.ErrInvalid, e.name, e.cfg.SplitFile, split, id)
			}
			in[id] = true
		}
		keep = func(id string) bool { return in[id] }
	} else {
		keep = func(id string) bool { return (TaskSplit(id, e.cfg.EvalFraction) == "eval") == (split == "eval") }
	}
	var out []datasets.Item
	for _, it := range items {
		if keep(it.ID) {
			out = append(out, it)
		}
	}
	return out, nil
}

func (e *TerminalBench) readSplitFile() (map[string][]string, error) {
	p := e.cfg.SplitFile
	raw, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: split_file: %v", datasets.ErrInvalid, e.name, err)
	}
	var sf map[string][]string
	if err := yaml.Unmarshal(raw, &sf); err != nil {
		return nil, fmt.Errorf("%w: %s: split_file %s: %v", datasets.ErrInvalid, e.name, p, err)
	}
	for k := range sf {
		if k != "train" && k != "eval" {
			return nil, fmt.Errorf("%w: %s: split_file %s: unknown split %q (train, eval)", datasets.ErrInvalid, e.name, p, k)
		}
	}
	seen := map[string]string{}
	for _, k := range []string{"train", "eval"} {
		for _, id := range sf[k] {
			if other, dup := seen[id]; dup {
				return nil, fmt.Errorf("%w: %s: split_file %s: task %q is in both %s and %s", datasets.ErrInvalid, e.name, p, id, other, k)
			}
			seen[id] = k
		}
	}
	return sf, nil
}

// TaskSplit is the hash split of task-suite: a task is in "eval" when the
// first 8 bytes of SHA-256(id), as a fraction of 2^64, are below
// evalFraction, else in "train". It depends only on the id, so adding or
// removing tasks never moves another task between splits.
func TaskSplit(id string, evalFraction float64) string {
	h := sha256.Sum256([]byte(id))
	if float64(binary.BigEndian.Uint64(h[:8]))/float64(math.MaxUint64) < evalFraction {
		return "eval"
	}
	return "train"
}

func filterTasks(items []datasets.Item, only, skip []string) []datasets.Item {
	in := func(list []string, s string) bool {
		for _, x := range list {
			if x == s {
				return true
			}
		}
		return false
	}
	out := items[:0]
	for _, it := range items {
		if (len(only) == 0 || in(only, it.ID)) && !in(skip, it.ID) {
			out = append(out, it)
		}
	}
	return out
}

func (e *TerminalBench) dirItem(name string) (datasets.Item, error) {
	instr, err := fs.ReadFile(e.tasks, path.Join(name, "instruction.md"))
	if err != nil {
		return datasets.Item{}, fmt.Errorf("%w: terminal-bench task %s: %v", datasets.ErrInvalid, name, err)
	}
	data := map[string]any{"task_name": name, "instruction": strings.TrimSpace(string(instr)), "task_dir": name}
	if meta, err := fs.ReadFile(e.tasks, path.Join(name, "task.toml")); err == nil {
		if c := tomlValue(string(meta), "metadata", "category"); c != "" {
			data["category"] = c
		}
		if t := tomlValue(string(meta), "verifier", "timeout_sec"); t != "" {
			if f, err := strconv.ParseFloat(t, 64); err == nil {
				data["test_timeout_sec"] = f
			}
		}
	}
	if sol, err := fs.ReadFile(e.tasks, path.Join(name, "solution.json")); err == nil {
		var v any
		if json.Unmarshal(sol, &v) == nil {
			data["solution"] = v
		}
	}
	return datasets.Item{ID: name, Data: data, Source: name + "/instruction.md", Row: 1}, nil
}

// tomlValue reads `key = value` in [section] of a TOML file. It knows only
// the flat scalar keys TB2 task files use; values are unquoted.
func tomlValue(text, section, key string) string {
	cur := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			cur = strings.Trim(line, "[] ")
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if ok && cur == section && strings.TrimSpace(k) == key {
			return strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	return ""
}

// Solution implements Solver.
func (e *TerminalBench) Solution(it datasets.Item) (json.RawMessage, bool) { return solution(it) }

// Task implements Env.
func (e *TerminalBench) Task(_ context.Context, it datasets.Item) (Task, error) {
	instr, err := it.String("instruction")
	if err != nil {
		return Task{}, err
	}
	cat, _ := it.String("category")
	spec := &sandbox.Spec{Workdir: "/app", User: "root"}
	t := Task{Messages: chat(e.cfg.SystemPrompt, instr), Toolsets: []string{"terminal", "file"}, Sandbox: spec, Category: cat}
	if dir, err := it.String("task_dir"); err == nil && e.tasks != nil {
		ctxTar, err := tarFS(e.tasks, path.Join(dir, "environment"))
		if err != nil {
			return Task{}, fmt.Errorf("terminal-bench task %s: environment: %w", it.ID, err)
		}
		t.Build = &ImageBuild{ContextTar: ctxTar}
		return t, nil
	}
	if b64, err := it.String("environment_tar"); err == nil && b64 != "" {
		raw, err := decodeTarField(b64)
		if err != nil {
			return Task{}, fmt.Errorf("%w: %s row %d: environment_tar: %v", datasets.ErrInvalid, it.Source, it.Row, err)
		}
		t.Build = &ImageBuild{ContextTar: raw}
		return t, nil
	}
	if img, err := it.String("docker_image"); err == nil && img != "" {
		spec.Image = img
		return t, nil
	}
	return Task{}, fmt.Errorf("%w: %s row %d: task has neither an environment nor a docker_image", datasets.ErrInvalid, it.Source, it.Row)
}

// Reward implements Env with the TB2 verification procedure.
func (e *TerminalBench) Reward(ctx context.Context, it datasets.Item, _ Outcome, sb Sandbox) (rewards.Score, error) {
	if sb == nil {
		return rewards.Score{}, fmt.Errorf("%w: terminal-bench needs the rollout's sandbox", rewards.ErrReward)
	}
	tests, testSh, err := e.tests(it)
	if err != nil {
		return rewards.Score{}, fmt.Errorf("%w: %w", rewards.ErrReward, err)
	}
	run := func(argv ...string) (sandbox.ExecResult, error) {
		return sb.Exec(ctx, sandbox.ExecRequest{Argv: argv, Timeout: time.Minute})
	}
	// The agent ran as root in this container: clear anything it may have
	// left where the verifier writes.
	if res, err := run("sh", "-c", "rm -rf /tests /logs/verifier && mkdir -p /tests /logs/verifier"); err != nil || res.ExitCode != 0 {
		return rewards.Score{}, fmt.Errorf("%w: prepare /tests: %v (exit %d: %s)", rewards.ErrReward, err, res.ExitCode, res.Stderr)
	}
	if err := sb.Upload(ctx, "/tests", bytes.NewReader(tests)); err != nil {
		return rewards.Score{}, fmt.Errorf("%w: upload tests: %w", rewards.ErrReward, err)
	}
	if testSh != "" {
		if err := sb.WriteFile(ctx, "/tests/test.sh", []byte(testSh), 0o755); err != nil {
			return rewards.Score{}, fmt.Errorf("%w: write test.sh: %w", rewards.ErrReward, err)
		}
	}
	timeout := e.cfg.TestTimeout
	if v, ok := it.Get("test_timeout_sec"); ok {
		if f, ok := v.(float64); ok && f > 0 {
			timeout = time.Duration(f * float64(time.Second))
		}
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"bash", "/tests/test.sh"}, Cwd: "/app", Timeout: timeout})
	if err != nil {
		return rewards.Score{}, fmt.Errorf("%w: run test.sh: %w", rewards.ErrReward, err)
	}
	comps := map[string]float64{"exit_code": float64(res.ExitCode)}
	fallback := 0.0
	if res.ExitCode == 0 {
		fallback = 1
	}
	data, err := sb.ReadFile(ctx, "/logs/verifier/reward.txt")
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		comps["reward_file"] = 0
		return rewards.Score{Value: fallback, Components: comps}, nil
	case err != nil:
		return rewards.Score{}, fmt.Errorf("%w: read reward.txt: %w", rewards.ErrReward, err)
	}
	text := strings.TrimSpace(string(data))
	v, perr := strconv.ParseFloat(text, 64)
	if perr != nil || text == "" {
		comps["reward_file"] = 0
		return rewards.Score{Value: fallback, Components: comps}, nil
	}
	comps["reward_file"] = 1
	return rewards.Score{Value: v, Components: comps}, nil
}

// tests returns the sanitised tests tar and, for rows, the test.sh text.
func (e *TerminalBench) tests(it datasets.Item) ([]byte, string, error) {
	if dir, err := it.String("task_dir"); err == nil && e.tasks != nil {
		t, err := tarFS(e.tasks, path.Join(dir, "tests"))
		return t, "", err
	}
	var raw []byte
	if b64, err := it.String("tests_tar"); err == nil && b64 != "" {
		var derr error
		if raw, derr = decodeTarField(b64); derr != nil {
			return nil, "", fmt.Errorf("tests_tar: %w", derr)
		}
	} else {
		raw, _ = tarOf(nil, 0)
	}
	clean, err := sanitizeTar(raw)
	if err != nil {
		return nil, "", fmt.Errorf("tests_tar: %w", err)
	}
	sh, _ := it.String("test_sh")
	return clean, sh, nil
}

func decodeTarField(b64 string) ([]byte, error) {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil {
		return nil, fmt.Errorf("not base64: %w", err)
	}
	if len(raw) > 2 && raw[0] == 0x1f && raw[1] == 0x8b {
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		if raw, err = io.ReadAll(zr); err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
	}
	return raw, nil
}

// sanitizeTar keeps only regular files and directories with relative,
// '..'-free paths and permission bits, like the TB2 runner's hardened
// extraction: symlinks, devices and escaping paths are refused.
func sanitizeTar(raw []byte) ([]byte, error) {
	tr := tar.NewReader(bytes.NewReader(raw))
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read tar: %w", err)
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if name == "" || name == "." {
			continue
		}
		if path.IsAbs(h.Name) || strings.Contains(h.Name, "..") {
			return nil, fmt.Errorf("tar entry %q escapes the target directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir:
		default:
			return nil, fmt.Errorf("tar entry %q: only files and directories are allowed", h.Name)
		}
		nh := &tar.Header{Name: name, Typeflag: h.Typeflag, Mode: h.Mode & 0o777, Size: h.Size, ModTime: h.ModTime}
		if err := tw.WriteHeader(nh); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// tarFS packs the tree under dir of fsys (paths relative to dir). Files
// named *.sh are executable.
func tarFS(fsys fs.FS, dir string) ([]byte, error) {
	files := map[string]string{}
	err := fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		files[strings.TrimPrefix(p, dir+"/")] = string(b)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return packTar(files, func(n string) fs.FileMode {
		if strings.HasSuffix(n, ".sh") {
			return 0o755
		}
		return 0o644
	})
}
