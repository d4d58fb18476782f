package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/doorkit"
)

// request is the part of a Messages request the door reads; polymorphic
// fields stay raw and are decoded by hand so that errors name the field.
type request struct {
	Model      string            `json:"model"`
	MaxTokens  *int              `json:"max_tokens"`
	Messages   []json.RawMessage `json:"messages"`
	System     json.RawMessage   `json:"system"`
	Tools      json.RawMessage   `json:"tools"`
	ToolChoice json.RawMessage   `json:"tool_choice"`
	Thinking   json.RawMessage   `json:"thinking"`
	Stream     bool              `json:"stream"`
}

// recorded are the fields kept in Call.Requested (never applied: the
// run's sampler governs generation).
var recorded = []string{
	"temperature", "top_p", "top_k", "stop_sequences", "thinking", "metadata",
	"service_tier", "output_config",
}

type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// block is one content block, every kind's fields side by side.
type block struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
	Thinking  string          `json:"thinking"`
	Signature string          `json:"signature"`
}

type tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

func bad(param, format string, args ...any) error {
	return gateway.Errorf(gateway.ErrBadRequest, param, format, args...)
}

// decode turns a Messages request body into a canonical Call. Every error
// wraps gateway.ErrBadRequest and names the field.
func decode(body []byte) (gateway.Call, error) {
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		return gateway.Call{}, bad("", "the request body is not a valid Messages request: %v", err)
	}
	call := gateway.Call{API: Name, Model: req.Model, Stream: req.Stream}
	if req.Model == "" {
		return call, bad("model", "model: Field required")
	}
	if req.MaxTokens == nil {
		return call, bad("max_tokens", "max_tokens: Field required")
	}
	if *req.MaxTokens < 1 {
		return call, bad("max_tokens", "max_tokens: must be greater than or equal to 1, got %d", *req.MaxTokens)
	}
	call.MaxTokens = *req.MaxTokens
	if len(req.Messages) == 0 {
		return call, bad("messages", "messages: at least one message is required")
	}
	var all map[string]json.RawMessage
	_ = json.Unmarshal(body, &all) // valid: the struct decode succeeded
	call.Requested = doorkit.Requested(all, recorded)
	if err := checkThinking(req.Thinking, *req.MaxTokens); err != nil {
		return call, err
	}
	if doorkit.IsSet(req.System) {
		sys, err := textOf(req.System, "system")
		if err != nil {
			return call, err
		}
		call.Messages = append(call.Messages, msg(openai.ChatMessageRoleSystem, sys))
	}
	for i, raw := range req.Messages {
		ms, err := decodeMessage(raw, fmt.Sprintf("messages.%d", i))
		if err != nil {
			return call, err
		}
		call.Messages = append(call.Messages, ms...)
	}
	if last := call.Messages[len(call.Messages)-1]; last.Role == openai.ChatMessageRoleAssistant {
		return call, bad(fmt.Sprintf("messages.%d", len(req.Messages)-1), "a final assistant message (prefill) is not supported: the gateway generates a new assistant turn from the rendered history")
	}
	var err error
	call.ToolsRaw = req.Tools
	if call.Tools, err = toolsCache.Get(req.Tools, decodeTools); err != nil {
		return call, err
	}
	if call.ToolChoice, call.ParallelToolCalls, err = decodeToolChoice(req.ToolChoice); err != nil {
		return call, err
	}
	return call, nil
}

func msg(role, content string) gateway.Message {
	return gateway.Message{ChatCompletionMessage: openai.ChatCompletionMessage{Role: role, Content: content}}
}

