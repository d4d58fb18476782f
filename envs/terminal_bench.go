package envs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
}

func init() {
	Register("terminal-bench", func(node *yaml.Node) (Env, error) {
		c := tbConfig{SystemPrompt: DefaultSystemPrompt, MaxTurns: 30, TestTimeout: 3 * time.Minute}
		if err := decodeStrict(node, &c); err != nil {
			return nil, err
		}
		e := &TerminalBench{cfg: c}
		switch {
		case c.Dataset.Path != "":
		case c.TasksDir != "":
			e.tasks = os.DirFS(c.TasksDir)
		default:
			sub, err := fs.Sub(dataFS, "data/terminal-bench")
			if err != nil {
				return nil, err
			}
			e.tasks = sub
		}
		return e, nil
	})
}

var (
	_ Env    = (*TerminalBench)(nil)
	_ Solver = (*TerminalBench)(nil)
)

// Name implements Env.
func (e *TerminalBench) Name() string { return "terminal-bench" }

// Defaults implements Env.
func (e *TerminalBench) Defaults() Defaults {
	return Defaults{
		Description: "Terminal-Bench 2 tasks (task directories or dataset rows); eval-only by default; 5 small tasks ship with rollout",
		GroupSize:   1, MaxTurns: e.cfg.MaxTurns, Toolsets: []string{"terminal", "file"},
		EvalOnly: !e.cfg.AllowTrain, Splits: []string{"eval"},
	}
}

// Items implements Env. Every split yields all tasks (TB2 has one).
func (e *TerminalBench) Items(ctx context.Context, _ string) ([]datasets.Item, error) {
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
		return nil, fmt.Errorf("%w: terminal-bench: no tasks (after task_filter/skip_tasks)", datasets.ErrInvalid)
	}
	return items, nil
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
