package realengine

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/envservertest"
	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
	"github.com/rollout-rl/rollout/trajectory"
)

// callGrammar is a llama.cpp GBNF grammar whose only sentences are
// Hermes tool calls of the given JSON bodies: the tiny random model's
// sampling (its ids and logprobs, trained as usual) is constrained to
// well-formed calls of the env server's tools, whose arguments it still
// picks.
func callGrammar(bodies ...string) map[string]any {
	return map[string]any{"grammar": `root ::= "<tool_call>\n" call "\n</tool_call>"` + "\ncall ::= " + strings.Join(bodies, " | ")}
}

// envProtoRun is one `rollout run` of a YAML env whose episodes are
// played on an env server in the rollouts' sandboxes.
func envProtoRun(t *testing.T, e *llamacpptest.Engine, image, envYAML string, extra map[string]any) []trajectory.Record {
	t.Helper()
	dir := t.TempDir()
	envPath := filepath.Join(dir, "env.yaml")
	if err := os.WriteFile(envPath, []byte(envYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	cfg := map[string]any{
		"env": envPath, "groups": 2, "group_size": 2, "seed": 36,
		"inference": map[string]any{"backend": "llamacpp", "endpoints": []string{e.URL}, "retries": 2, "timeout": "2m"},
		"sampling":  map[string]any{"temperature": 1.0, "max_tokens": 64, "extra_body": extra},
		"parser":    "hermes", "rollout_timeout": "3m", "max_consecutive_invalid": 10,
		"limits":  map[string]any{"rollouts_in_flight": 4, "groups_in_flight": 2, "sandboxes": 4},
		"sandbox": map[string]any{"warm_pool": -1},
		"output":  map[string]any{"dir": out},
	}
	path := filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(path, []byte(mustJSON(cfg)), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stdout, stderr, code := runRollout(t, suiteCtx(t), "run", "-c", path)
	t.Logf("rollout run %s: %s\n%s", filepath.Base(image), time.Since(start).Round(time.Second), stdout)
	if code != 0 {
		t.Fatalf("rollout run: exit %d\nstdout:\n%s\nstderr (tail):\n%s\nserver log:\n%s", code, stdout, tail(stderr, 40), e.LogTail(20))
	}
	if b, err := exec.Command("docker", "ps", "-aq", "--filter", "ancestor="+image).Output(); err != nil || strings.TrimSpace(string(b)) != "" {
		t.Errorf("containers of %s left after the run: %q (%v)", image, b, err)
	}
	run, err := trajectory.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadAll(suiteCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 4 {
		t.Fatalf("%d records, want 2 groups × 2", len(recs))
	}
	return recs
}

// toolResults are a record's tool messages.
func toolResults(t *testing.T, r trajectory.Record) []string {
	t.Helper()
	var msgs []message
	if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range msgs {
		if s, ok := m.Content.(string); ok && m.Role == "tool" {
			out = append(out, s)
		}
	}
	return out
}

// TestOpenEnvProtocolRun: an OpenEnv-protocol server (envservertest,
// written from OpenEnv's protocol) runs as each rollout's sandbox; `rollout
// run` with the real engine in tokens mode plays its MCP tools over /ws,
// and the rows hold the env's observations as tool results, its step
// rewards as turn rewards and their sum as the reward.
func TestOpenEnvProtocolRun(t *testing.T) {
	e := startEngine(t)
	image := envservertest.Image(t, "rollout-sandbox:busybox")
	env := `name: openenv-counter
prompt: "Play the counting game: call the add tool with n from 1 to 3 until the game is done."
max_turns: 4
items: [{id: a, seed: 11}, {id: b, seed: 12}]
env_server:
  protocol: openenv
  image: ` + image + `
  command: ` + envservertest.ServerPath + ` -protocol openenv -addr 127.0.0.1:8000 -steps 2
  port: 8000
  start_timeout: 1m
  call_timeout: 30s
`
	recs := envProtoRun(t, e, image, env, callGrammar(`"{\"name\": \"add\", \"arguments\": {\"n\": " [0-4] "}}"`, `"{\"name\": \"peek\", \"arguments\": {}}"`))
	fromEnv, rewarded := 0, 0
	for _, r := range recs {
		name := r.ItemID + "/" + strconv.Itoa(int(r.RolloutIndex))
		if r.Status != "ok" {
			t.Errorf("%s: status %s: %+v", name, r.Status, r.Failure)
			continue
		}
		for _, c := range toolResults(t, r) {
			if strings.Contains(c, envservertest.OpenEnvMarker) {
				fromEnv++
			}
		}
		var sum float64
		for _, v := range r.TurnRewards {
			sum += v
		}
		if r.Reward != sum || r.RewardComponents["env_reward_sum"] != r.Reward {
			t.Errorf("%s: reward %v, turn rewards %v (sum %v), components %v: the reward is the env's step rewards", name, r.Reward, r.TurnRewards, sum, r.RewardComponents)
		}
		if r.RewardComponents["env_done"] == 1 && r.StopReason != "env_done" {
			t.Errorf("%s: the env said done, stop reason %s", name, r.StopReason)
		}
		if r.Reward > 0 {
			rewarded++
		}
		t.Logf("%s: stop %s, turns %d, reward %v, turn rewards %v, components %v", name, r.StopReason, r.Turns, r.Reward, r.TurnRewards, r.RewardComponents)
	}
	if fromEnv == 0 || rewarded == 0 {
		t.Fatalf("%d tool results from the env server, %d rewarded rollouts: want some of each", fromEnv, rewarded)
	}
}

// TestNeMoGymProtocolRun: a NeMo Gym resources server (envservertest)
// runs as each rollout's sandbox; the rows' prompts and tools are NeMo Gym
// dataset rows', the tools run on the server under the rollout's session
// cookie, and /verify's reward and components are the rollout's.
func TestNeMoGymProtocolRun(t *testing.T) {
	e := startEngine(t)
	image := envservertest.Image(t, "rollout-sandbox:busybox")
	dir := t.TempDir()
	tools := `[{"type": "function", "name": "increment_counter", "description": "Add count to the counter.", "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}},
	{"type": "function", "name": "get_counter_value", "description": "Read the counter.", "parameters": {"type": "object", "properties": {}}}]`
	var rows []string
	for i, start := range []int{3, 5} {
		rows = append(rows, `{"id": "row`+strconv.Itoa(i)+`", "responses_create_params": {"input": [{"role": "user", "content": "Add 1 to the counter three times, then stop."}], "tools": `+
			strings.ReplaceAll(tools, "\n", "")+`}, "initial_count": `+strconv.Itoa(start)+`, "expected_count": `+strconv.Itoa(start+3)+`}`)
	}
	data := filepath.Join(dir, "rows.jsonl")
	if err := os.WriteFile(data, []byte(strings.Join(rows, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := `name: nemo-gym-counter
max_turns: 3
dataset: {path: ` + data + `}
env_server:
  protocol: nemo_gym
  image: ` + image + `
  command: ` + envservertest.ServerPath + ` -protocol nemo_gym -addr 127.0.0.1:8000
  port: 8000
`
	recs := envProtoRun(t, e, image, env, callGrammar(`"{\"name\": \"increment_counter\", \"arguments\": {\"count\": 1}}"`, `"{\"name\": \"get_counter_value\", \"arguments\": {}}"`))
	fromEnv := 0
	for _, r := range recs {
		name := r.ItemID + "/" + strconv.Itoa(int(r.RolloutIndex))
		if r.Status != "ok" {
			t.Errorf("%s: status %s: %+v", name, r.Status, r.Failure)
			continue
		}
		results := toolResults(t, r)
		accepted, increments := 0, 0
		for _, c := range results {
			if strings.Contains(c, envservertest.NeMoGymMarker) {
				fromEnv++
				accepted++
				if strings.Contains(c, `"success":true`) {
					increments++
				}
			}
		}
		// Three increments of 1 in the three turns reach expected_count:
		// /verify's reward is 1 exactly then.
		if want := map[bool]float64{true: 1, false: 0}[increments == 3]; r.Reward != want {
			t.Errorf("%s: reward %v after %d increments, want %v", name, r.Reward, increments, want)
		}
		comps := r.RewardComponents
		if _, ok := comps["count_matches"]; !ok || r.Reward != comps["count_matches"] || comps["tool_calls"] != float64(accepted) {
			t.Errorf("%s: reward %v, components %v, %d accepted calls in the history: want /verify's reward and its count of this session's calls", name, r.Reward, comps, accepted)
		}
		t.Logf("%s: stop %s, turns %d, reward %v, components %v", name, r.StopReason, r.Turns, r.Reward, comps)
	}
	if fromEnv == 0 {
		t.Fatal("no tool result came from the resources server")
	}
}
