package responses

import (
	"encoding/json"
	"fmt"
	"strings"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/doorkit"
)

// request is the part of a Responses create request the door reads. The
// polymorphic fields stay raw and are decoded by hand, so that a wrong
// shape gets an error naming the field.
type request struct {
	// fields are the request's top-level fields as sent (for the echo of
	// the response object and the recorded sampler fields).
	fields map[string]json.RawMessage

	Model              string          `json:"model"`
	Instructions       json.RawMessage `json:"instructions"`
	Input              json.RawMessage `json:"input"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	PreviousResponseID string          `json:"previous_response_id"`
	Include            []string        `json:"include"`
	Background         bool            `json:"background"`
	Text               *struct {
		Format *struct {
			Type string `json:"type"`
		} `json:"format"`
	} `json:"text"`
}

// recorded are the request fields kept in Call.Requested: what the
// harness asked of the sampler (never applied) and of the API.
var recorded = []string{
	"temperature", "top_p", "top_logprobs", "reasoning", "text", "truncation",
	"max_tool_calls", "service_tier", "store", "include", "prompt_cache_key",
	"safety_identifier", "user", "metadata", "seed", "frequency_penalty",
	"presence_penalty", "stop",
}

// item is one input item, every kind's fields side by side.
type item struct {
	Type             string          `json:"type"`
	ID               string          `json:"id"`
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	CallID           string          `json:"call_id"`
	Name             string          `json:"name"`
	Arguments        json.RawMessage `json:"arguments"`
	Output           json.RawMessage `json:"output"`
	Summary          json.RawMessage `json:"summary"`
	EncryptedContent *string         `json:"encrypted_content"`
}

// part is one content part of a message item, of a reasoning item's
// summary or content, or of a function_call_output's output.
type part struct {
	Type    string `json:"type"`
	Text    string `json:"text"`
	Refusal string `json:"refusal"`
}

type tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
	Function    json.RawMessage `json:"function"`
}

func bad(param, format string, args ...any) error {
	return gateway.Errorf(gateway.ErrBadRequest, param, format, args...)
}

// decode turns a Responses create request body into a canonical Call.
// Every error wraps gateway.ErrBadRequest and names the field.
func decode(body []byte) (gateway.Call, request, error) {
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		return gateway.Call{}, req, bad("", "the request body is not a valid Responses request: %v", err)
	}
	_ = json.Unmarshal(body, &req.fields) // valid: the struct decode above succeeded
	call := gateway.Call{
		API:               Name,
		Model:             req.Model,
		ParallelToolCalls: req.ParallelToolCalls,
		Stream:            req.Stream,
		Previous:          previousID(req.PreviousResponseID),
	}
	if req.Model == "" {
		return call, req, bad("model", "model is required")
	}
	if req.Background {
		return call, req, bad("background", "background responses are not supported: the gateway answers each request on its connection")
	}
	if req.Text != nil && req.Text.Format != nil && req.Text.Format.Type != "" && req.Text.Format.Type != "text" {
		return call, req, bad("text.format.type", "text format %q is not supported: the gateway does not constrain generation (only \"text\")", req.Text.Format.Type)
	}
	if req.MaxOutputTokens != nil {
		if *req.MaxOutputTokens < 1 {
			return call, req, bad("max_output_tokens", "max_output_tokens must be at least 1, got %d", *req.MaxOutputTokens)
		}
		call.MaxTokens = *req.MaxOutputTokens
	}
	call.Requested = doorkit.Requested(req.fields, recorded)
	if doorkit.IsSet(req.Instructions) {
		var s string
		if err := json.Unmarshal(req.Instructions, &s); err != nil {
			return call, req, bad("instructions", "instructions must be a string")
		}
		if s != "" {
			call.Messages = append(call.Messages, gateway.Message{ChatCompletionMessage: openai.ChatCompletionMessage{Role: openai.ChatMessageRoleSystem, Content: s}})
		}
	}
	msgs, err := decodeInput(req.Input)
	if err != nil {
		return call, req, err
	}
	call.Messages = append(call.Messages, msgs...)
	if len(call.Messages) == 0 && call.Previous == "" {
		return call, req, bad("input", "input is required")
	}
	call.ToolsRaw = req.Tools
	if call.Tools, err = toolsCache.Get(req.Tools, decodeTools); err != nil {
		return call, req, err
	}
	if call.ToolChoice, err = decodeToolChoice(req.ToolChoice); err != nil {
		return call, req, err
	}
	return call, req, nil
}

// previousID turns a response id the door issued back into the Reply.ID
// the Completer knows; another id passes unchanged (the Completer refuses
// it as unknown).
func previousID(id string) string {
	if r, ok := strings.CutPrefix(id, respPrefix); ok && r != "" {
		return r
	}
	return id
}

// assistant accumulates consecutive assistant-side items (reasoning,
// an assistant message, function calls) into one canonical message.
type assistant struct {
	msg                             gateway.Message
	hasReasoning, hasText, hasTools bool
}

func decodeInput(raw json.RawMessage) ([]gateway.Message, error) {
	if !doorkit.IsSet(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []gateway.Message{{ChatCompletionMessage: openai.ChatCompletionMessage{Role: openai.ChatMessageRoleUser, Content: s}}}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, bad("input", "input must be a string or an array of items")
	}
	var out []gateway.Message
	var cur *assistant
	flush := func() {
		if cur != nil {
			out = append(out, cur.msg)
			cur = nil
		}
	}
	// join reports whether an assistant-side item with ref may join the
	// pending assistant message: not when it belongs to another reply.
	join := func(ref string) bool {
		return cur != nil && (ref == "" || cur.msg.Ref == "" || cur.msg.Ref == ref)
	}
	start := func(ref string) {
		if cur == nil {
			cur = &assistant{msg: gateway.Message{ChatCompletionMessage: openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant}}}
		}
		if cur.msg.Ref == "" {
			cur.msg.Ref = ref
		}
	}
	for i, rawItem := range items {
		param := fmt.Sprintf("input[%d]", i)
		var it item
		if err := json.Unmarshal(rawItem, &it); err != nil {
			return nil, bad(param, "malformed input item: %v", err)
		}
		typ := it.Type
		if typ == "" && it.Role != "" {
			typ = "message"
		}
		switch typ {
		case "message":
			text, err := messageText(it.Content, param+".content")
			if err != nil {
				return nil, err
			}
			switch it.Role {
			case "user", "system", "developer":
				flush()
				role := it.Role
				if role == "developer" {
					role = openai.ChatMessageRoleSystem
				}
				out = append(out, gateway.Message{ChatCompletionMessage: openai.ChatCompletionMessage{Role: role, Content: text}})
			case "assistant":
				ref := refFromID(it.ID, msgPrefix)
				if !join(ref) || cur.hasText || cur.hasTools {
					flush()
				}
				start(ref)
				cur.msg.Content = text
				cur.hasText = true
			case "":
				return nil, bad(param+".role", "a message item needs a role")
			default:
				return nil, bad(param+".role", "unknown role %q (user, assistant, system or developer)", it.Role)
			}
		case "reasoning":
			text, err := reasoningText(it, param)
			if err != nil {
				return nil, err
			}
			ref := refFromID(it.ID, rsPrefix)
			if it.EncryptedContent != nil {
				if r, t, ok := openSeal(*it.EncryptedContent); ok {
					ref = r
					if text == "" {
						text = t
					}
				}
			}
			if !join(ref) || cur.hasReasoning || cur.hasText || cur.hasTools {
				flush()
			}
			start(ref)
			cur.msg.ReasoningContent = text
			cur.hasReasoning = true
		case "function_call":
			if it.CallID == "" {
				return nil, bad(param+".call_id", "a function_call item needs a call_id")
			}
			if it.Name == "" {
				return nil, bad(param+".name", "a function_call item needs a name")
			}
			var args string
			if doorkit.IsSet(it.Arguments) {
				if err := json.Unmarshal(it.Arguments, &args); err != nil {
					return nil, bad(param+".arguments", "arguments must be a string (JSON text)")
				}
			}
			ref := refFromCallItemID(it.ID)
			tc := openai.ToolCall{
				ID: it.CallID, Type: openai.ToolTypeFunction,
				Function: openai.FunctionCall{Name: it.Name, Arguments: args},
			}
			if cur == nil {
				// A harness that answers each call before the next
				// (call, output, call, output) still sends one reply's
				// calls: they rejoin that reply's assistant message.
				if k := callsOf(out, ref); k >= 0 {
					out[k].ToolCalls = append(out[k].ToolCalls, tc)
					continue
				}
			}
			if !join(ref) {
				flush()
			}
			start(ref)
			cur.msg.ToolCalls = append(cur.msg.ToolCalls, tc)
			cur.hasTools = true
		case "function_call_output":
			if it.CallID == "" {
				return nil, bad(param+".call_id", "a function_call_output item needs a call_id")
			}
			text, err := outputText(it.Output, param+".output")
			if err != nil {
				return nil, err
			}
			flush()
			out = append(out, gateway.Message{ChatCompletionMessage: openai.ChatCompletionMessage{Role: openai.ChatMessageRoleTool, ToolCallID: it.CallID, Content: text}})
		case "item_reference":
			return nil, bad(param, "item_reference is not supported: the gateway stores no items; send the item itself")
		case "":
			return nil, bad(param+".type", "an input item needs a type (or a role for a message)")
		default:
			return nil, bad(param+".type", "input item type %q is not supported (message, function_call, function_call_output, reasoning)", it.Type)
		}
	}
	flush()
	return out, nil
}

// callsOf returns the index of the assistant message of reply ref that
// out ends with, followed only by tool results answering its calls; -1
// when there is none or ref is unknown (an item id the gateway did not
// issue: then nothing says the calls belong to one reply).
func callsOf(out []gateway.Message, ref string) int {
	if ref == "" {
		return -1
	}
	k := len(out) - 1
	for k >= 0 && out[k].Role == openai.ChatMessageRoleTool {
		k--
	}
	if k < 0 || k == len(out)-1 || out[k].Role != openai.ChatMessageRoleAssistant || out[k].Ref != ref || len(out[k].ToolCalls) == 0 {
		return -1
	}
	issued := make(map[string]bool, len(out[k].ToolCalls))
	for _, c := range out[k].ToolCalls {
		issued[c.ID] = true
	}
	for _, m := range out[k+1:] {
		if !issued[m.ToolCallID] {
			return -1
		}
	}
	return k
}

// messageText joins a message's text parts; parts are joined with "\n".
func messageText(raw json.RawMessage, param string) (string, error) {
	if !doorkit.IsSet(raw) {
		return "", bad(param, "a message item needs content")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []part
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", bad(param, "content must be a string or an array of content parts")
	}
	texts := make([]string, 0, len(parts))
	for j, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			texts = append(texts, p.Text)
		case "refusal":
			texts = append(texts, p.Refusal)
		default:
			return "", bad(fmt.Sprintf("%s[%d].type", param, j), "content part type %q is not supported (input_text, output_text, refusal)", p.Type)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// reasoningText is a reasoning item's reasoning: its reasoning_text
// content when present, else its summaries.
func reasoningText(it item, param string) (string, error) {
	var content, summary []part
	if doorkit.IsSet(it.Content) {
		if err := json.Unmarshal(it.Content, &content); err != nil {
			return "", bad(param+".content", "a reasoning item's content must be an array of reasoning_text parts")
		}
	}
	if doorkit.IsSet(it.Summary) {
		if err := json.Unmarshal(it.Summary, &summary); err != nil {
			return "", bad(param+".summary", "a reasoning item's summary must be an array of summary_text parts")
		}
	}
	pick := func(parts []part, kind, p string) (string, error) {
		texts := make([]string, 0, len(parts))
		for j, x := range parts {
			if x.Type != kind {
				return "", bad(fmt.Sprintf("%s[%d].type", p, j), "expected %s, got %q", kind, x.Type)
			}
			texts = append(texts, x.Text)
		}
		return strings.Join(texts, "\n"), nil
	}
	if len(content) > 0 {
		return pick(content, "reasoning_text", param+".content")
	}
	return pick(summary, "summary_text", param+".summary")
}

// outputText is a function_call_output's output: a string or text parts.
func outputText(raw json.RawMessage, param string) (string, error) {
	if !doorkit.IsSet(raw) {
		return "", bad(param, "a function_call_output item needs an output")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []part
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", bad(param, "output must be a string or an array of input_text parts")
	}
	texts := make([]string, 0, len(parts))
	for j, p := range parts {
		if p.Type != "input_text" && p.Type != "output_text" && p.Type != "text" {
			return "", bad(fmt.Sprintf("%s[%d].type", param, j), "output part type %q is not supported (input_text)", p.Type)
		}
		texts = append(texts, p.Text)
	}
	return strings.Join(texts, "\n"), nil
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
		return nil, bad("tools", "tools must be an array of function tools: %v", err)
	}
	out := make([]openai.Tool, 0, len(tools))
	for i, t := range tools {
		param := fmt.Sprintf("tools[%d]", i)
		if t.Type != "function" {
			return nil, bad(param+".type", "tool type %q is not supported: the gateway serves function tools only", t.Type)
		}
		if t.Name == "" {
			if doorkit.IsSet(t.Function) {
				return nil, bad(param+".name", "Responses function tools are flat (name, description, parameters at the top level), not nested under \"function\"")
			}
			return nil, bad(param+".name", "a function tool needs a name")
		}
		def := &openai.FunctionDefinition{Name: t.Name, Description: t.Description}
		if t.Strict != nil {
			def.Strict = *t.Strict
		}
		if doorkit.IsSet(t.Parameters) {
			def.Parameters = t.Parameters
		}
		out = append(out, openai.Tool{Type: openai.ToolTypeFunction, Function: def})
	}
	return out, nil
}

func decodeToolChoice(raw json.RawMessage) (*gateway.ToolChoice, error) {
	if !doorkit.IsSet(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none", "required":
			return &gateway.ToolChoice{Mode: s}, nil
		}
		return nil, bad("tool_choice", "tool_choice %q is not one of auto, none, required", s)
	}
	var o struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, bad("tool_choice", "tool_choice must be a string or an object")
	}
	if o.Type != "function" {
		return nil, bad("tool_choice.type", "tool_choice type %q is not supported (function)", o.Type)
	}
	if o.Name == "" {
		return nil, bad("tool_choice.name", "a function tool_choice needs a name")
	}
	return &gateway.ToolChoice{Mode: "function", Name: o.Name}, nil
}
