package runner

import (
	"context"
	"encoding/json"
	"fmt"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/tools"
)

// toolSet resolves the tools of one group: the configured toolsets (or a
// distribution sampled once per group, so the group shares its tools) and
// the task's own tools.
func (r *Runner) toolSet(task envs.Task, groupIdx uint64) (*tools.Set, error) {
	reg := r.tools
	enabled := task.Toolsets
	if len(r.cfg.Toolsets.Enabled) > 0 {
		enabled = r.cfg.Toolsets.Enabled
	}
	if r.cfg.Toolsets.Distribution != "" {
		sets, _, err := reg.SampleToolsets(r.cfg.Toolsets.Distribution, r.cfg.Seed*1_000_003+groupIdx)
		if err != nil {
			return nil, err
		}
		enabled = sets
	}
	if len(task.Tools) > 0 || len(task.CallOnly) > 0 {
		reg = tools.NewRegistry()
		for _, t := range tools.Builtins() {
			if err := reg.Register(t); err != nil {
				return nil, err
			}
		}
		for _, t := range task.Tools {
			if err := reg.Register(t); err != nil {
				return nil, fmt.Errorf("env tool: %w", err)
			}
			enabled = appendUnique(enabled, t.Toolset)
		}
		if len(task.CallOnly) > 0 {
			enabled = nil
			for _, ot := range task.CallOnly {
				t, err := recordOnlyTool(ot)
				if err != nil {
					return nil, err
				}
				if err := reg.Register(t); err != nil {
					return nil, fmt.Errorf("call-only tool: %w", err)
				}
			}
			enabled = []string{callOnlyToolset}
		}
	}
	if len(enabled) == 0 {
		return nil, nil
	}
	set, err := reg.Resolve(enabled, r.cfg.Toolsets.Disabled)
	if err == nil {
		err = r.checkParser(set)
	}
	return set, err
}

const callOnlyToolset = "call-only"

// needsSandbox refuses a sandbox-less task whose tool set has a built-in
// tool: those act only through the sandbox. Host-side tools (web, HTTP
// MCP servers, call-only schemas) run without one.
func needsSandbox(set *tools.Set) error {
	builtin := map[string]bool{}
	for _, t := range tools.Builtins() {
		builtin[t.Name] = true
	}
	for _, t := range set.OpenAI() {
		if t.Function != nil && builtin[t.Function.Name] {
			return fmt.Errorf("tool %s acts on the sandbox, and this task has none (disable its toolset or give the task a sandbox)", t.Function.Name)
		}
	}
	return nil
}

// recordOnlyTool offers a schema whose calls are recorded and never
// executed (single-turn call matching); the model sees that it was not run.
func recordOnlyTool(t openai.Tool) (tools.Tool, error) {
	if t.Function == nil || t.Function.Name == "" {
		return tools.Tool{}, fmt.Errorf("call-only tool without a function name")
	}
	params, err := json.Marshal(t.Function.Parameters)
	if err != nil || string(params) == "null" {
		params = []byte(`{"type":"object","properties":{}}`)
	}
	return tools.Tool{
		Name: t.Function.Name, Description: t.Function.Description, Parameters: params,
		Toolset: callOnlyToolset, Class: tools.ReadOnly,
		Handler: func(context.Context, *tools.Runtime, tools.Args) (string, error) {
			return `{"status":"recorded","note":"this call is evaluated, not executed"}`, nil
		},
	}, nil
}

func appendUnique(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(append([]string(nil), list...), s)
}
