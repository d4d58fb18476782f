package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/sandbox/host"

	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/sandbox/docker"
)

func runChatCmd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetArgs(append([]string{"chat"}, args...))
	root.SetOut(&out)
	root.SetErr(&errOut)
	err := root.ExecuteContext(context.Background())
	code := 0
	if err != nil {
		code = 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		}
	}
	return out.String() + errOut.String(), code
}

func TestChatUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--endpoint", "http://x", "--image", "i"},
		{"--endpoint", "http://x", "--image", "i", "a", "b"},
		{"--image", "i", "task"},
		{"--endpoint", "http://x", "task"},
		{"--endpoint", "http://x", "--image", "i", "--backend", "vllm", "task"},
		{"--endpoint", "http://x", "--image", "i", "--backend", "tgi", "task"},
		{"--endpoint", "http://x", "--image", "i", "--toolsets", "web", "task"},
		{"--endpoint", "http://x", "--image", "i", "--extra-body", "[1]", "task"},
		{"--endpoint", "http://x", "--image", "i", "--extra-body", "{", "task"},
	} {
		if out, code := runChatCmd(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2\n%s", args, code, out)
		}
	}
}

// TestChatEpisode runs `rollout chat` against the simulator with a real
// Docker sandbox and checks the transcript and the --out trajectory.
func TestChatEpisode(t *testing.T) {
	d, err := docker.New(context.Background(), docker.Options{Options: host.Options{ReapInterval: -1}})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and Docker is not usable: %v", err)
		}
		t.Skipf("Docker not usable: %v", err)
	}
	d.Close(context.Background())
	srv, err := sim.Start(context.Background(), sim.Config{Family: "hermes", Reasoning: true, Scripts: []sim.Script{{Match: "hello file", Steps: []sim.Step{
		{ToolCalls: []sim.Call{{Name: "write_file", Arguments: map[string]any{"path": "hello.txt", "content": "hi\n"}}}},
		{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "cat hello.txt"}}}},
		{Final: "The file says hi."},
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	// Token-exact (vllm) and the default chat backend, whose --out must
	// still carry tokens, masks and logprobs (it asks for token ids).
	for _, backend := range [][]string{{"--backend", "vllm", "--parser", "hermes", "--reasoning-parser", "qwen3"}, {}} {
		t.Run(fmt.Sprint("backend", backend), func(t *testing.T) { chatEpisode(t, srv.URL, backend) })
	}
}

func chatEpisode(t *testing.T, url string, backend []string) {
	out := filepath.Join(t.TempDir(), "traj.json")
	args := append([]string{"--endpoint", url}, backend...)
	args = append(args, "--image", "rollout-sandbox:bookworm", "--out", out, "write a hello file")
	text, code := runChatCmd(t, args...)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, text)
	}
	for _, want := range []string{"user: write a hello file", "→ write_file(", "→ terminal({\"command\":\"cat hello.txt\"})", `"output":"hi"`, "stop: finished (turns 3"} {
		if !strings.Contains(text, want) {
			t.Errorf("transcript lacks %q:\n%s", want, text)
		}
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var traj struct {
		Messages   []json.RawMessage `json:"messages"`
		Tokens     []int32           `json:"tokens"`
		LossMask   []int8            `json:"loss_mask"`
		Logprobs   []float32         `json:"logprobs"`
		StopReason string            `json:"stop_reason"`
	}
	if err := json.Unmarshal(raw, &traj); err != nil {
		t.Fatal(err)
	}
	trained := 0
	for _, m := range traj.LossMask {
		trained += int(m)
	}
	if traj.StopReason != "finished" || len(traj.Messages) != 7 || len(traj.Tokens) == 0 ||
		len(traj.LossMask) != len(traj.Tokens) || len(traj.Logprobs) != len(traj.Tokens) || trained == 0 || trained == len(traj.Tokens) {
		t.Fatalf("trajectory: stop %s, %d messages, %d tokens, %d mask (%d trained), %d logprobs",
			traj.StopReason, len(traj.Messages), len(traj.Tokens), len(traj.LossMask), trained, len(traj.Logprobs))
	}
}
