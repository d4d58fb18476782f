// Package mcp exposes the tools of MCP servers to the agent loop, through
// the official Go SDK (github.com/modelcontextprotocol/go-sdk). A server is
// either a command started inside the rollout's sandbox and spoken to over
// its stdio (through the sandbox's exec channel, sandbox.Piper), so its
// tools act on the sandbox, or a streamable-HTTP endpoint reached from the
// host. Each rollout opens its own sessions (one server process per
// rollout for stdio), lists the tools and offers them to the model with
// their own schemas as toolset "mcp-<server>", tools named
// "mcp_<server>_<tool>".
//
// Failure policy: a server that cannot be started, initialised or listed,
// or that dies or becomes unreachable during a call, is an infrastructure
// failure of the rollout — errors wrap sandbox.ErrUnavailable, so the loop
// ends the episode and the runner records failure kind "sandbox" with the
// server named in the message. A tool result with isError, or a JSON-RPC
// error answer, is an ordinary tool error the model sees.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/rollout-rl/rollout/internal/util/netpolicy"
	"github.com/rollout-rl/rollout/internal/util/secrets"
	"github.com/rollout-rl/rollout/internal/util/version"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/tools"
)

// Server configures one MCP server (run config or YAML env: mcp_servers).
type Server struct {
	// Name names the toolset (mcp-<name>) and prefixes the tools.
	Name string `yaml:"name" json:"name"`
	// Command (argv) starts a stdio server inside the rollout's sandbox.
	Command []string `yaml:"command,omitempty" json:"command,omitempty"`
	// Env and Cwd of the command.
	Env map[string]string `yaml:"env,omitempty" json:"env,omitempty"`
	Cwd string            `yaml:"cwd,omitempty" json:"cwd,omitempty"`
	// URL is a streamable-HTTP endpoint reached from the host.
	URL string `yaml:"url,omitempty" json:"url,omitempty"`
	// BearerTokenEnv names an environment variable whose value is sent as
	// "Authorization: Bearer <value>" to the URL.
	BearerTokenEnv string `yaml:"bearer_token_env,omitempty" json:"bearer_token_env,omitempty"`
	// Tools, when set, offers only these of the server's tools (names as
	// the server gives them).
	Tools []string `yaml:"tools,omitempty" json:"tools,omitempty"`
	// StartTimeout bounds start, initialisation and listing (default
	// 30s); CallTimeout bounds one call (default 120s).
	StartTimeout time.Duration `yaml:"start_timeout,omitempty" json:"start_timeout,omitempty"`
	CallTimeout  time.Duration `yaml:"call_timeout,omitempty" json:"call_timeout,omitempty"`
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$`)

// Validate checks a list of server configs.
func Validate(servers []Server) error {
	seen := map[string]bool{}
	for i, s := range servers {
		if !nameRE.MatchString(s.Name) {
			return fmt.Errorf("mcp_servers[%d]: name %q must match %s", i, s.Name, nameRE)
		}
		if seen[s.Name] {
			return fmt.Errorf("mcp_servers[%d]: duplicate name %q", i, s.Name)
		}
		seen[s.Name] = true
		if (len(s.Command) == 0) == (s.URL == "") {
			return fmt.Errorf("mcp_servers[%d] (%s): exactly one of command and url", i, s.Name)
		}
		if s.URL != "" && !strings.HasPrefix(s.URL, "http://") && !strings.HasPrefix(s.URL, "https://") {
			return fmt.Errorf("mcp_servers[%d] (%s): url %q must be http(s)", i, s.Name, s.URL)
		}
		if s.URL == "" && (s.BearerTokenEnv != "") {
			return fmt.Errorf("mcp_servers[%d] (%s): bearer_token_env applies to url servers only", i, s.Name)
		}
		if s.BearerTokenEnv != "" && !secrets.Allowed(s.BearerTokenEnv) {
			// Checked here too, not only when a rollout connects: a
			// server's client learns it at once.
			return fmt.Errorf("mcp_servers[%d] (%s): bearer_token_env: environment variable %s: %w", i, s.Name, s.BearerTokenEnv, secrets.ErrNotAllowed)
		}
		if s.URL != "" && (len(s.Env) > 0 || s.Cwd != "") {
			return fmt.Errorf("mcp_servers[%d] (%s): env and cwd apply to command servers only", i, s.Name)
		}
		if s.StartTimeout < 0 || s.CallTimeout < 0 {
			return fmt.Errorf("mcp_servers[%d] (%s): negative timeout", i, s.Name)
		}
	}
	return nil
}

// NeedsSandbox reports whether any server runs inside the sandbox.
func NeedsSandbox(servers []Server) bool {
	for _, s := range servers {
		if len(s.Command) > 0 {
			return true
		}
	}
	return false
}

// Sessions are one rollout's open MCP sessions and their tools.
type Sessions struct {
	sessions []*session
	tools    []tools.Tool
}

type session struct {
	mu   sync.Mutex // one call at a time per server keeps stdio servers simple
	cfg  Server
	cs   *sdk.ClientSession
	pipe sandbox.Pipe // stdio servers
}

// Open starts or connects every server (stdio ones in sb) and lists their
// tools. On error, whatever was opened is closed again; the error wraps
// sandbox.ErrUnavailable unless the configuration itself is wrong.
func Open(ctx context.Context, servers []Server, sb sandbox.Sandbox, log *slog.Logger) (*Sessions, error) {
	if log == nil {
		log = slog.Default()
	}
	out := &Sessions{}
	for _, cfg := range servers {
		s, ts, err := open(ctx, cfg, sb)
		if err != nil {
			_ = out.Close()
			return nil, err
		}
		out.sessions = append(out.sessions, s)
		out.tools = append(out.tools, ts...)
		log.Debug("mcp server open", "server", cfg.Name, "tools", len(ts))
	}
	return out, nil
}

// Tools are the servers' tools, ready for a tools.Registry.
func (s *Sessions) Tools() []tools.Tool {
	if s == nil {
		return nil
	}
	return s.tools
}

// Close ends every session (and kills stdio servers).
func (s *Sessions) Close() error {
	if s == nil {
		return nil
	}
	var errs []error
	for _, x := range s.sessions {
		errs = append(errs, x.close())
	}
	return errors.Join(errs...)
}

func (s *session) close() error {
	var err error
	if s.cs != nil {
		err = s.cs.Close()
	}
	if s.pipe != nil {
		_ = s.pipe.Close()
		err = nil // a killed stdio server reports a broken stream; expected
	}
	return err
}

func unavailable(name, what string, err error) error {
	if errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrClosed) {
		return fmt.Errorf("mcp server %s: %s: %w", name, what, err)
	}
	return fmt.Errorf("mcp server %s: %s: %w: %v", name, what, sandbox.ErrUnavailable, err)
}

func open(ctx context.Context, cfg Server, sb sandbox.Sandbox) (*session, []tools.Tool, error) {
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 120 * time.Second
	}
	sctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	s := &session{cfg: cfg}
	var transport sdk.Transport
	if len(cfg.Command) > 0 {
		if sb == nil {
			return nil, nil, fmt.Errorf("mcp server %s: a command server needs the rollout's sandbox (the task has none)", cfg.Name)
		}
		pr, ok := sb.(sandbox.Piper)
		if !ok {
			return nil, nil, fmt.Errorf("mcp server %s: this sandbox backend cannot stream a command's stdio", cfg.Name)
		}
		p, err := pr.Pipe(sctx, sandbox.ExecRequest{Argv: cfg.Command, Env: cfg.Env, Cwd: cfg.Cwd})
		if err != nil {
			return nil, nil, unavailable(cfg.Name, "start "+cfg.Command[0], err)
		}
		s.pipe = p
		transport = &sdk.IOTransport{Reader: p, Writer: p}
	} else {
		// The default transport's settings, dialing through the served
		// job's network policy (internal/util/netpolicy), when it has one.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.DialContext = netpolicy.Dialer(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second})
		hc := &http.Client{Transport: tr}
		if cfg.BearerTokenEnv != "" {
			tok, err := secrets.Lookup(cfg.BearerTokenEnv)
			if err != nil {
				return nil, nil, fmt.Errorf("mcp server %s: bearer_token_env: %w", cfg.Name, err)
			}
			hc.Transport = bearer{tok: tok, next: tr}
		}
		transport = &sdk.StreamableClientTransport{Endpoint: cfg.URL, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true}
	}
	client := sdk.NewClient(&sdk.Implementation{Name: "rollout", Version: version.Get().Version}, nil)
	cs, err := client.Connect(sctx, transport, nil)
	if err != nil {
		_ = s.close()
		return nil, nil, unavailable(cfg.Name, "connect", s.why(err))
	}
	s.cs = cs
	var ts []tools.Tool
	allowed := map[string]bool{}
	for _, n := range cfg.Tools {
		allowed[n] = true
	}
	found := map[string]bool{}
	for t, err := range cs.Tools(sctx, nil) {
		if err != nil {
			_ = s.close()
			return nil, nil, unavailable(cfg.Name, "list tools", s.why(err))
		}
		if len(allowed) > 0 && !allowed[t.Name] {
			continue
		}
		found[t.Name] = true
		tt, err := s.tool(t)
		if err != nil {
			_ = s.close()
			return nil, nil, err
		}
		ts = append(ts, tt)
	}
	for n := range allowed {
		if !found[n] {
			_ = s.close()
			return nil, nil, fmt.Errorf("mcp server %s: tools lists %q, which the server does not offer", cfg.Name, n)
		}
	}
	return s, ts, nil
}

// why prefers the stdio server's end reason (exit code and stderr) to the
// SDK's "connection closed".
func (s *session) why(err error) error {
	if s.pipe != nil {
		select {
		case <-s.pipe.Done():
			if perr := s.pipe.Err(); perr != nil {
				return fmt.Errorf("%v (%w)", err, perr)
			}
		default:
		}
	}
	return err
}

type bearer struct {
	tok  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return b.next.RoundTrip(r)
}

var badName = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// ToolName is the name the model sees for a server's tool.
func ToolName(server, tool string) string {
	n := "mcp_" + server + "_" + badName.ReplaceAllString(tool, "_")
	if len(n) > 64 {
		n = n[:64]
	}
	return n
}

func (s *session) tool(t *sdk.Tool) (tools.Tool, error) {
	schema, err := json.Marshal(t.InputSchema)
	if err != nil || string(schema) == "null" {
		schema = []byte(`{"type":"object","properties":{}}`)
	}
	name := t.Name
	desc := t.Description
	if desc == "" {
		desc = t.Title
	}
	return tools.Tool{
		Name:        ToolName(s.cfg.Name, t.Name),
		Description: desc,
		Parameters:  schema,
		Toolset:     "mcp-" + s.cfg.Name,
		Class:       tools.Exclusive,
		Handler: func(ctx context.Context, _ *tools.Runtime, args tools.Args) (string, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			cctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
			defer cancel()
			res, err := s.cs.CallTool(cctx, &sdk.CallToolParams{Name: name, Arguments: map[string]any(args)})
			if err != nil {
				if ctx.Err() != nil {
					return "", ctx.Err()
				}
				var werr *jsonrpc.Error
				if errors.As(err, &werr) {
					return "", fmt.Errorf("mcp server %s: %s", s.cfg.Name, werr.Message)
				}
				if cctx.Err() != nil {
					return "", fmt.Errorf("mcp server %s: call %s timed out after %s", s.cfg.Name, name, s.cfg.CallTimeout)
				}
				return "", unavailable(s.cfg.Name, "call "+name, s.why(err))
			}
			text := resultText(res)
			if res.IsError {
				return "", fmt.Errorf("%s", text)
			}
			return text, nil
		},
	}, nil
}

// resultText renders a tool result for the model: text parts as they are,
// structured content as JSON when there is no text, other parts named.
func resultText(res *sdk.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		switch v := c.(type) {
		case *sdk.TextContent:
			parts = append(parts, v.Text)
		case *sdk.ImageContent:
			parts = append(parts, fmt.Sprintf("[image %s, %d bytes]", v.MIMEType, len(v.Data)))
		case *sdk.AudioContent:
			parts = append(parts, fmt.Sprintf("[audio %s, %d bytes]", v.MIMEType, len(v.Data)))
		case *sdk.ResourceLink:
			parts = append(parts, fmt.Sprintf("[resource %s]", v.URI))
		case *sdk.EmbeddedResource:
			if v.Resource != nil && v.Resource.Text != "" {
				parts = append(parts, v.Resource.Text)
			} else if v.Resource != nil {
				parts = append(parts, fmt.Sprintf("[resource %s]", v.Resource.URI))
			}
		}
	}
	if len(parts) == 0 && res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			parts = append(parts, string(b))
		}
	}
	return strings.Join(parts, "\n")
}
