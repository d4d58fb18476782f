package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/internal/devtools/bench/synth"
	"github.com/rollout-rl/rollout/trajectory"
)

// syntheticRun writes a small run directory: 3 groups of 4 with 64 tokens,
// one infra failure.
func syntheticRun(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	w, err := trajectory.NewWriter(ctx, dir, trajectory.WriterOptions{RunID: "cli-test", MaxRowsPerFile: 5})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		r := synth.Trajectory(5, i, synth.Options{Tokens: 64, GroupSize: 4})
		r.Reward = float64(i % 3)
		if i == 7 {
			r.Status = trajectory.StatusInfraFailed
			r.Failure = &trajectory.Failure{Kind: "sandbox_start", Message: "no such image"}
		}
		if err := w.Write(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return dir
}

func jsonLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: bad JSON line: %v", path, err)
		}
		out = append(out, m)
	}
	return out
}

func TestExportAndInspectCommands(t *testing.T) {
	run := syntheticRun(t)
	out := t.TempDir()
	tests := []struct {
		args  []string
		file  string
		lines int
	}{
		{[]string{"export", "sft", run, "-o", filepath.Join(out, "sft.jsonl")}, "sft.jsonl", 11},
		{[]string{"export", "sft", run, "--format", "messages", "--top-k", "1", "--min-reward", "1", "-o", filepath.Join(out, "msgs.jsonl")}, "msgs.jsonl", 3},
		{[]string{"export", "sft", run, "--include-failed", "-o", filepath.Join(out, "all.jsonl")}, "all.jsonl", 12},
		{[]string{"export", "dpo", run, "--min-margin", "1", "-o", filepath.Join(out, "dpo.jsonl")}, "dpo.jsonl", 3},
		{[]string{"export", "atropos", run, "--env-id", "0", "-o", filepath.Join(out, "atropos.jsonl")}, "atropos.jsonl", 3},
		{[]string{"export", "verl", run, "-o", filepath.Join(out, "verl.jsonl")}, "verl.jsonl", 11},
		{[]string{"export", "skyrl", run, "--top-k", "2", "-o", filepath.Join(out, "skyrl.jsonl")}, "skyrl.jsonl", 3},
		{[]string{"export", "nemo-gym", run, "--min-reward", "1", "-o", filepath.Join(out, "nemo.jsonl")}, "nemo.jsonl", 7},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args[:2], " ")+" "+tt.file, func(t *testing.T) {
			_, msg, code := runRolloutCmd(t, tt.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, msg)
			}
			if got := jsonLines(t, filepath.Join(out, tt.file)); len(got) != tt.lines {
				t.Errorf("%d lines, want %d", len(got), tt.lines)
			}
		})
	}
	groups := jsonLines(t, filepath.Join(out, "atropos.jsonl"))
	if g := groups[1]; len(g["tokens"].([]any)) != 3 || g["group_overrides"].(map[string]any)["group_size"] != 3.0 || g["env_id"] != 0.0 {
		t.Errorf("short group: %v %v", g["group_overrides"], g["env_id"])
	}

	// Trainer exports: token fields where each framework reads them.
	if l := jsonLines(t, filepath.Join(out, "verl.jsonl"))[0]; len(l["response_mask"].([]any)) != len(l["response_ids"].([]any)) {
		t.Errorf("verl: response_mask and response_ids differ in length")
	}
	if g := jsonLines(t, filepath.Join(out, "skyrl.jsonl"))[0]; len(g["response_ids"].([]any)) != 2 || len(g["loss_masks"].([]any)) != 2 {
		t.Errorf("skyrl: top-2 group has %d trajectories", len(g["response_ids"].([]any)))
	}
	gens := 0
	for _, it := range jsonLines(t, filepath.Join(out, "nemo.jsonl"))[0]["response"].(map[string]any)["output"].([]any) {
		if _, ok := it.(map[string]any)["generation_token_ids"]; ok {
			gens++
		}
	}
	if gens == 0 {
		t.Errorf("nemo-gym: no output item carries generation_token_ids")
	}

	stdout, msg, code := runRolloutCmd(t, "export", "eval", run, "-o", filepath.Join(out, "eval"))
	if code != 0 || !strings.Contains(stdout, "12 samples, 3 items") {
		t.Fatalf("eval: exit %d %s %s", code, stdout, msg)
	}
	for _, f := range []string{"metrics.json", "samples.jsonl"} {
		if _, err := os.Stat(filepath.Join(out, "eval", f)); err != nil {
			t.Error(err)
		}
	}

	html := filepath.Join(out, "view.html")
	stdout, msg, code = runRolloutCmd(t, "inspect", run, "--html", html)
	if code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, msg)
	}
	for _, want := range []string{"rollouts        12 (ok 11, infra_failed 1)", "sandbox_start", "phases (slowest first)", "wrote " + html} {
		if !strings.Contains(stdout, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, stdout)
		}
	}
	if b, err := os.ReadFile(html); err != nil || !strings.Contains(string(b), `"group_id":"group-0"`) {
		t.Errorf("html: %v", err)
	}
}

func TestExportInspectBadInput(t *testing.T) {
	run := syntheticRun(t)
	part := filepath.Join(run, "part-00001.parquet")
	b, err := os.ReadFile(part)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(part, b[:len(b)-100], 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "nope")
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"inspect", missing}, 1, missing},
		{[]string{"export", "sft", run, "-o", filepath.Join(t.TempDir(), "x.jsonl")}, 1, part + ": truncated or corrupt Parquet file: no Parquet footer"},
		{[]string{"inspect", run}, 1, part + ": truncated or corrupt"},
		{[]string{"export", "sft", run}, 2, "-o FILE is required"},
		{[]string{"export", "sft", run, "-o", "x", "--format", "alpaca"}, 2, `--format "alpaca"`},
		{[]string{"export", "eval", run}, 2, "-o DIR is required"},
		{[]string{"export", "verl", run, "-o", filepath.Join(t.TempDir(), "x.jsonl")}, 1, part + ": truncated or corrupt"},
		{[]string{"export", "skyrl", run}, 2, "-o FILE is required"},
		{[]string{"export", "nemo-gym", run, "-o", "x", "--top-k", "-1"}, 2, "--top-k -1: must be >= 0"},
		{[]string{"export", "verl", missing, "-o", "x"}, 1, missing},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args[:2], " "), func(t *testing.T) {
			_, msg, code := runRolloutCmd(t, tt.args...)
			if code != tt.code || !strings.Contains(msg, tt.want) {
				t.Errorf("exit %d, %q; want %d containing %q", code, msg, tt.code, tt.want)
			}
		})
	}
}
