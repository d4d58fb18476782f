package runner

import (
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/tools"
	"github.com/rollout-rl/rollout/tools/web"
)

// A task without a sandbox may carry host-side tools, never built-ins.
func TestNeedsSandbox(t *testing.T) {
	set, err := tools.Default().Resolve([]string{"terminal"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := needsSandbox(set); err == nil || !strings.Contains(err.Error(), "acts on the sandbox, and this task has none") {
		t.Fatalf("terminal without a sandbox: %v", err)
	}
	p, err := web.New(web.Config{Provider: "corpus"}, []web.Doc{{URL: "u", Text: "t"}})
	if err != nil {
		t.Fatal(err)
	}
	reg := tools.NewRegistry()
	for _, tl := range web.Tools(p, 3) {
		if err := reg.Register(tl); err != nil {
			t.Fatal(err)
		}
	}
	set, err = reg.Resolve([]string{web.Toolset}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := needsSandbox(set); err != nil {
		t.Fatalf("web tools: %v", err)
	}
}

func TestConfigMCPServers(t *testing.T) {
	base := "env: terminal-tasks\ninference: {endpoints: [http://127.0.0.1:1]}\n"
	c, err := ParseConfig([]byte(base + "mcp_servers:\n  - {name: fs, command: [/bin/srv, -v], env: {A: b}, call_timeout: 5s}\n  - {name: calc, url: 'http://127.0.0.1:9/mcp', tools: [add]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(c.MCPServers) != 2 || c.MCPServers[0].Command[1] != "-v" || c.MCPServers[0].CallTimeout.Seconds() != 5 || c.MCPServers[1].Tools[0] != "add" {
		t.Fatalf("decoded %+v", c.MCPServers)
	}
	for extra, want := range map[string]string{
		"mcp_servers: [{name: fs, comand: [x]}]\n":        "comand",
		"mcp_servers: [{name: fs}]\n":                     "exactly one of command and url",
		"mcp_servers: [{name: 'a b', url: 'http://x'}]\n": "must match",
	} {
		c, err := ParseConfig([]byte(base + extra))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", extra, err, want)
		}
	}
}
