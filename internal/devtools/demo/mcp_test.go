package demo

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	openai "github.com/sashabaranov/go-openai"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/internal/testkit/mcptest"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/tools/mcp"
	"github.com/rollout-rl/rollout/trajectory"
)

// mcpEnv is a test env whose only tools come from two real MCP servers
// (internal/testkit/mcptest, on the official SDK): "fs" runs inside the rollout's
// busybox sandbox over stdio (its binary is baked into the task image,
// built without a registry), "calc" is a streamable-HTTP server on
// loopback. The task: compute a+b with calc and write it with fs; the
// reward reads the file the stdio server wrote in the sandbox.
type mcpEnv struct {
	ctxTar []byte
	url    string
	crash  bool // the solution crashes the stdio server
}

var (
	mcpEnvMu  sync.Mutex
	mcpEnvCur *mcpEnv
	mcpOnce   sync.Once
)

func registerMCPEnv() {
	mcpOnce.Do(func() {
		envs.Register("mcp-test", func(*yaml.Node) (envs.Env, error) {
			mcpEnvMu.Lock()
			defer mcpEnvMu.Unlock()
			if mcpEnvCur == nil {
				return nil, fmt.Errorf("mcp-test: not set up")
			}
			return mcpEnvCur, nil
		})
	})
}

func (e *mcpEnv) Name() string { return "mcp-test" }
func (e *mcpEnv) Defaults() envs.Defaults {
	return envs.Defaults{GroupSize: 2, MaxTurns: 6, Splits: []string{"train"}}
}

func (e *mcpEnv) Items(context.Context, string) ([]datasets.Item, error) {
	var out []datasets.Item
	for i, p := range [][2]int{{2, 3}, {40, 2}} {
		out = append(out, datasets.Item{ID: fmt.Sprintf("sum-%d", i), Data: map[string]any{"a": p[0], "b": p[1]}, Source: "mcp-test", Row: i + 1})
	}
	return out, nil
}

func (e *mcpEnv) ab(it datasets.Item) (int, int) { return it.Data["a"].(int), it.Data["b"].(int) }

func (e *mcpEnv) Task(_ context.Context, it datasets.Item) (envs.Task, error) {
	a, b := e.ab(it)
	return envs.Task{
		Messages: []openai.ChatCompletionMessage{{Role: "user", Content: fmt.Sprintf("Add %d and %d with the calc tool and write the sum to /workspace/sum.txt with the fs tool.", a, b)}},
		Sandbox:  &sandbox.Spec{Workdir: "/workspace"},
		Build:    &envs.ImageBuild{ContextTar: e.ctxTar},
		MCPServers: []mcp.Server{
			{Name: "fs", Command: []string{"/usr/local/bin/mcptest-server"}},
			{Name: "calc", URL: e.url},
		},
	}, nil
}

func (e *mcpEnv) Solution(it datasets.Item) (json.RawMessage, bool) {
	a, b := e.ab(it)
	if e.crash {
		crash := []any{map[string]any{"tool_calls": []any{map[string]any{"name": "mcp_fs_crash", "arguments": map[string]any{}}}},
			map[string]any{"final": "Done."}}
		raw, _ := json.Marshal(map[string]any{"steps": crash, "wrong": crash})
		return raw, true
	}
	sol := map[string]any{
		"steps": []any{
			map[string]any{"tool_calls": []any{map[string]any{"name": "mcp_calc_add", "arguments": map[string]any{"a": a, "b": b}}}},
			map[string]any{"tool_calls": []any{map[string]any{"name": "mcp_fs_write_file", "arguments": map[string]any{"path": "/workspace/sum.txt", "content": fmt.Sprint(a + b)}}}},
			map[string]any{"final": "Done."}},
		"wrong": []any{
			map[string]any{"tool_calls": []any{map[string]any{"name": "mcp_fs_write_file", "arguments": map[string]any{"path": "/workspace/sum.txt", "content": fmt.Sprint(a * b)}}}},
			map[string]any{"final": "Done."}},
	}
	raw, _ := json.Marshal(sol)
	return raw, true
}

