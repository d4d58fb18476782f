// Package openenv speaks OpenEnv's wire protocol (huggingface/OpenEnv,
// RFCs 002/003/005, as its reference servers answer at 385de5e): one
// WebSocket /ws connection per rollout, reset with the item's seed and
// reset arguments, the env's MCP tools (list_tools / call_tool actions)
// or its action schema (/schema) as the agent's tools, each step's
// observation as the tool result, its reward and done. It registers the
// protocol "openenv" with envs/protocol.
package openenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/coder/websocket"
	openai "github.com/sashabaranov/go-openai"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/envs/protocol"
)

// Name is the protocol's name in env_server.protocol.
const Name = "openenv"

// Tool modes.
const (
	ToolsMCP    = "mcp"    // the env's MCP tools, through list_tools / call_tool actions
	ToolsAction = "action" // one tool whose arguments are the env's action (its /schema)
)

// Reward modes: how step rewards make the episode's.
const (
	RewardSum  = "sum"
	RewardLast = "last"
)

// maxMessage bounds one WebSocket message from the server.
const maxMessage = 16 << 20

// Options are the protocol's keys (env_server.options).
type Options struct {
	Tools string `yaml:"tools"` // mcp (default) | action
	// ActionTool names the action tool (action mode; default "step") and
	// ActionDescription describes it to the model.
	ActionTool        string `yaml:"action_tool"`
	ActionDescription string `yaml:"action_description"`
	Reward            string `yaml:"reward"` // sum (default) | last
	// SeedField and ResetField name the item's fields holding reset's seed
	// (an integer) and further reset arguments (an object); defaults
	// "seed" and "reset". Either may be missing from an item.
	SeedField  string `yaml:"seed_field"`
	ResetField string `yaml:"reset_field"`
	// ShowReset shows the reset observation to the model after the task's
	// prompt (default true).
	ShowReset *bool `yaml:"show_reset"`
}

func init() {
	protocol.Register(Name, func(node *yaml.Node) (protocol.Protocol, error) {
		o := Options{Tools: ToolsMCP, ActionTool: "step", Reward: RewardSum, SeedField: "seed", ResetField: "reset"}
		if node != nil {
			if err := decodeStrict(node, &o); err != nil {
				return nil, err
			}
		}
		switch {
		case o.Tools != ToolsMCP && o.Tools != ToolsAction:
			return nil, fmt.Errorf("%w: options.tools %q is not one of %s, %s", protocol.ErrConfig, o.Tools, ToolsMCP, ToolsAction)
		case o.Reward != RewardSum && o.Reward != RewardLast:
			return nil, fmt.Errorf("%w: options.reward %q is not one of %s, %s", protocol.ErrConfig, o.Reward, RewardSum, RewardLast)
		case o.ActionTool == "" || strings.ContainsAny(o.ActionTool, " \t\n"):
			return nil, fmt.Errorf("%w: options.action_tool %q is not a tool name", protocol.ErrConfig, o.ActionTool)
		}
		return &Protocol{opts: o}, nil
	})
}

// decodeStrict decodes node into out, refusing unknown keys.
func decodeStrict(node *yaml.Node, out any) error {
	b, err := yaml.Marshal(node)
	if err != nil {
		return fmt.Errorf("%w: options: %v", protocol.ErrConfig, err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: options: %v", protocol.ErrConfig, err)
	}
	return nil
}

// Protocol is OpenEnv's protocol.
type Protocol struct{ opts Options }

var _ protocol.Protocol = (*Protocol)(nil)

// Name implements protocol.Protocol.
func (p *Protocol) Name() string { return Name }

// Open implements protocol.Protocol: it connects /ws, resets the env and
// lists its tools.
func (p *Protocol) Open(ctx context.Context, ep protocol.Endpoint, it protocol.Item) (protocol.Session, error) {
	reset, err := p.resetData(it)
	if err != nil {
		return nil, err
	}
	var actionSchema json.RawMessage
	if p.opts.Tools == ToolsAction {
		if actionSchema, err = fetchActionSchema(ctx, ep); err != nil {
			return nil, err
		}
	}
	wsURL := "ws" + strings.TrimPrefix(ep.BaseURL, "http") + "/ws"
	conn, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: ep.Client})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, protocol.Violationf(ep, "GET /ws: %s, not a WebSocket upgrade", resp.Status)
		}
		return nil, protocol.Unreachablef(ep, "connect /ws: %v", err)
	}
	conn.SetReadLimit(maxMessage)
	s := &session{p: p, ep: ep, conn: conn}
	obs, err := s.exchange(ctx, map[string]any{"type": "reset", "data": reset})
	if err == nil && obs.failed {
		err = protocol.Violationf(ep, "reset refused: %s", obs.text)
	}
	if err != nil {
		_ = s.Close(ctx)
		return nil, err
	}
	if p.opts.ShowReset == nil || *p.opts.ShowReset {
		s.opening = obs.text
	}
	if p.opts.Tools == ToolsAction {
		s.tools = []protocol.Tool{{Name: p.opts.ActionTool, Description: p.actionDescription(), Parameters: actionSchema}}
		return s, nil
	}
	if s.tools, err = s.listTools(ctx); err != nil {
		_ = s.Close(ctx)
		return nil, err
	}
	return s, nil
}

