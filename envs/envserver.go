package envs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs/protocol"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/tools"
	"github.com/rollout-rl/rollout/tools/mcp"
)

// Sessioned is implemented by envs whose rollouts each play one episode
// on an outside env server (an environment protocol: docs/env-protocols.md).
// The runner opens the session after the rollout's sandbox (sb, nil when
// the task has none), offers its tools, lets its responder end the episode
// and passes it to Reward in Outcome.Session; it closes the session with
// the rollout. A session that cannot be opened because the server is dead
// or misbehaving is an error wrapping sandbox.ErrUnavailable.
type Sessioned interface {
	OpenSession(ctx context.Context, item datasets.Item, rolloutID string, sb sandbox.Sandbox) (Session, error)
}

// Session is one rollout's episode on an env server, as the runner sees it.
type Session interface {
	// Opening are messages the server's episode adds after the task's
	// own (OpenEnv's reset observation), nil when none.
	Opening() []openai.ChatCompletionMessage
	// Tools are the server's tools, executed on the server.
	Tools() []tools.Tool
	// Responder ends the episode when the server says it is done and
	// records each turn's step rewards.
	Responder() agentloop.Responder
	Close(ctx context.Context) error
}

// EnvServerToolset is the toolset of an env server's tools.
const EnvServerToolset = "env-server"

// Env server defaults.
const (
	DefaultEnvServerStartTimeout = 2 * time.Minute
	DefaultEnvServerCallTimeout  = 2 * time.Minute
)

// YAMLEnvServer is the env_server block of a YAMLSpec: an env server of an
// environment protocol, run from an image as the rollout's sandbox (its
// command started in it, reached through the sandbox tunnel on port) or
// reached at a running URL.
type YAMLEnvServer struct {
	Protocol string `yaml:"protocol"`
	// Image runs the server as each rollout's sandbox; Command starts it
	// there (a sandbox runs rollout's agent as its init, not the image's
	// entrypoint) and Port is where it listens on the sandbox's loopback.
	Image   string            `yaml:"image"`
	Command string            `yaml:"command"`
	Port    int               `yaml:"port"`
	Env     map[string]string `yaml:"env"`
	// Network is the sandbox's network policy (default none: the host
	// reaches the server through the tunnel either way).
	Network  string `yaml:"network"`
	MemoryMB int64  `yaml:"memory_mb"`
	// URL is a running server instead of an image.
	URL          string `yaml:"url"`
	StartTimeout string `yaml:"start_timeout"` // Go duration, default 2m
	CallTimeout  string `yaml:"call_timeout"`  // Go duration, default 2m
	// Options are the protocol's own keys (docs/env-protocols.md).
	Options yaml.Node `yaml:"options"`
}

// envServer is a validated YAMLEnvServer.
type envServer struct {
	spec                YAMLEnvServer
	proto               protocol.Protocol
	startTimeout, callT time.Duration
}

func buildEnvServer(y *YAMLEnvServer) (*envServer, error) {
	if y == nil {
		return nil, nil
	}
	fail := func(format string, a ...any) (*envServer, error) {
		return nil, fmt.Errorf("%w: env_server: %s", ErrConfig, fmt.Sprintf(format, a...))
	}
	if y.Protocol == "" {
		return fail("protocol is required (known: %s)", strings.Join(protocol.Names(), ", "))
	}
	var opts *yaml.Node
	if y.Options.Kind != 0 {
		opts = &y.Options
	}
	p, err := protocol.New(y.Protocol, opts)
	if err != nil {
		return nil, fmt.Errorf("%w: env_server: %w", ErrConfig, err)
	}
	switch {
	case (y.Image == "") == (y.URL == ""):
		return fail("give exactly one of image (the server runs as each rollout's sandbox) and url (a running server)")
	case y.Image != "" && strings.TrimSpace(y.Command) == "":
		return fail("command is required with image: the server's start command in the image")
	case y.Image != "" && (y.Port <= 0 || y.Port > 65535):
		return fail("port %d out of range 1-65535 (the port the server listens on inside the sandbox)", y.Port)
	case y.URL != "" && (y.Command != "" || y.Port != 0 || len(y.Env) > 0 || y.Network != "" || y.MemoryMB != 0):
		return fail("command, port, env, network and memory_mb belong to image; a url server runs elsewhere")
	case y.MemoryMB < 0:
		return fail("memory_mb must not be negative")
	}
	if y.URL != "" && !strings.HasPrefix(y.URL, "http://") && !strings.HasPrefix(y.URL, "https://") {
		return fail("url %q is not an http(s) URL", y.URL)
	}
	s := &envServer{spec: *y, proto: p, startTimeout: DefaultEnvServerStartTimeout, callT: DefaultEnvServerCallTimeout}
	for _, d := range []struct {
		name string
		in   string
		out  *time.Duration
	}{{"start_timeout", y.StartTimeout, &s.startTimeout}, {"call_timeout", y.CallTimeout, &s.callT}} {
		if d.in == "" {
			continue
		}
		v, err := time.ParseDuration(d.in)
		if err != nil || v <= 0 {
			return fail("%s %q is not a positive duration", d.name, d.in)
		}
		*d.out = v
	}
	s.spec.URL = strings.TrimRight(y.URL, "/")
	return s, nil
}