func checkThinking(raw json.RawMessage, maxTokens int) error {
	if !doorkit.IsSet(raw) {
		return nil
	}
	var t struct {
		Type         string `json:"type"`
		BudgetTokens *int   `json:"budget_tokens"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return bad("thinking", "thinking must be an object: %v", err)
	}
	switch t.Type {
	case "enabled":
		if t.BudgetTokens == nil {
			return bad("thinking.budget_tokens", "thinking.enabled.budget_tokens: Field required")
		}
		if *t.BudgetTokens >= maxTokens {
			return bad("thinking.budget_tokens", "`max_tokens` must be greater than `thinking.budget_tokens`")
		}
	case "disabled", "adaptive":
	default:
		return bad("thinking.type", "thinking type %q is not one of enabled, disabled, adaptive", t.Type)
	}
	return nil
}

// textOf reads a string or an array of text blocks (system, a
// tool_result's content), joined with "\n".
func textOf(raw json.RawMessage, param string) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []block
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", bad(param, "%s must be a string or an array of text blocks", param)
	}
	texts := make([]string, 0, len(blocks))
	for j, b := range blocks {
		if b.Type != "text" {
			return "", bad(fmt.Sprintf("%s.%d.type", param, j), "block type %q is not supported here (text only)", b.Type)
		}
		texts = append(texts, b.Text)
	}
	return strings.Join(texts, "\n"), nil
}

func decodeMessage(raw json.RawMessage, param string) ([]gateway.Message, error) {
	var m message
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, bad(param, "malformed message: %v", err)
	}
	if m.Role != "user" && m.Role != "assistant" {
		if m.Role == "system" {
			return nil, bad(param+".role", "role \"system\" is not a message role: use the top-level system parameter")
		}
		return nil, bad(param+".role", "unknown role %q (user or assistant)", m.Role)
	}
	if !doorkit.IsSet(m.Content) {
		return nil, bad(param+".content", "content: Field required")
	}
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return []gateway.Message{msg(m.Role, s)}, nil
	}
	var blocks []block
	if err := json.Unmarshal(m.Content, &blocks); err != nil {
		return nil, bad(param+".content", "content must be a string or an array of content blocks: %v", err)
	}
	if m.Role == "user" {
		return userBlocks(blocks, param+".content")
	}
	a, err := assistantBlocks(blocks, param+".content")
	if err != nil {
		return nil, err
	}
	return []gateway.Message{a}, nil
}

// userBlocks maps a user turn: each tool_result block becomes a tool
// message, in order; the text beside them a user message after them.
func userBlocks(blocks []block, param string) ([]gateway.Message, error) {
	var out []gateway.Message
	var texts []string
	for j, b := range blocks {
		p := fmt.Sprintf("%s.%d", param, j)
		switch b.Type {
		case "text":
			texts = append(texts, b.Text)
		case "tool_result":
			if b.ToolUseID == "" {
				return nil, bad(p+".tool_use_id", "tool_result.tool_use_id: Field required")
			}
			var content string
			if doorkit.IsSet(b.Content) {
				var err error
				if content, err = textOf(b.Content, p+".content"); err != nil {
					return nil, err
				}
			}
			out = append(out, gateway.Message{ChatCompletionMessage: openai.ChatCompletionMessage{Role: openai.ChatMessageRoleTool, ToolCallID: b.ToolUseID, Content: content}})
		case "tool_use", "thinking", "redacted_thinking":
			return nil, bad(p+".type", "a %s block belongs in an assistant message", b.Type)
		case "":
			return nil, bad(p+".type", "a content block needs a type")
		default:
			return nil, bad(p+".type", "content block type %q is not supported (text, tool_result)", b.Type)
		}
	}
	if len(texts) > 0 || len(out) == 0 {
		out = append(out, msg(openai.ChatMessageRoleUser, strings.Join(texts, "\n")))
	}
	return out, nil
}

// assistantBlocks maps an assistant turn to one canonical message:
// thinking → ReasoningContent (Ref from the signature the door issued),
// text → Content, tool_use → ToolCalls with compact JSON arguments.
func assistantBlocks(blocks []block, param string) (gateway.Message, error) {
	a := gateway.Message{ChatCompletionMessage: openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant}}
	var thinking, texts []string
	for j, b := range blocks {
		p := fmt.Sprintf("%s.%d", param, j)
		switch b.Type {
		case "text":
			texts = append(texts, b.Text)
		case "thinking":
			thinking = append(thinking, b.Thinking)
			if ref, ok := openSignature(b.Signature); ok && a.Ref == "" {
				a.Ref = ref
			}
		case "redacted_thinking":
			// Opaque reasoning of another provider's model: the gateway
			// never issues one and cannot render it; dropped.
		case "tool_use":
			if b.ID == "" {
				return a, bad(p+".id", "tool_use.id: Field required")
			}
			if b.Name == "" {
				return a, bad(p+".name", "tool_use.name: Field required")
			}
			args := "{}"
			if doorkit.IsSet(b.Input) {
				var obj map[string]json.RawMessage
				if err := json.Unmarshal(b.Input, &obj); err != nil {
					return a, bad(p+".input", "tool_use.input must be an object")
				}
				var buf bytes.Buffer
				if err := json.Compact(&buf, b.Input); err != nil {
					return a, bad(p+".input", "tool_use.input: %v", err)
				}
				args = buf.String()
			}
			a.ToolCalls = append(a.ToolCalls, openai.ToolCall{ID: b.ID, Type: openai.ToolTypeFunction, Function: openai.FunctionCall{Name: b.Name, Arguments: args}})
		case "tool_result":
			return a, bad(p+".type", "a tool_result block belongs in a user message")
		case "":
			return a, bad(p+".type", "a content block needs a type")
		default:
			return a, bad(p+".type", "content block type %q is not supported (text, thinking, redacted_thinking, tool_use)", b.Type)
		}
	}
	a.ReasoningContent = strings.Join(thinking, "\n")
	a.Content = strings.Join(texts, "\n")
	return a, nil
}

// toolsCache holds the tool lists harnesses send, decoded (read-only):
// each distinct list is decoded once (doorkit.DecodeCache).
var toolsCache doorkit.DecodeCache[[]openai.Tool]

// decodeTools is a request's tool list as the gateway's canonical tools.
func decodeTools(raw []byte) ([]openai.Tool, error) {
	if !doorkit.IsSet(raw) {
		return nil, nil
	}
	var tools []tool
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, bad("tools", "tools must be an array of tool definitions: %v", err)
	}
	out := make([]openai.Tool, 0, len(tools))
	for i, t := range tools {
		p := fmt.Sprintf("tools.%d", i)
		if t.Type != "" && t.Type != "custom" {
			return nil, bad(p+".type", "tool type %q is not supported: the gateway serves client tools (name, description, input_schema) only", t.Type)
		}
		if t.Name == "" {
			return nil, bad(p+".name", "tools.%d.name: Field required", i)
		}
		if !doorkit.IsSet(t.InputSchema) {
			return nil, bad(p+".input_schema", "tools.%d.input_schema: Field required", i)
		}
		out = append(out, openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{Name: t.Name, Description: t.Description, Parameters: t.InputSchema}})
	}
	return out, nil
}

func decodeToolChoice(raw json.RawMessage) (*gateway.ToolChoice, *bool, error) {
	if !doorkit.IsSet(raw) {
		return nil, nil, nil
	}
	var c struct {
		Type                   string `json:"type"`
		Name                   string `json:"name"`
		DisableParallelToolUse *bool  `json:"disable_parallel_tool_use"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, nil, bad("tool_choice", "tool_choice must be an object: %v", err)
	}
	var parallel *bool
	if c.DisableParallelToolUse != nil {
		p := !*c.DisableParallelToolUse
		parallel = &p
	}
	switch c.Type {
	case "auto", "none":
		return &gateway.ToolChoice{Mode: c.Type}, parallel, nil
	case "any":
		return &gateway.ToolChoice{Mode: "required"}, parallel, nil
	case "tool":
		if c.Name == "" {
			return nil, nil, bad("tool_choice.name", "tool_choice.tool.name: Field required")
		}
		return &gateway.ToolChoice{Mode: "function", Name: c.Name}, parallel, nil
	default:
		return nil, nil, bad("tool_choice.type", "tool_choice type %q is not one of auto, any, tool, none", c.Type)
	}
}