func (p *Protocol) actionDescription() string {
	if p.opts.ActionDescription != "" {
		return p.opts.ActionDescription
	}
	return "Take one action in the environment; the result is its observation."
}

// resetData is reset's data: the item's reset arguments, its seed and the
// rollout's id as the episode id.
func (p *Protocol) resetData(it protocol.Item) (map[string]any, error) {
	data := map[string]any{}
	if v, ok := it.Data[p.opts.ResetField]; ok && v != nil {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%w: item field %s: reset arguments must be an object, got %T", protocol.ErrConfig, p.opts.ResetField, v)
		}
		for k, x := range m {
			data[k] = x
		}
	}
	if v, ok := it.Data[p.opts.SeedField]; ok && v != nil {
		switch n := v.(type) {
		case int64, int, json.Number:
			data["seed"] = n
		case float64:
			if n != float64(int64(n)) || n < 0 {
				return nil, fmt.Errorf("%w: item field %s: seed %v is not a non-negative integer", protocol.ErrConfig, p.opts.SeedField, n)
			}
			data["seed"] = int64(n)
		default:
			return nil, fmt.Errorf("%w: item field %s: seed must be an integer, got %T", protocol.ErrConfig, p.opts.SeedField, v)
		}
	}
	if it.RolloutID != "" {
		data["episode_id"] = it.RolloutID
	}
	return data, nil
}

// fetchActionSchema reads the action's JSON Schema from GET /schema and
// drops its metadata field (OpenEnv's bookkeeping, not the model's).
func fetchActionSchema(ctx context.Context, ep protocol.Endpoint) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.BaseURL+"/schema", nil)
	if err != nil {
		return nil, err
	}
	resp, err := ep.Client.Do(req)
	if err != nil {
		return nil, protocol.Unreachablef(ep, "GET /schema: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMessage))
	if err != nil {
		return nil, protocol.Unreachablef(ep, "GET /schema: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, protocol.Violationf(ep, "GET /schema: %s: %s", resp.Status, clip(string(body)))
	}
	var sch struct {
		Action map[string]any `json:"action"`
	}
	if err := json.Unmarshal(body, &sch); err != nil || sch.Action == nil {
		return nil, protocol.Violationf(ep, "GET /schema: no action schema in %s", clip(string(body)))
	}
	if props, ok := sch.Action["properties"].(map[string]any); ok {
		delete(props, "metadata")
	}
	if sch.Action["type"] == nil {
		sch.Action["type"] = "object"
	}
	b, err := json.Marshal(sch.Action)
	return b, err
}

// session is one /ws connection: one environment, one episode.
type session struct {
	p       *Protocol
	ep      protocol.Endpoint
	opening string
	tools   []protocol.Tool

	mu     sync.Mutex // one exchange at a time: the protocol has no ids
	conn   *websocket.Conn
	broken error
	closed bool
}

var _ protocol.Session = (*session)(nil)

func (s *session) Opening() string        { return s.opening }
func (s *session) Tools() []protocol.Tool { return s.tools }

// observation is one answer of the server, reduced to what rollout uses.
type observation struct {
	text   string
	obs    map[string]any
	reward *float64
	done   bool
	failed bool // an error the model caused (its action did not validate, or raised)
}

// exchange sends one message and reads its one reply.
func (s *session) exchange(ctx context.Context, msg map[string]any) (observation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		return observation{}, s.broken
	}
	if s.closed {
		return observation{}, protocol.Unreachablef(s.ep, "session closed")
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return observation{}, fmt.Errorf("encode %v message: %w", msg["type"], err)
	}
	fail := func(err error) (observation, error) {
		s.broken = err
		s.conn.CloseNow()
		return observation{}, err
	}
	if err := s.conn.Write(ctx, websocket.MessageText, b); err != nil {
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		return fail(protocol.Unreachablef(s.ep, "send %v: %v", msg["type"], err))
	}
	typ, reply, err := s.conn.Read(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return fail(fmt.Errorf("%s: no answer to %v: %w", s.ep.Name, msg["type"], ctx.Err()))
		}
		return fail(protocol.Unreachablef(s.ep, "no answer to %v: %v", msg["type"], err))
	}
	if typ != websocket.MessageText {
		return fail(protocol.Violationf(s.ep, "binary message in answer to %v", msg["type"]))
	}
	obs, err := parseReply(s.ep, reply)
	if err != nil {
		return fail(err)
	}
	return obs, nil
}

