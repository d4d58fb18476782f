// Package nemogym speaks the protocol of NeMo Gym resources servers
// (NVIDIA-NeMo/Gym, nemo_gym/base_resources_server.py at 07d6b0d): per
// rollout a POST /seed_session whose session cookie every later request
// carries, the row's declared tools (responses_create_params.tools; else
// the server's POST routes from its /openapi.json) called as POST /{tool}
// with the arguments as the JSON body, and POST /verify
// with the row and the episode as a Responses API response, whose reward
// (and reward_components) score the rollout. Items are NeMo Gym dataset
// rows; their responses_create_params.input is the prompt. It registers
// the protocol "nemo_gym" with envs/protocol.
package nemogym

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"sort"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/envs/protocol"
)

// Name is the protocol's name in env_server.protocol.
const Name = "nemo_gym"

// maxBody bounds one answer of the server.
const maxBody = 16 << 20

// reserved are the server's own routes, never tools.
var reserved = map[string]bool{"seed_session": true, "verify": true, "aggregate_metrics": true, "mcp": true, "reverify_mode": true}

func init() {
	protocol.Register(Name, func(node *yaml.Node) (protocol.Protocol, error) {
		if node != nil && !(node.Kind == yaml.MappingNode && len(node.Content) == 0) {
			return nil, fmt.Errorf("%w: nemo_gym has no options (its tools and prompt come from each row's responses_create_params)", protocol.ErrConfig)
		}
		return Protocol{}, nil
	})
}

// Protocol is NeMo Gym's resources-server protocol.
type Protocol struct{}

var (
	_ protocol.Protocol = Protocol{}
	_ protocol.Prompter = Protocol{}
)

// Name implements protocol.Protocol.
func (Protocol) Name() string { return Name }

