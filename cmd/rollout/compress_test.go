package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/trajectory"
	"github.com/rollout-rl/rollout/trajectory/compress"
)

// `rollout compress` end to end on the simulator: the output file holds
// the compressed conversation, the metrics file its counts; missing flags
// are usage errors, and a bad input line fails without leaving an output.
func TestCompressCmd(t *testing.T) {
	srv, err := sim.Start(context.Background(), sim.Config{Family: "hermes", SuccessProb: 1,
		Scripts: []sim.Script{{Match: "Summarize them in at most about", Steps: []sim.Step{{Final: "It ran the tests."}}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dir := t.TempDir()
	conv := []trajectory.ShareGPTTurn{{From: "system", Value: "sys"}, {From: "human", Value: "task"}}
	for range 10 {
		conv = append(conv, trajectory.ShareGPTTurn{From: "gpt", Value: strings.Repeat("call ", 40)}, trajectory.ShareGPTTurn{From: "tool", Value: strings.Repeat("output ", 40)})
	}
	b, _ := json.Marshal(map[string]any{"conversations": conv})
	in := filepath.Join(dir, "sft.jsonl")
	if err := os.WriteFile(in, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	out, metrics := filepath.Join(dir, "small.jsonl"), filepath.Join(dir, "m.json")
	_, msg, code := runRolloutCmd(t, "compress", in, "-o", out, "--tokenizer", srv.URL, "--model", "rollout-sim",
		"--summarizer", srv.URL, "--summarizer-model", "rollout-sim", "--target-tokens", "2500", "--summary-tokens", "100", "--metrics", metrics)
	if code != 0 || !strings.Contains(msg, "1 conversations: 0 within the target, 1 compressed") {
		t.Fatalf("exit %d: %s", code, msg)
	}
	var st compress.Stats
	if b, err := os.ReadFile(metrics); err != nil || json.Unmarshal(b, &st) != nil || st.Compressed != 1 || st.TokensAfter > 2500 || st.StillOver != 0 {
		t.Fatalf("metrics %s: %v", b, err)
	}
	data, err := os.ReadFile(out)
	if err != nil || !strings.Contains(string(data), "[CONTEXT SUMMARY]: It ran the tests.") {
		t.Fatalf("output %s: %v", data, err)
	}

	if _, msg, code := runRolloutCmd(t, "compress", in, "-o", out); code != 2 || !strings.Contains(msg, "required") {
		t.Fatalf("missing flags: exit %d: %s", code, msg)
	}
	bad := filepath.Join(dir, "bad.jsonl")
	_ = os.WriteFile(bad, []byte("{\"conversations\": []}\nnot json\n"), 0o644)
	badOut := filepath.Join(dir, "bad-out.jsonl")
	if _, msg, code := runRolloutCmd(t, "compress", bad, "-o", badOut, "--tokenizer", srv.URL, "--summarizer", srv.URL, "--summarizer-model", "m"); code != 1 || !strings.Contains(msg, "line 2") {
		t.Fatalf("bad line: exit %d: %s", code, msg)
	}
	if _, err := os.Stat(badOut); !os.IsNotExist(err) {
		t.Fatalf("a failed run left its output: %v", err)
	}
}