func (e *mcpEnv) Reward(ctx context.Context, it datasets.Item, _ envs.Outcome, sb envs.Sandbox) (rewards.Score, error) {
	a, b := e.ab(it)
	got, err := sb.ReadFile(ctx, "/workspace/sum.txt")
	if err != nil {
		return rewards.Score{Value: 0}, nil
	}
	if strings.TrimSpace(string(got)) == fmt.Sprint(a+b) {
		return rewards.Score{Value: 1}, nil
	}
	return rewards.Score{Value: 0}, nil
}

func contextTar(t *testing.T, bin string) []byte {
	t.Helper()
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{
		{"Dockerfile", 0o644, []byte("FROM rollout-sandbox:busybox\nCOPY mcptest-server /usr/local/bin/mcptest-server\n")},
		{"mcptest-server", 0o755, data},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data))}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(f.data)
	}
	_ = tw.Close()
	return buf.Bytes()
}

// MCP tools end to end: real sandboxes, a task image built locally, a
// stdio MCP server per rollout inside its sandbox plus an HTTP one on
// loopback, the simulator calling the namespaced tools. At success 0.5
// the reward says exactly whether the rollout followed the solution.
func TestMCPEndToEnd(t *testing.T) {
	needImages(t, false)
	bin := mcptest.Binary(t)
	registerMCPEnv()
	mcpEnvMu.Lock()
	mcpEnvCur = &mcpEnv{ctxTar: contextTar(t, bin), url: mcptest.ServeHTTP(t, bin)}
	mcpEnvMu.Unlock()
	specs := []Spec{{Env: "mcp-test", Groups: 2, GroupSize: 3}}
	res, err := Run(context.Background(), Options{SandboxInstance: testInstance(), Out: t.TempDir(), Specs: specs, Seed: 7,
		SuccessProb: 0.5, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	recs := readRun(t, res[0].Dir)
	checkRecords(t, recs, 2, 3)
	var right, wrong int
	for _, rec := range recs {
		if rec.Status != trajectory.StatusOK {
			t.Fatalf("%s rollout %d: %s %+v", rec.ItemID, rec.RolloutIndex, rec.Status, rec.Failure)
		}
		if !strings.Contains(rec.Tools, `"mcp_fs_write_file"`) || !strings.Contains(rec.Tools, `"mcp_calc_add"`) {
			t.Errorf("offered tools: %s", rec.Tools)
		}
		usedCalc := strings.Contains(rec.Messages, `\"sum\":`)
		if (rec.Reward == 1) != usedCalc {
			t.Errorf("%s rollout %d: reward %v, calc result seen %v", rec.ItemID, rec.RolloutIndex, rec.Reward, usedCalc)
		}
		if rec.Reward == 1 {
			right++
		} else {
			wrong++
		}
	}
	if right == 0 || wrong == 0 {
		t.Errorf("want both outcomes: %d right, %d wrong", right, wrong)
	}
	t.Logf("mcp: %d right, %d wrong", right, wrong)
	assertNoContainers(t)
}

// An MCP server that dies mid-episode is an infrastructure failure of the
// rollout (kind "sandbox", the server named), never a score.
func TestMCPServerDeathIsInfra(t *testing.T) {
	needImages(t, false)
	bin := mcptest.Binary(t)
	registerMCPEnv()
	mcpEnvMu.Lock()
	mcpEnvCur = &mcpEnv{ctxTar: contextTar(t, bin), url: mcptest.ServeHTTP(t, bin), crash: true}
	mcpEnvMu.Unlock()
	specs := []Spec{{Env: "mcp-test", Groups: 1, GroupSize: 2}}
	res, err := Run(context.Background(), Options{SandboxInstance: testInstance(), Out: t.TempDir(), Specs: specs, Seed: 7,
		SuccessProb: 1, Retries: -1, Logger: quiet})
	if err == nil || len(res) != 1 {
		t.Fatalf("a run whose every rollout lost its MCP server succeeded: %v", err)
	}
	recs := readRun(t, res[0].Dir)
	if len(recs) != 2 {
		t.Fatalf("%d records", len(recs))
	}
	for _, rec := range recs {
		if rec.Status != trajectory.StatusInfraFailed || rec.Failure == nil || rec.Failure.Kind != "sandbox" ||
			!strings.Contains(rec.Failure.Message, "mcp server fs") {
			t.Errorf("rollout %d: %s %+v", rec.RolloutIndex, rec.Status, rec.Failure)
		}
	}
	assertNoContainers(t)
}