// sandboxSpec is the sandbox of an image server.
func (s *envServer) sandboxSpec() *sandbox.Spec {
	if s.spec.Image == "" {
		return nil
	}
	return &sandbox.Spec{Image: s.spec.Image, Env: s.spec.Env, Network: s.spec.Network,
		Limits: sandbox.Limits{MemoryBytes: s.spec.MemoryMB << 20}}
}

// endpoint reaches the server: through sb's tunnel for an image server
// (started here), over the network for a URL. stop ends what it started.
func (s *envServer) endpoint(ctx context.Context, sb sandbox.Sandbox) (protocol.Endpoint, func(), error) {
	if s.spec.URL != "" {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		ep := protocol.Endpoint{Client: &http.Client{Transport: tr}, BaseURL: s.spec.URL, Name: fmt.Sprintf("%s server %s", s.spec.Protocol, s.spec.URL)}
		return ep, tr.CloseIdleConnections, nil
	}
	if sb == nil {
		return protocol.Endpoint{}, nil, fmt.Errorf("%w: env_server: an image server needs the rollout's sandbox", ErrConfig)
	}
	name := fmt.Sprintf("%s server in sandbox %s (port %d)", s.spec.Protocol, sb.ID(), s.spec.Port)
	proc, err := sb.Start(ctx, sandbox.ExecRequest{Command: s.spec.Command, Env: s.spec.Env})
	if err != nil {
		return protocol.Endpoint{}, nil, fmt.Errorf("%s: start %q: %w", name, s.spec.Command, err)
	}
	port := s.spec.Port
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return sandbox.Dial(ctx, sb, port) },
		// One episode's requests are few and in order; idle tunnel
		// connections are not worth keeping past a minute.
		IdleConnTimeout: time.Minute,
	}
	ep := protocol.Endpoint{Client: &http.Client{Transport: tr}, BaseURL: fmt.Sprintf("http://127.0.0.1:%d", port), Name: name}
	stop := func() {
		tr.CloseIdleConnections()
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = sb.Kill(kctx, proc.ID)
	}
	if err := s.waitHealthy(ctx, sb, ep, proc.ID); err != nil {
		stop()
		return protocol.Endpoint{}, nil, err
	}
	return ep, stop, nil
}

// waitHealthy polls GET /health until the server answers 200, its process
// exits, or start_timeout passes.
func (s *envServer) waitHealthy(ctx context.Context, sb sandbox.Sandbox, ep protocol.Endpoint, procID string) error {
	wctx, cancel := context.WithTimeout(ctx, s.startTimeout)
	defer cancel()
	var last error
	for wait := 50 * time.Millisecond; ; wait = min(wait*2, time.Second) {
		req, err := http.NewRequestWithContext(wctx, http.MethodGet, ep.BaseURL+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := ep.Client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /health: %s", resp.Status)
		}
		last = err
		info, perr := sb.Poll(wctx, procID)
		if perr == nil && !info.Running {
			return fmt.Errorf("%w: %s: its command %q exited with %d before it served /health: %s", sandbox.ErrUnavailable, ep.Name,
				s.spec.Command, info.ExitCode, tail(string(info.Output), 2000))
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: %s: not healthy within start_timeout %s: %v", sandbox.ErrUnavailable, ep.Name, s.startTimeout, last)
		case <-time.After(wait):
		}
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// open opens one rollout's session.
func (s *envServer) open(ctx context.Context, it datasets.Item, rolloutID string, sb sandbox.Sandbox) (Session, error) {
	ep, stop, err := s.endpoint(ctx, sb)
	if err != nil {
		return nil, infra(err)
	}
	octx, cancel := context.WithTimeout(ctx, s.callT)
	defer cancel()
	ps, err := s.proto.Open(octx, ep, protocol.Item{Data: it.Data, RolloutID: rolloutID})
	if err != nil {
		stop()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, infra(fmt.Errorf("open %s session: %w", s.spec.Protocol, err))
	}
	return &serverSession{srv: s, ps: ps, stop: stop}, nil
}

// infra marks a server failure as the sandbox class (a dead or
// misbehaving env server is infrastructure, never the model).
func infra(err error) error {
	if err == nil || errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, context.Canceled) {
		return err
	}
	if errors.Is(err, protocol.ErrViolation) || errors.Is(err, protocol.ErrUnreachable) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
	}
	return err
}

// serverSession binds a protocol session to one rollout: its tools, the
// steps they took, the responder that reads them.
type serverSession struct {
	srv  *envServer
	ps   protocol.Session
	stop func()

	mu        sync.Mutex
	steps     []protocol.Step
	turnSteps int // steps before the current turn
	done      bool
	closeOnce sync.Once
	closeErr  error
}

