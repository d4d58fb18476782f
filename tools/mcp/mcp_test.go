package mcp

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/internal/testkit/mcptest"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/sandbox/host"
	"github.com/rollout-rl/rollout/tools"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

func byName(t *testing.T, s *Sessions) map[string]tools.Tool {
	t.Helper()
	m := map[string]tools.Tool{}
	for _, tl := range s.Tools() {
		m[tl.Name] = tl
	}
	return m
}

func run(t *testing.T, tl tools.Tool, args tools.Args) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return tl.Handler(ctx, nil, args)
}

// A stdio MCP server started inside a busybox sandbox through the exec
// channel's pipe: its tools act on the sandbox's filesystem, and its
// death is an infrastructure failure (sandbox.ErrUnavailable).
func TestStdioServerInSandbox(t *testing.T) {
	bin := mcptest.Binary(t)
	d, err := docker.New(context.Background(), docker.Options{Options: host.Options{Instance: "mcptest", ReapInterval: -1}})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("Docker not usable: %v", err)
	}
	defer d.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := d.Create(ctx, sandbox.Spec{Image: "rollout-sandbox:busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/workspace/mcptest-server", data, 0o755); err != nil {
		t.Fatal(err)
	}
	servers := []Server{{Name: "fs", Command: []string{"/workspace/mcptest-server"}}}
	if err := Validate(servers); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, servers, sb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := byName(t, s)
	if len(ts) != 4 || ts["mcp_fs_write_file"].Toolset != "mcp-fs" || !strings.Contains(string(ts["mcp_fs_write_file"].Parameters), `"path"`) {
		t.Fatalf("tools %v", ts)
	}
	out, err := run(t, ts["mcp_fs_write_file"], tools.Args{"path": "/workspace/note.txt", "content": "from mcp"})
	if err != nil || !strings.Contains(out, "wrote 8 bytes") {
		t.Fatalf("write_file: %q %v", out, err)
	}
	if b, err := sb.ReadFile(ctx, "/workspace/note.txt"); err != nil || string(b) != "from mcp" {
		t.Fatalf("the server did not act on the sandbox: %q %v", b, err)
	}
	out, err = run(t, ts["mcp_fs_add"], tools.Args{"a": 2, "b": 3})
	if err != nil || !strings.Contains(out, `"sum":5`) {
		t.Fatalf("add: %q %v", out, err)
	}
	// A tool-level error is the model's business, not an infra failure.
	_, err = run(t, ts["mcp_fs_read_file"], tools.Args{"path": "/nope"})
	if err == nil || errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("read_file of a missing file: %v", err)
	}
	// The server dies mid-episode: an infrastructure failure naming it.
	_, err = run(t, ts["mcp_fs_crash"], tools.Args{})
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "mcp server fs") {
		t.Fatalf("crash: %v", err)
	}
	_, err = run(t, ts["mcp_fs_add"], tools.Args{"a": 1, "b": 1})
	if !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("call after the crash: %v", err)
	}
	// A command that is not there fails at open, as infra.
	_, err = Open(ctx, []Server{{Name: "x", Command: []string{"/nonexistent"}}}, sb, nil)
	if !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("missing command: %v", err)
	}
}

// A streamable-HTTP MCP server on loopback, reached from the host.
func TestHTTPServer(t *testing.T) {
	url := mcptest.ServeHTTP(t, mcptest.Binary(t))
	ctx := context.Background()
	s, err := Open(ctx, []Server{{Name: "calc", URL: url, Tools: []string{"add"}}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := byName(t, s)
	if len(ts) != 1 {
		t.Fatalf("allowlist: %v", ts)
	}
	out, err := run(t, ts["mcp_calc_add"], tools.Args{"a": 40, "b": 2})
	if err != nil || !strings.Contains(out, `"sum":42`) {
		t.Fatalf("add: %q %v", out, err)
	}
	if _, err := Open(ctx, []Server{{Name: "calc", URL: url, Tools: []string{"mul"}}}, nil, nil); err == nil || !strings.Contains(err.Error(), `"mul"`) {
		t.Fatalf("unknown allowlisted tool: %v", err)
	}
	if _, err := Open(ctx, []Server{{Name: "down", URL: "http://127.0.0.1:1/mcp", StartTimeout: 5 * time.Second}}, nil, nil); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("unreachable server: %v", err)
	}
	if _, err := Open(ctx, []Server{{Name: "fs", Command: []string{"x"}}}, nil, nil); err == nil || !strings.Contains(err.Error(), "needs the rollout's sandbox") {
		t.Fatalf("command server without a sandbox: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		s    []Server
		want string
	}{
		{[]Server{{Name: "bad name", URL: "http://x"}}, "must match"},
		{[]Server{{Name: "a", URL: "http://x"}, {Name: "a", URL: "http://y"}}, "duplicate"},
		{[]Server{{Name: "a"}}, "exactly one of command and url"},
		{[]Server{{Name: "a", URL: "http://x", Command: []string{"x"}}}, "exactly one"},
		{[]Server{{Name: "a", URL: "ftp://x"}}, "must be http"},
		{[]Server{{Name: "a", Command: []string{"x"}, BearerTokenEnv: "T"}}, "url servers only"},
		{[]Server{{Name: "a", URL: "http://x", Cwd: "/"}}, "command servers only"},
	} {
		if err := Validate(c.s); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.s, err, c.want)
		}
	}
	if n := ToolName("srv", "weird.name/x"); n != "mcp_srv_weird_name_x" {
		t.Errorf("ToolName = %q", n)
	}
}
