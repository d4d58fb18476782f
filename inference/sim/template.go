package sim

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Message is one chat message as the OpenAI API carries it. Content is a
// string or a list of parts; reasoning arrives as "reasoning" or the older
// "reasoning_content".
type Message struct {
	Role             string            `json:"role"`
	Content          json.RawMessage   `json:"content,omitempty"`
	Name             string            `json:"name,omitempty"`
	ToolCalls        []MessageToolCall `json:"tool_calls,omitempty"`
	ToolCallID       string            `json:"tool_call_id,omitempty"`
	Reasoning        *string           `json:"reasoning,omitempty"`
	ReasoningContent *string           `json:"reasoning_content,omitempty"`
}

// MessageToolCall is an assistant tool call in the history.
type MessageToolCall struct {
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name string `json:"name"`
		// Arguments is a JSON string in the OpenAI API; some clients send an
		// object, which is accepted too.
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// Tool is an entry of a request's tools array.
type Tool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	} `json:"function"`
}

// text returns the message content as one string.
func (m Message) text() (string, error) {
	c := strings.TrimSpace(string(m.Content))
	if c == "" || c == "null" {
		return "", nil
	}
	if c[0] == '"' {
		var s string
		if err := json.Unmarshal(m.Content, &s); err != nil {
			return "", fmt.Errorf("message content: %w", err)
		}
		return s, nil
	}
	if c[0] == '[' {
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(m.Content, &parts); err != nil {
			return "", fmt.Errorf("message content parts: %w", err)
		}
		var b strings.Builder
		for _, p := range parts {
			if p.Type != "text" {
				return "", fmt.Errorf("message content part of type %q is not supported by the simulator (text only)", p.Type)
			}
			b.WriteString(p.Text)
		}
		return b.String(), nil
	}
	return "", fmt.Errorf("message content must be a string or a list of parts, got %.40s", c)
}

func (m Message) reasoning() string {
	if m.Reasoning != nil {
		return *m.Reasoning
	}
	if m.ReasoningContent != nil {
		return *m.ReasoningContent
	}
	return ""
}

// renderMsg is a validated message ready for a template.
type renderMsg struct {
	Role      string
	Content   string
	Reasoning string
	Calls     []emitCall
	CallID    string
}

func prepareMessages(msgs []Message) ([]renderMsg, error) {
	out := make([]renderMsg, 0, len(msgs))
	for i, m := range msgs {
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool":
		default:
			return nil, fmt.Errorf("messages[%d]: unknown role %q", i, m.Role)
		}
		text, err := m.text()
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		r := renderMsg{Role: m.Role, Content: text, Reasoning: m.reasoning(), CallID: m.ToolCallID}
		if r.Role == "developer" {
			r.Role = "system"
		}
		for j, tc := range m.ToolCalls {
			if tc.Function.Name == "" {
				return nil, fmt.Errorf("messages[%d].tool_calls[%d]: function name is empty", i, j)
			}
			c := emitCall{ID: tc.ID, Name: tc.Function.Name}
			raw := strings.TrimSpace(string(tc.Function.Arguments))
			if strings.HasPrefix(raw, "\"") {
				var s string
				if err := json.Unmarshal(tc.Function.Arguments, &s); err != nil {
					return nil, fmt.Errorf("messages[%d].tool_calls[%d].function.arguments: %w", i, j, err)
				}
				raw = s
			}
			if obj, ok := decodeJSON([]byte(raw)).(map[string]any); ok {
				c.Args = obj
			} else {
				c.RawArgs = raw
			}
			r.Calls = append(r.Calls, c)
		}
		out = append(out, r)
	}
	return out, nil
}

// renderOptions are the request settings that change the rendering.
type renderOptions struct {
	AddGenerationPrompt    bool
	ContinueFinalMessage   bool
	EnableThinkingSetFalse bool // chat_template_kwargs.enable_thinking == false
	// BuiltinTools is chat_template_kwargs.builtin_tools: Llama 3.1's
	// ipython mode, in which its template announces the built-in tools and
	// ends assistant turns that call a tool with <|eom_id|>, other turns
	// with <|eot_id|>.
	BuiltinTools []string
}