// params is a row's responses_create_params, the part rollout reads.
type params struct {
	Input json.RawMessage `json:"input"`
	Tools []struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"tools"`
}

func rowParams(data map[string]any) (params, error) {
	var p params
	raw, ok := data["responses_create_params"]
	if !ok {
		return p, errors.New("not a NeMo Gym row: no responses_create_params")
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return p, fmt.Errorf("responses_create_params: %w", err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("responses_create_params: %w", err)
	}
	return p, nil
}

// Messages implements protocol.Prompter: the row's input, a string or
// a list of messages (content a string or input_text parts).
func (Protocol) Messages(data map[string]any) ([]openai.ChatCompletionMessage, error) {
	p, err := rowParams(data)
	if err != nil {
		return nil, err
	}
	var s string
	if json.Unmarshal(p.Input, &s) == nil {
		return []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: s}}, nil
	}
	var items []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(p.Input, &items); err != nil || len(items) == 0 {
		return nil, fmt.Errorf("responses_create_params.input: want a string or a list of messages")
	}
	var out []openai.ChatCompletionMessage
	for i, m := range items {
		role := m.Role
		if role == "developer" {
			role = openai.ChatMessageRoleSystem
		}
		if role != openai.ChatMessageRoleUser && role != openai.ChatMessageRoleSystem && role != openai.ChatMessageRoleAssistant {
			return nil, fmt.Errorf("responses_create_params.input[%d]: role %q is not user, system, developer or assistant", i, m.Role)
		}
		var text string
		if json.Unmarshal(m.Content, &text) != nil {
			var parts []struct {
				Type, Text string
			}
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				return nil, fmt.Errorf("responses_create_params.input[%d].content: want a string or text parts", i)
			}
			var b strings.Builder
			for _, pt := range parts {
				if pt.Type != "input_text" && pt.Type != "output_text" && pt.Type != "text" {
					return nil, fmt.Errorf("responses_create_params.input[%d].content: part type %q is not text", i, pt.Type)
				}
				b.WriteString(pt.Text)
			}
			text = b.String()
		}
		out = append(out, openai.ChatCompletionMessage{Role: role, Content: text})
	}
	return out, nil
}

// Open implements protocol.Protocol: POST /seed_session with the row,
// keeping the session cookie it sets.
func (Protocol) Open(ctx context.Context, ep protocol.Endpoint, it protocol.Item) (protocol.Session, error) {
	p, err := rowParams(it.Data)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", protocol.ErrConfig, err)
	}
	jar, err := cookiejar.New(nil)
	if err != nil {
		return nil, err
	}
	base, err := url.Parse(ep.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("%w: base URL %q: %v", protocol.ErrConfig, ep.BaseURL, err)
	}
	c := *ep.Client
	c.Jar = jar
	s := &session{ep: ep, client: &c, base: base, row: it.Data, id: it.RolloutID}
	for _, t := range p.Tools {
		if t.Type != "" && t.Type != "function" {
			continue
		}
		if t.Name == "" || reserved[t.Name] || strings.ContainsAny(t.Name, "/?# ") {
			return nil, fmt.Errorf("%w: responses_create_params.tools: %q is not a tool route name", protocol.ErrConfig, t.Name)
		}
		params := t.Parameters
		if len(params) == 0 || string(params) == "null" {
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		s.tools = append(s.tools, protocol.Tool{Name: t.Name, Description: t.Description, Parameters: params})
	}
	if _, declared := rowTools(it.Data); !declared {
		// A row without tools: the server's own declaration of its
		// routes (FastAPI's /openapi.json) names them.
		if s.tools, err = s.openAPITools(ctx); err != nil {
			return nil, err
		}
	}
	status, body, err := s.post(ctx, "seed_session", it.Data)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, httpError(ep, "seed_session", status, body)
	}
	if len(jar.Cookies(base)) == 0 {
		return nil, protocol.Violationf(ep, "POST /seed_session set no session cookie")
	}
	return s, nil
}

// httpError classifies a non-200 answer: a server error (5xx) means the
// server is failing; anything else that it does not speak the protocol
// rollout does (a 404 for a route it must have, a 422 for a body its
// model refused).
func httpError(ep protocol.Endpoint, route string, status int, body []byte) error {
	if status >= 500 {
		return protocol.Unreachablef(ep, "POST /%s: HTTP %d: %s", route, status, clip(body))
	}
	return protocol.Violationf(ep, "POST /%s: HTTP %d: %s", route, status, clip(body))
}

type session struct {
	ep     protocol.Endpoint
	client *http.Client
	base   *url.URL
	row    map[string]any
	id     string
	tools  []protocol.Tool
}

var _ protocol.Session = (*session)(nil)

func (s *session) Opening() string        { return "" }
func (s *session) Tools() []protocol.Tool { return s.tools }

// post sends body as JSON to /route and returns the answer.
func (s *session) post(ctx context.Context, route string, body any) (int, []byte, error) {
	b, ok := body.([]byte)
	if !ok {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return 0, nil, fmt.Errorf("encode /%s body: %w", route, err)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.ep.BaseURL+"/"+route, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, fmt.Errorf("%s: POST /%s: %w", s.ep.Name, route, ctx.Err())
		}
		return 0, nil, protocol.Unreachablef(s.ep, "POST /%s: %v", route, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return 0, nil, protocol.Unreachablef(s.ep, "POST /%s: read answer: %v", route, err)
	}
	return resp.StatusCode, out, nil
}

// Call implements protocol.Session: POST /{tool} with the arguments. A
// 4xx answer (arguments the route's model refused, an unknown route) is
// the model's error, shown to it; a 5xx the server failing.
func (s *session) Call(ctx context.Context, name string, args json.RawMessage) (protocol.Step, error) {
	status, body, err := s.post(ctx, name, []byte(args))
	if err != nil {
		return protocol.Step{}, err
	}
	switch {
	case status == http.StatusOK:
		return protocol.Step{Text: string(body)}, nil
	case status >= 400 && status < 500:
		return protocol.Step{Text: fmt.Sprintf("HTTP %d: %s", status, clip(body)), Failed: true}, nil
	}
	return protocol.Step{}, httpError(s.ep, name, status, body)
}

// Score implements protocol.Session: POST /verify with the row and the
// episode as a response; its reward is the rollout's, its
// reward_components and other numeric fields the components.
func (s *session) Score(ctx context.Context, msgs []openai.ChatCompletionMessage, _ []protocol.Step) (protocol.Score, error) {
	body := make(map[string]any, len(s.row)+1)
	for k, v := range s.row {
		body[k] = v
	}
	body["response"] = response(s.id, msgs, s.row)
	status, out, err := s.post(ctx, "verify", body)
	if err != nil {
		return protocol.Score{}, err
	}
	if status != http.StatusOK {
		return protocol.Score{}, httpError(s.ep, "verify", status, out)
	}
	var v map[string]any
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return protocol.Score{}, protocol.Violationf(s.ep, "POST /verify: answer is not a JSON object: %v: %s", err, clip(out))
	}
	reward, ok := number(v["reward"])
	if !ok {
		return protocol.Score{}, protocol.Violationf(s.ep, "POST /verify: no finite numeric reward in %s", clip(out))
	}
	comps := map[string]float64{}
	if rc, ok := v["reward_components"].(map[string]any); ok {
		for k, x := range rc {
			if f, ok := number(x); ok {
				comps[k] = f
			}
		}
	}
	for k, x := range v {
		if _, inRow := s.row[k]; inRow || k == "reward" || k == "response" {
			continue
		}
		if f, ok := number(x); ok {
			comps[k] = f
		}
	}
	return protocol.Score{Value: reward, Components: comps}, nil
}

func number(x any) (float64, bool) {
	n, ok := x.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// response is the episode as a Responses API response object: the
// assistant's messages and calls and the tools' outputs after the
// prompt, in order.
func response(id string, msgs []openai.ChatCompletionMessage, row map[string]any) map[string]any {
	var output []map[string]any
	prompt := true
	for i, m := range msgs {
		if prompt && m.Role != openai.ChatMessageRoleAssistant {
			continue // the prompt is the request's input, not the output
		}
		prompt = false
		switch m.Role {
		case openai.ChatMessageRoleAssistant:
			if m.Content != "" {
				output = append(output, map[string]any{"type": "message", "id": fmt.Sprintf("msg_%d", i), "role": "assistant", "status": "completed",
					"content": []map[string]any{{"type": "output_text", "text": m.Content, "annotations": []any{}}}})
			}
			for _, tc := range m.ToolCalls {
				output = append(output, map[string]any{"type": "function_call", "id": "fc_" + tc.ID, "call_id": tc.ID,
					"name": tc.Function.Name, "arguments": tc.Function.Arguments, "status": "completed"})
			}
		case openai.ChatMessageRoleTool:
			output = append(output, map[string]any{"type": "function_call_output", "call_id": m.ToolCallID, "output": m.Content})
		default:
			output = append(output, map[string]any{"type": "message", "role": m.Role,
				"content": []map[string]any{{"type": "input_text", "text": m.Content}}})
		}
	}
	if output == nil {
		output = []map[string]any{}
	}
	tools := []any{}
	if p, ok := row["responses_create_params"].(map[string]any); ok {
		if t, ok := p["tools"].([]any); ok {
			tools = t
		}
	}
	return map[string]any{"id": "resp_" + id, "object": "response", "created_at": float64(time.Now().Unix()), "model": "rollout",
		"output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": tools}
}

// rowTools reports whether the row declares its tools
// (responses_create_params.tools, even an empty list).
func rowTools(data map[string]any) ([]any, bool) {
	p, _ := data["responses_create_params"].(map[string]any)
	t, ok := p["tools"].([]any)
	return t, ok
}

// openAPITools reads the server's tool routes from GET /openapi.json:
// every POST route but the server's own (/seed_session, /verify, …), its
// JSON request body's schema (component references inlined) as the
// parameters, its summary or description as the description.
func (s *session) openAPITools(ctx context.Context) ([]protocol.Tool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.ep.BaseURL+"/openapi.json", nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, protocol.Unreachablef(s.ep, "GET /openapi.json: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, protocol.Unreachablef(s.ep, "GET /openapi.json: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, protocol.Violationf(s.ep, "the row declares no tools and GET /openapi.json answers HTTP %d: %s", resp.StatusCode, clip(body))
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Summary     string `json:"summary"`
			Description string `json:"description"`
			RequestBody struct {
				Content map[string]struct {
					Schema map[string]any `json:"schema"`
				} `json:"content"`
			} `json:"requestBody"`
		} `json:"paths"`
		Components struct {
			Schemas map[string]any `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, protocol.Violationf(s.ep, "GET /openapi.json: %v", err)
	}
	var out []protocol.Tool
	for path, ops := range doc.Paths {
		op, ok := ops["post"]
		name := strings.TrimPrefix(path, "/")
		if !ok || name == "" || reserved[name] || strings.ContainsAny(name, "/{} ") {
			continue
		}
		schema := map[string]any{"type": "object", "properties": map[string]any{}}
		if c, ok := op.RequestBody.Content["application/json"]; ok && c.Schema != nil {
			r, err := inline(c.Schema, doc.Components.Schemas, 0)
			if err != nil {
				return nil, protocol.Violationf(s.ep, "GET /openapi.json: POST %s: %v", path, err)
			}
			schema, _ = r.(map[string]any)
		}
		b, err := json.Marshal(schema)
		if err != nil {
			return nil, err
		}
		desc := op.Description
		if desc == "" {
			desc = op.Summary
		}
		out = append(out, protocol.Tool{Name: name, Description: desc, Parameters: b})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// inline replaces "#/components/schemas/X" references by the component
// (bounded depth: a recursive model is refused, not looped on).
func inline(v any, comps map[string]any, depth int) (any, error) {
	if depth > 16 {
		return nil, errors.New("schema references nest deeper than 16 (a recursive model?)")
	}
	switch x := v.(type) {
	case map[string]any:
		if ref, ok := x["$ref"].(string); ok {
			name, found := strings.CutPrefix(ref, "#/components/schemas/")
			c, known := comps[name]
			if !found || !known {
				return nil, fmt.Errorf("unresolvable reference %q", ref)
			}
			return inline(c, comps, depth+1)
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			r, err := inline(e, comps, depth+1)
			if err != nil {
				return nil, err
			}
			out[k] = r
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			r, err := inline(e, comps, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	}
	return v, nil
}

// Close implements protocol.Session. A resources server keeps no
// per-session state rollout could release (no close route); the
// connections go.
func (s *session) Close(context.Context) error {
	s.client.CloseIdleConnections()
	return nil
}

func clip(b []byte) string {
	if len(b) > 500 {
		return string(b[:500]) + "…"
	}
	return string(b)
}