// parseReply reads one server message: an observation, or an error the
// protocol defines.
func parseReply(ep protocol.Endpoint, b []byte) (observation, error) {
	var m struct {
		Type string          `json:"type"`
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return observation{}, protocol.Violationf(ep, "answer is not JSON: %v: %s", err, clip(string(b)))
	}
	switch m.Type {
	case "observation":
		var d struct {
			Observation map[string]any `json:"observation"`
			Reward      *float64       `json:"reward"`
			Done        *bool          `json:"done"`
		}
		if err := json.Unmarshal(m.Data, &d); err != nil || d.Observation == nil || d.Done == nil {
			return observation{}, protocol.Violationf(ep, "observation without observation/done: %s", clip(string(m.Data)))
		}
		return observation{text: render(d.Observation), obs: d.Observation, reward: d.Reward, done: *d.Done}, nil
	case "error":
		var d struct {
			Message string          `json:"message"`
			Code    string          `json:"code"`
			Errors  json.RawMessage `json:"errors"`
		}
		if err := json.Unmarshal(m.Data, &d); err != nil {
			return observation{}, protocol.Violationf(ep, "error message without data: %s", clip(string(b)))
		}
		switch d.Code {
		case "VALIDATION_ERROR", "EXECUTION_ERROR":
			// The action did not fit the env's schema, or the env raised
			// on it: the model's doing, shown to it; the session stays.
			text := d.Message
			if len(d.Errors) > 0 && string(d.Errors) != "null" {
				text += ": " + clip(string(d.Errors))
			}
			return observation{text: text, failed: true}, nil
		case "CAPACITY_REACHED":
			return observation{}, protocol.Unreachablef(ep, "at capacity (CAPACITY_REACHED): %s", d.Message)
		case "FACTORY_ERROR", "SESSION_ERROR":
			return observation{}, protocol.Unreachablef(ep, "%s: %s", d.Code, d.Message)
		default:
			return observation{}, protocol.Violationf(ep, "error %s: %s", d.Code, d.Message)
		}
	}
	return observation{}, protocol.Violationf(ep, "unexpected message type %q: %s", m.Type, clip(string(b)))
}

// listTools asks the env for its MCP tools (a list_tools action).
func (s *session) listTools(ctx context.Context) ([]protocol.Tool, error) {
	obs, err := s.exchange(ctx, map[string]any{"type": "step", "data": map[string]any{"type": "list_tools"}})
	if err != nil {
		return nil, err
	}
	if obs.failed {
		return nil, protocol.Violationf(s.ep, "list_tools refused (not an MCP env? set options.tools: action): %s", obs.text)
	}
	raw, ok := obs.obs["tools"].([]any)
	if !ok {
		return nil, protocol.Violationf(s.ep, "list_tools observation has no tools list: %s", clip(obs.text))
	}
	var out []protocol.Tool
	for i, x := range raw {
		t, _ := x.(map[string]any)
		name, _ := t["name"].(string)
		if name == "" {
			return nil, protocol.Violationf(s.ep, "list_tools: tool %d has no name", i)
		}
		desc, _ := t["description"].(string)
		schema := t["input_schema"]
		if schema == nil {
			schema = t["inputSchema"]
		}
		if schema == nil {
			schema = map[string]any{"type": "object", "properties": map[string]any{}}
		}
		b, err := json.Marshal(schema)
		if err != nil {
			return nil, protocol.Violationf(s.ep, "list_tools: tool %s: schema: %v", name, err)
		}
		out = append(out, protocol.Tool{Name: name, Description: desc, Parameters: b})
	}
	return out, nil
}