// template renders a conversation to the exact prompt text the model sees.
type template struct {
	name string
	// bos is prepended once by add_special_tokens on plain-text prompts.
	bos string
	// eot is the token that ends an assistant turn (sampled last).
	eot string
	// assistantHeader marks the start of every assistant turn, including
	// the generation prompt; counting it gives the turn index. Templates
	// without one (Mistral) count turnEnd markers instead.
	assistantHeader string
	turnEnd         string
	// userHeader and userEnd delimit user turns, to find the first user
	// message in a rendered prompt.
	userHeader, userEnd string
	// dummyPrefix marks SentencePiece tokenizers (Mistral, Llama 2), which
	// prepend a space ("▁") to every plain text they encode.
	dummyPrefix bool
	render      func(t *template, family string, msgs []renderMsg, tools []Tool, o renderOptions) (string, error)
}

var templates = map[string]*template{}

func init() {
	chatml := func(name string) *template {
		return &template{name: name, eot: "<|im_end|>", assistantHeader: "<|im_start|>assistant\n",
			userHeader: "<|im_start|>user\n", userEnd: "<|im_end|>", render: renderChatML}
	}
	for _, n := range []string{"chatml", "hermes", "qwen2.5", "qwen3"} {
		templates[n] = chatml(n)
	}
	templates["llama3"] = &template{name: "llama3", bos: "<|begin_of_text|>", eot: "<|eot_id|>",
		assistantHeader: "<|start_header_id|>assistant<|end_header_id|>\n\n",
		userHeader:      "<|start_header_id|>user<|end_header_id|>\n\n", userEnd: "<|eot_id|>", render: renderLlama3}
	templates["deepseek_v3"] = &template{name: "deepseek_v3", bos: "<｜begin▁of▁sentence｜>", eot: "<｜end▁of▁sentence｜>",
		assistantHeader: "<｜Assistant｜>", userHeader: "<｜User｜>", userEnd: "<｜Assistant｜>", render: renderDeepSeek}
	templates["mistral"] = &template{name: "mistral", bos: "<s>", eot: "</s>", dummyPrefix: true,
		turnEnd: "</s>", userHeader: "[INST]", userEnd: "[/INST]", render: renderMistral}
}

