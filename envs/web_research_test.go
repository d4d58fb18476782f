package envs

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/datasets"
)

func TestWebResearchReward(t *testing.T) {
	e := mustEnv(t, "web-research", "")
	ctx := context.Background()
	items, err := e.Items(ctx, "eval")
	if err != nil {
		t.Fatal(err)
	}
	var pop datasets.Item
	for _, it := range items {
		if it.ID == "web-8" {
			pop = it
		}
	}
	task, err := e.Task(ctx, pop)
	if err != nil || len(task.Tools) != 2 || task.Tools[0].Name != "web_search" || task.Sandbox != nil {
		t.Fatalf("task %+v %v", task, err)
	}
	for final, want := range map[string]float64{
		"I looked it up.\nAnswer: 18,400":  1,
		"**Answer:** 18400":                1,
		"Answer: 14,800":                   0,
		"18,400":                           1, // no answer line: the whole message
		"The population is 18,400 people.": 0,
		"Answer: 1\nAnswer: 18,400":        1, // the last answer line counts
	} {
		s, err := e.Reward(ctx, pop, Outcome{Final: final}, nil)
		if err != nil || s.Value != want {
			t.Errorf("%q: %v %v, want %v", final, s, err, want)
		}
	}
	// The default provider answers from the embedded corpus.
	out, err := task.Tools[0].Handler(ctx, nil, map[string]any{"query": "Orrin population census"})
	if err != nil || !strings.Contains(out, "corpus.rollout.local/wiki/orrin") {
		t.Fatalf("search: %s %v", out, err)
	}
	out, err = task.Tools[1].Handler(ctx, nil, map[string]any{"urls": []any{"https://corpus.rollout.local/wiki/orrin"}})
	if err != nil || !strings.Contains(out, "18,400") {
		t.Fatalf("extract: %s %v", out, err)
	}
}

func TestWebResearchConfigErrors(t *testing.T) {
	for cfg, want := range map[string]string{
		"reward: fuzzy\n":                          "exact_match or llm_judge",
		"reward: llm_judge\n":                      "base_url and model are required",
		"web: {provider: searxng}\n":               "needs url",
		"web: {provider: corpus, corpus_path: /x}": "corpus",
		"group_size: 0\n":                          "group_size",
		"reward: llm_judge\njudge: {base_url: http://127.0.0.1:1, model: m, api_key_env: ROLLOUT_TEST_UNSET}\n": "ROLLOUT_TEST_UNSET",
	} {
		if _, err := newEnvFromText("web-research", cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", cfg, err, want)
		}
	}
}

func TestYAMLEnvMCPServers(t *testing.T) {
	base := "name: m\nprompt: go\nitems: [{id: a, solution: {steps: [{final: ok}]}}]\nrewards: [{type: format, regex: ok}]\n"
	spec := func(extra string) (YAMLSpec, error) {
		var s YAMLSpec
		return s, yaml.Unmarshal([]byte(base+extra), &s)
	}
	s, err := spec("sandbox: {image: rollout-sandbox:busybox}\nmcp_servers: [{name: fs, command: [/bin/srv]}, {name: calc, url: 'http://127.0.0.1:9/mcp'}]\n")
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewYAMLEnv(s, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	items, err := e.Items(context.Background(), "train")
	if err != nil {
		t.Fatal(err)
	}
	task, err := e.Task(context.Background(), items[0])
	if err != nil || len(task.MCPServers) != 2 || task.MCPServers[0].Command[0] != "/bin/srv" {
		t.Fatalf("task %+v %v", task.MCPServers, err)
	}
	if sol, ok := e.Solution(items[0]); !ok || !strings.Contains(string(sol), `"final":"ok"`) {
		t.Fatalf("solution %s %v", sol, ok)
	}
	for extra, want := range map[string]string{
		"mcp_servers: [{name: fs, command: [/bin/srv]}]\n":                                             "set sandbox",
		"sandbox: {image: x}\nmcp_servers: [{name: fs}]\n":                                             "exactly one of command and url",
		"sandbox: {image: x}\nmcp_servers: [{name: a, url: 'http://x'}, {name: a, url: 'http://y'}]\n": "duplicate",
	} {
		s, err := spec(extra)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := NewYAMLEnv(s, t.TempDir()); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", extra, err, want)
		}
	}
}