// Call implements protocol.Session: one step.
func (s *session) Call(ctx context.Context, name string, args json.RawMessage) (protocol.Step, error) {
	var a map[string]any
	if err := json.Unmarshal(args, &a); err != nil {
		return protocol.Step{}, fmt.Errorf("arguments of %s: %w", name, err)
	}
	data := a
	if s.p.opts.Tools == ToolsMCP {
		data = map[string]any{"type": "call_tool", "tool_name": name, "arguments": a}
	} else if name != s.p.opts.ActionTool {
		return protocol.Step{Text: fmt.Sprintf("unknown tool %s", name), Failed: true}, nil
	}
	obs, err := s.exchange(ctx, map[string]any{"type": "step", "data": data})
	if err != nil {
		return protocol.Step{}, err
	}
	st := protocol.Step{Text: obs.text, Failed: obs.failed, Reward: obs.reward, Done: obs.done}
	if s.p.opts.Tools == ToolsMCP && !obs.failed {
		st.Text, st.Failed = toolResult(obs.obs)
	}
	return st, nil
}

// toolResult reads a CallToolObservation: its error, else its result (an
// MCP result's text contents, a string, or JSON).
func toolResult(obs map[string]any) (string, bool) {
	if e, ok := obs["error"].(map[string]any); ok {
		msg, _ := e["message"].(string)
		kind, _ := e["error_type"].(string)
		return strings.TrimSpace(kind + ": " + msg), true
	}
	res := obs["result"]
	switch r := res.(type) {
	case string:
		return r, false
	case map[string]any:
		isErr, _ := r["is_error"].(bool)
		if v, ok := r["isError"].(bool); ok {
			isErr = v
		}
		if content, ok := r["content"].([]any); ok {
			var parts []string
			for _, c := range content {
				if cm, ok := c.(map[string]any); ok {
					if txt, ok := cm["text"].(string); ok {
						parts = append(parts, txt)
					}
				}
			}
			if len(parts) > 0 {
				return strings.Join(parts, "\n"), isErr
			}
		}
		if sc, ok := r["structured_content"]; ok && sc != nil {
			return render(sc), isErr
		}
		if d, ok := r["data"]; ok && d != nil {
			return render(d), isErr
		}
	}
	return render(res), false
}

// render is an observation as the model reads it: a string, or an
// object whose one field is a string, as that text; anything else as JSON.
func render(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		for _, x := range m {
			if s, ok := x.(string); ok {
				return s
			}
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// Score implements protocol.Session: the steps' rewards, summed or the
// last one (options.reward), with the per-step rewards as components.
func (s *session) Score(_ context.Context, _ []openai.ChatCompletionMessage, steps []protocol.Step) (protocol.Score, error) {
	var sum, last float64
	n := 0
	for _, st := range steps {
		if st.Reward != nil {
			sum += *st.Reward
			last = *st.Reward
			n++
		}
	}
	comps := map[string]float64{"env_reward_sum": sum, "env_reward_last": last, "env_rewarded_steps": float64(n)}
	v := sum
	if s.p.opts.Reward == RewardLast {
		v = last
	}
	return protocol.Score{Value: v, Components: comps}, nil
}

// Close implements protocol.Session: a close message, then the
// connection's close (the server destroys the env on disconnect).
func (s *session) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.broken != nil {
		return nil
	}
	if err := s.conn.Write(ctx, websocket.MessageText, []byte(`{"type":"close"}`)); err != nil {
		s.conn.CloseNow()
		return nil
	}
	// The server answers close by closing the connection (1000).
	_ = s.conn.Close(websocket.StatusNormalClosure, "episode over")
	return nil
}

func clip(s string) string {
	if len(s) > 500 {
		return s[:500] + "…"
	}
	return s
}