var _ Session = (*serverSession)(nil)

// Opening implements Session.
func (s *serverSession) Opening() []openai.ChatCompletionMessage {
	if o := s.ps.Opening(); o != "" {
		return []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: o}}
	}
	return nil
}

// Tools implements Session.
func (s *serverSession) Tools() []tools.Tool {
	var out []tools.Tool
	for _, t := range s.ps.Tools() {
		out = append(out, tools.Tool{Name: t.Name, Description: t.Description, Parameters: t.Parameters,
			Toolset: EnvServerToolset, Class: tools.Exclusive, Handler: s.handler(t.Name)})
	}
	return out
}

func (s *serverSession) handler(name string) tools.Handler {
	return func(ctx context.Context, _ *tools.Runtime, args tools.Args) (string, error) {
		s.mu.Lock()
		done := s.done
		s.mu.Unlock()
		if done {
			return "", errors.New("the environment's episode is over; no further actions are accepted")
		}
		b, err := json.Marshal(args)
		if err != nil {
			return "", fmt.Errorf("encode arguments: %w", err)
		}
		cctx, cancel := context.WithTimeout(ctx, s.srv.callT)
		defer cancel()
		st, err := s.ps.Call(cctx, name, b)
		if err != nil {
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			return "", infra(err)
		}
		s.mu.Lock()
		s.steps = append(s.steps, st)
		s.done = s.done || st.Done
		s.mu.Unlock()
		if st.Failed {
			return "", errors.New(st.Text)
		}
		return st.Text, nil
	}
}

// Responder implements Session: after each turn it gives the turn the sum
// of its steps' rewards (when any step had one) and ends the episode once
// the server said done.
func (s *serverSession) Responder() agentloop.Responder {
	return agentloop.ResponderFunc(func(context.Context, int, []openai.ChatCompletionMessage) (agentloop.Feedback, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var fb agentloop.Feedback
		var sum float64
		rewarded := false
		for _, st := range s.steps[s.turnSteps:] {
			if st.Reward != nil {
				sum += *st.Reward
				rewarded = true
			}
		}
		s.turnSteps = len(s.steps)
		if rewarded {
			fb.Reward = &sum
		}
		if s.done {
			fb.Done, fb.Detail = true, s.srv.spec.Protocol+" done"
		}
		return fb, nil
	})
}

// score scores the finished episode on the server.
func (s *serverSession) score(ctx context.Context, msgs []openai.ChatCompletionMessage) (rewards.Score, error) {
	s.mu.Lock()
	steps := append([]protocol.Step(nil), s.steps...)
	done := s.done
	s.mu.Unlock()
	sc, err := s.ps.Score(ctx, msgs, steps)
	if err != nil {
		return rewards.Score{}, infra(err)
	}
	comps := map[string]float64{"env_steps": float64(len(steps)), "env_done": 0}
	if done {
		comps["env_done"] = 1
	}
	for k, v := range sc.Components {
		comps[k] = v
	}
	return rewards.Score{Value: sc.Value, Components: comps}, nil
}

// Close implements Session: the episode ends on the server, then what was
// started for it stops.
func (s *serverSession) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		s.closeErr = s.ps.Close(cctx)
		s.stop()
	})
	return s.closeErr
}

// checkEnvServer refuses what an env_server block cannot go with.
func checkEnvServer(spec YAMLSpec, s *envServer) error {
	if s == nil {
		return nil
	}
	fail := func(what string) error {
		return fmt.Errorf("%w: env_server: %s", ErrConfig, what)
	}
	switch {
	case len(spec.Rewards) > 0:
		return fail("the env server scores the episode; remove rewards")
	case spec.Harness != nil:
		return fail("a harness brings its own tools; it cannot play an env server's episode")
	case spec.Responder != nil:
		return fail("the env server answers the episode; remove responder")
	case spec.Sandbox != nil:
		return fail("image runs the server as the rollout's sandbox; remove the sandbox block (a url server needs none)")
	case mcp.NeedsSandbox(spec.MCPServers) && s.spec.Image == "":
		return fail("a command MCP server runs in the sandbox, and a url env server has none")
	}
	return nil
}

// prompts reports whether the protocol's items carry their own messages.
func (s *envServer) prompts() bool {
	_, ok := s.proto.(protocol.Prompter)
	return ok
}

// messages are a task's opening messages: the rendered prompt, or the
// item's own when the env gives no prompt and the protocol's items carry
// messages (a NeMo Gym row).
func (s *envServer) messages(system, prompt, rendered string, it datasets.Item) ([]openai.ChatCompletionMessage, error) {
	p, ok := s.proto.(protocol.Prompter)
	if prompt != "" || !ok {
		return chat(system, rendered), nil
	}
	msgs, err := p.Messages(it.Data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s row %d: %v", datasets.ErrInvalid, it.Source, it.Row, err)
	}
	if system != "" {
		msgs = append([]openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleSystem, Content: system}}, msgs...)
	}
	return msgs, nil
}