// TemplateNames lists the supported templates.
func TemplateNames() []string {
	out := make([]string, 0, len(templates))
	for n := range templates {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func toolJSON(t Tool) string {
	fn := map[string]any{"name": t.Function.Name}
	if t.Function.Description != "" {
		fn["description"] = t.Function.Description
	}
	if len(t.Function.Parameters) > 0 {
		fn["parameters"] = decodeJSON(t.Function.Parameters)
	}
	return pyJSON(map[string]any{"type": "function", "function": fn})
}

func checkRenderOptions(msgs []renderMsg, o renderOptions) error {
	if len(msgs) == 0 {
		return fmt.Errorf("messages must not be empty")
	}
	if o.ContinueFinalMessage && o.AddGenerationPrompt {
		return fmt.Errorf("continue_final_message and add_generation_prompt cannot both be true")
	}
	if o.ContinueFinalMessage && msgs[len(msgs)-1].Role != "assistant" {
		return fmt.Errorf("continue_final_message needs a final assistant message")
	}
	return nil
}

// splitThink separates a "<think>…</think>" prefix left in content.
func splitThink(content string) (reasoning, rest string, ok bool) {
	i := strings.Index(content, "</think>")
	if i < 0 {
		return "", content, false
	}
	reasoning = strings.TrimPrefix(content[:i], "<think>")
	rest = strings.TrimLeft(content[i+len("</think>"):], "\n")
	return strings.Trim(reasoning, "\n"), rest, true
}

// renderChatML covers chatml, hermes, qwen2.5 and qwen3. Tools go into the
// system turn as in Qwen2.5/Hermes; tool results are grouped into one user
// turn of <tool_response> blocks; qwen3 keeps <think> only for assistant
// turns after the last real user message.
func renderChatML(t *template, family string, msgs []renderMsg, tools []Tool, o renderOptions) (string, error) {
	if err := checkRenderOptions(msgs, o); err != nil {
		return "", err
	}
	var b strings.Builder
	start := 0
	system := ""
	hasSystem := msgs[0].Role == "system"
	if hasSystem {
		system = msgs[0].Content
		start = 1
	} else if t.name == "qwen2.5" {
		system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
		hasSystem = true
	}
	if len(tools) > 0 {
		b.WriteString("<|im_start|>system\n")
		if system != "" {
			b.WriteString(system + "\n\n")
		}
		b.WriteString("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
			"You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
		for _, tl := range tools {
			b.WriteString("\n" + toolJSON(tl))
		}
		b.WriteString("\n</tools>\n\n" + callInstructions(family) + "<|im_end|>\n")
	} else if hasSystem {
		b.WriteString("<|im_start|>system\n" + system + "<|im_end|>\n")
	}
	lastQuery := -1
	for i, m := range msgs {
		if m.Role == "user" {
			lastQuery = i
		}
	}
	callsSoFar := 0
	for i := start; i < len(msgs); i++ {
		m := msgs[i]
		final := i == len(msgs)-1
		switch m.Role {
		case "system":
			b.WriteString("<|im_start|>system\n" + m.Content + "<|im_end|>\n")
		case "user":
			b.WriteString("<|im_start|>user\n" + m.Content + "<|im_end|>\n")
		case "assistant":
			content, reasoning := m.Content, m.Reasoning
			if r, rest, ok := splitThink(content); ok {
				content = rest
				if reasoning == "" {
					reasoning = r
				}
			}
			b.WriteString("<|im_start|>assistant\n")
			if t.name == "qwen3" && i > lastQuery && reasoning != "" {
				b.WriteString("<think>\n" + strings.Trim(reasoning, "\n") + "\n</think>\n\n")
			}
			b.WriteString(joinContentCalls(family, content, emitCalls(family, m.Calls, callsSoFar)))
			callsSoFar += len(m.Calls)
			if final && o.ContinueFinalMessage {
				return b.String(), nil
			}
			b.WriteString("<|im_end|>\n")
		case "tool":
			if i == start || msgs[i-1].Role != "tool" {
				b.WriteString("<|im_start|>user")
			}
			b.WriteString("\n<tool_response>\n" + m.Content + "\n</tool_response>")
			if final || msgs[i+1].Role != "tool" {
				b.WriteString("<|im_end|>\n")
			}
		}
	}
	if o.AddGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
		if t.name == "qwen3" && o.EnableThinkingSetFalse {
			b.WriteString("<think>\n\n</think>\n\n")
		}
	}
	return b.String(), nil
}

// callInstructions is the format reminder that follows the tools list.
func callInstructions(family string) string {
	example := emitCalls(family, []emitCall{{Name: "<function-name>", RawArgs: "<args-json-object>"}}, 0)
	return "For each function call, use this format:\n" + example
}

func renderLlama3(t *template, family string, msgs []renderMsg, tools []Tool, o renderOptions) (string, error) {
	if err := checkRenderOptions(msgs, o); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
	if len(o.BuiltinTools) > 0 {
		// Llama 3.1's template: "Environment: ipython", then the built-in
		// tools other than code_interpreter.
		b.WriteString("Environment: ipython\n")
		var named []string
		for _, n := range o.BuiltinTools {
			if n != "code_interpreter" {
				named = append(named, n)
			}
		}
		b.WriteString("Tools: " + strings.Join(named, ", ") + "\n\n")
	}
	b.WriteString("Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n")
	start := 0
	if msgs[0].Role == "system" {
		b.WriteString(msgs[0].Content)
		start = 1
	}
	b.WriteString("<|eot_id|>")
	toolsPending := len(tools) > 0
	callsSoFar := 0
	for i := start; i < len(msgs); i++ {
		m := msgs[i]
		switch m.Role {
		case "system":
			b.WriteString("<|start_header_id|>system<|end_header_id|>\n\n" + m.Content + "<|eot_id|>")
		case "user":
			b.WriteString("<|start_header_id|>user<|end_header_id|>\n\n")
			if toolsPending {
				// Llama 3.1's JSON tool template puts the tools into the first
				// user message.
				b.WriteString("Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n" +
					"Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}. Do not use variables.\n\n")
				for _, tl := range tools {
					b.WriteString(toolJSON(tl) + "\n\n")
				}
				toolsPending = false
			}
			b.WriteString(m.Content + "<|eot_id|>")
		case "assistant":
			b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
			_, content, _ := splitThink(m.Content)
			b.WriteString(joinContentCalls(family, content, emitCalls(family, m.Calls, callsSoFar)))
			callsSoFar += len(m.Calls)
			if i == len(msgs)-1 && o.ContinueFinalMessage {
				return b.String(), nil
			}
			if len(m.Calls) > 0 && len(o.BuiltinTools) > 0 {
				b.WriteString("<|eom_id|>") // ipython mode: the turn waits for the tool
			} else {
				b.WriteString("<|eot_id|>")
			}
		case "tool":
			b.WriteString("<|start_header_id|>ipython<|end_header_id|>\n\n" + m.Content + "<|eot_id|>")
		}
	}
	if o.AddGenerationPrompt {
		b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	}
	return b.String(), nil
}

// renderDeepSeek follows DeepSeek-V3/R1: history assistant turns lose
// their reasoning (everything up to </think>), tool outputs are grouped.
func renderDeepSeek(t *template, family string, msgs []renderMsg, tools []Tool, o renderOptions) (string, error) {
	if err := checkRenderOptions(msgs, o); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("<｜begin▁of▁sentence｜>")
	start := 0
	if msgs[0].Role == "system" {
		b.WriteString(msgs[0].Content)
		start = 1
	}
	if len(tools) > 0 {
		if start == 1 {
			b.WriteString("\n\n")
		}
		b.WriteString("## Tools\nYou have access to the following tools:\n")
		for _, tl := range tools {
			b.WriteString("\n" + toolJSON(tl))
		}
		b.WriteString("\n\n" + callInstructions(family))
	}
	callsSoFar := 0
	for i := start; i < len(msgs); i++ {
		m := msgs[i]
		switch m.Role {
		case "system":
			b.WriteString("\n\n" + m.Content)
		case "user":
			b.WriteString("<｜User｜>" + m.Content)
		case "assistant":
			_, content, _ := splitThink(m.Content)
			if i > start && msgs[i-1].Role == "tool" {
				b.WriteString("<｜tool▁outputs▁end｜>")
			}
			b.WriteString("<｜Assistant｜>" + joinContentCalls(family, content, emitCalls(family, m.Calls, callsSoFar)))
			callsSoFar += len(m.Calls)
			if i == len(msgs)-1 && o.ContinueFinalMessage {
				return b.String(), nil
			}
			b.WriteString("<｜end▁of▁sentence｜>")
		case "tool":
			if i == start || msgs[i-1].Role != "tool" {
				b.WriteString("<｜tool▁outputs▁begin｜>")
			}
			b.WriteString("<｜tool▁output▁begin｜>" + m.Content + "<｜tool▁output▁end｜>")
		}
	}
	if msgs[len(msgs)-1].Role == "tool" {
		b.WriteString("<｜tool▁outputs▁end｜>")
	}
	if o.AddGenerationPrompt {
		b.WriteString("<｜Assistant｜>")
	}
	return b.String(), nil
}

// renderMistral follows the v7 (tekken) layout: an explicit system prompt
// block, tools announced before the last user message, and no generation
// prompt (the model answers right after [/INST]).
func renderMistral(t *template, family string, msgs []renderMsg, tools []Tool, o renderOptions) (string, error) {
	if err := checkRenderOptions(msgs, o); err != nil {
		return "", err
	}
	if err := checkMistralIDs(msgs); err != nil {
		return "", err
	}
	lastUser := -1
	for i, m := range msgs {
		if m.Role == "user" {
			lastUser = i
		}
	}
	var b strings.Builder
	b.WriteString("<s>")
	callsSoFar := 0
	for i, m := range msgs {
		switch m.Role {
		case "system":
			b.WriteString("[SYSTEM_PROMPT]" + m.Content + "[/SYSTEM_PROMPT]")
		case "user":
			if i == lastUser && len(tools) > 0 {
				b.WriteString("[AVAILABLE_TOOLS][")
				for j, tl := range tools {
					if j > 0 {
						b.WriteString(", ")
					}
					b.WriteString(toolJSON(tl))
				}
				b.WriteString("][/AVAILABLE_TOOLS]")
			}
			b.WriteString("[INST]" + m.Content + "[/INST]")
		case "assistant":
			_, content, _ := splitThink(m.Content)
			b.WriteString(joinContentCalls(family, content, emitCalls(family, m.Calls, callsSoFar)))
			callsSoFar += len(m.Calls)
			if i == len(msgs)-1 && o.ContinueFinalMessage {
				return b.String(), nil
			}
			b.WriteString("</s>")
		case "tool":
			b.WriteString("[TOOL_RESULTS]" + pyJSON(map[string]any{"content": m.Content, "call_id": m.CallID}) + "[/TOOL_RESULTS]")
		}
	}
	return b.String(), nil
}

// checkMistralIDs refuses tool-call ids Mistral's tokenizer refuses: an id
// given in the history must be 9 characters of [a-zA-Z0-9] (mistral_common
// validates every assistant call and tool result; the Hub's Mistral
// templates raise on the same). vLLM's chat route shortens longer ids to
// their last 9 characters first (truncateMistralIDs); its /tokenize route
// does not, so a client re-rendering `call_`+hex ids there gets a 400.
func checkMistralIDs(msgs []renderMsg) error {
	for i, m := range msgs {
		for j, c := range m.Calls {
			if c.ID != "" && !mistralID(c.ID) {
				return fmt.Errorf("messages[%d].tool_calls[%d]: tool call id %q is not 9 characters of a-z, A-Z, 0-9 (Mistral tokenizer)", i, j, c.ID)
			}
		}
		if m.Role == "tool" && m.CallID != "" && !mistralID(m.CallID) {
			return fmt.Errorf("messages[%d]: tool_call_id %q is not 9 characters of a-z, A-Z, 0-9 (Mistral tokenizer)", i, m.CallID)
		}
	}
	return nil
}

func mistralID(id string) bool {
	if len(id) != 9 {
		return false
	}
	for _, c := range []byte(id) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') {
			return false
		}
	}
	return true
}

// truncateMistralIDs is what vLLM's chat route does for a Mistral
// tokenizer before rendering: tool-call ids longer than 9 characters keep
// their last 9 (in assistant calls and in tool results alike).
func truncateMistralIDs(family string, c chatRender) chatRender {
	if family != "mistral" {
		return c
	}
	last9 := func(id string) string {
		if len(id) > 9 {
			return id[len(id)-9:]
		}
		return id
	}
	msgs := slices.Clone(c.Messages)
	for i := range msgs {
		if len(msgs[i].ToolCalls) > 0 {
			calls := slices.Clone(msgs[i].ToolCalls)
			for j := range calls {
				calls[j].ID = last9(calls[j].ID)
			}
			msgs[i].ToolCalls = calls
		}
		if msgs[i].Role == "tool" {
			msgs[i].ToolCallID = last9(msgs[i].ToolCallID)
		}
	}
	c.Messages = msgs
	return c
}
