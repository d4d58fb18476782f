package render_test

import (
	"encoding/json"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"
)

// chatCase is one conversation as a request carries it: messages and tools
// are raw JSON so key order reaches both renderers untouched.
type chatCase struct {
	name      string
	messages  string
	tools     string
	genPrompt bool
	kwargs    string // chat_template_kwargs as a JSON object, or ""
}

func (c chatCase) decode(t testing.TB) ([]openai.ChatCompletionMessage, json.RawMessage, map[string]any) {
	t.Helper()
	var msgs []openai.ChatCompletionMessage
	if err := json.Unmarshal([]byte(c.messages), &msgs); err != nil {
		t.Fatalf("%s: messages: %v", c.name, err)
	}
	var kw map[string]any
	if c.kwargs != "" {
		if err := json.Unmarshal([]byte(c.kwargs), &kw); err != nil {
			t.Fatalf("%s: kwargs: %v", c.name, err)
		}
	}
	var tools json.RawMessage
	if c.tools != "" {
		tools = json.RawMessage(c.tools)
	}
	return msgs, tools, kw
}

const (
	toolWeather = `{"type":"function","function":{"name":"get_weather","description":"Weather for a city","parameters":{"type":"object","required":["city"],"properties":{"city":{"type":"string","description":"City name"},"unit":{"enum":["c","f"],"type":"string","default":"c"},"days":{"type":"integer","minimum":1,"maximum":14.0}}}}}`
	toolSearch  = `{"type":"function","function":{"parameters":{"type":"object","properties":{"query":{"type":"string"},"filters":{"type":"object","properties":{"since":{"type":"string","format":"date"},"lang":{"type":"array","items":{"type":"string"}},"score":{"type":"number","minimum":0.5,"maximum":1e5}}}},"required":["query"]},"name":"search","strict":true}}`
	toolShell   = `{"type":"function","function":{"name":"terminal","description":"Run a shell command — «safe» only","parameters":{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"number","default":1.5e-7}},"required":["command"]}}}`
	toolNoDesc  = `{"type":"function","function":{"name":"noop","parameters":{"type":"object","properties":{}}}}`
)

func callJSON(id, name, args string) string {
	b, _ := json.Marshal(args)
	return `{"id":"` + id + `","type":"function","function":{"name":"` + name + `","arguments":` + string(b) + `}}`
}

func tools(ts ...string) string { return "[" + strings.Join(ts, ",") + "]" }

// chatCases are the conversations both the real engine and the simulator
// comparisons render.
func chatCases() []chatCase {
	sys := `{"role":"system","content":"You are a careful assistant."}`
	user := `{"role":"user","content":"What is the weather in Paris?"}`
	call1 := `{"role":"assistant","content":"","tool_calls":[` + callJSON("call_1", "get_weather", `{"unit":"c","city":"Paris","days":3}`) + `]}`
	res1 := `{"role":"tool","tool_call_id":"call_1","content":"{\"temp\": 21.5, \"sky\": \"clear\"}"}`
	call2 := `{"role":"assistant","content":"Let me check both.","tool_calls":[` +
		callJSON("call_a", "search", `{"query":"rain paris","filters":{"score":1.0,"lang":["fr","en"],"since":"2024-01-01"}}`) + `,` +
		callJSON("call_b", "terminal", `{"timeout":1e5,"command":"echo 'héllo ✓ 日本'"}`) + `]}`
	res2a := `{"role":"tool","tool_call_id":"call_a","content":"3 results"}`
	res2b := `{"role":"tool","tool_call_id":"call_b","content":"héllo ✓ 日本"}`
	final := `{"role":"assistant","content":"It is 21.5°C and clear."}`
	arr := func(ms ...string) string { return "[" + strings.Join(ms, ",") + "]" }
	return []chatCase{
		{name: "user only", messages: arr(user), genPrompt: true},
		{name: "user no gen prompt", messages: arr(user)},
		{name: "system user", messages: arr(sys, user), genPrompt: true},
		{name: "system user assistant", messages: arr(sys, user, final)},
		{name: "multi turn", messages: arr(sys, user, final, `{"role":"user","content":"And tomorrow?"}`), genPrompt: true},
		{name: "tools no system", messages: arr(user), tools: tools(toolWeather), genPrompt: true},
		{name: "tools with system", messages: arr(sys, user), tools: tools(toolWeather, toolSearch, toolShell), genPrompt: true},
		{name: "tool without description", messages: arr(user), tools: tools(toolNoDesc), genPrompt: true},
		{name: "one tool call", messages: arr(user, call1), tools: tools(toolWeather)},
		{name: "tool call and result", messages: arr(sys, user, call1, res1), tools: tools(toolWeather), genPrompt: true},
		{name: "tool result then answer", messages: arr(sys, user, call1, res1, final), tools: tools(toolWeather)},
		{name: "two tool calls with content", messages: arr(user, call2, res2a, res2b), tools: tools(toolSearch, toolShell), genPrompt: true},
		{name: "two calls no tools given", messages: arr(user, call2, res2a, res2b), genPrompt: true},
		{name: "reasoning content", messages: arr(user, `{"role":"assistant","content":"Paris is sunny.","reasoning_content":"The user asks about Paris."}`), genPrompt: false},
		{name: "reasoning and tool call", messages: arr(user, `{"role":"assistant","content":"","reasoning_content":"Need the weather tool.","tool_calls":[`+callJSON("c9", "get_weather", `{"city":"Lyon","unit":"f"}`)+`]}`, res1), tools: tools(toolWeather), genPrompt: true},
		{name: "enable thinking false", messages: arr(user), genPrompt: true, kwargs: `{"enable_thinking":false}`},
		{name: "enable thinking true", messages: arr(user), genPrompt: true, kwargs: `{"enable_thinking":true}`},
		{name: "enable thinking false no gen", messages: arr(user, final), kwargs: `{"enable_thinking":false}`},
		{name: "multi-part user", messages: arr(`{"role":"user","content":[{"type":"text","text":"First part."},{"type":"text","text":"Second part."}]}`), genPrompt: true},
		{name: "multi-part system", messages: arr(`{"role":"system","content":[{"type":"text","text":"Be brief."},{"type":"text","text":"Be kind."}]}`, user), genPrompt: true},
		{name: "multi-part with tools", messages: arr(`{"role":"system","content":[{"type":"text","text":"S1"},{"type":"text","text":"S2"}]}`, `{"role":"user","content":[{"type":"text","text":"U"}]}`), tools: tools(toolShell), genPrompt: true},
		{name: "unicode and escapes", messages: arr(`{"role":"user","content":"Quote \" backslash \\ tab \t newline \n emoji 🚀 line\u2028sep"}`), genPrompt: true},
		{name: "args numbers", messages: arr(user, `{"role":"assistant","content":"","tool_calls":[`+callJSON("n1", "calc", `{"b":1.0,"a":1e5,"c":-0.25,"d":12345678901234,"e":1e16,"f":1.5e-7,"g":0.1,"h":-0.0,"i":1e-5,"j":123456.789,"k":0.0001}`)+`]}`), genPrompt: true},
		{name: "args nested and unicode", messages: arr(user, `{"role":"assistant","content":"","tool_calls":[`+callJSON("n2", "put", `{"z":{"y":[1,{"x":null,"w":true}],"v":"ü€𝄞"},"a":[],"m":{},"s":"line\nnext \"q\" <b>&amp;</b>"}`)+`]}`), genPrompt: true},
		{name: "args array", messages: arr(user, `{"role":"assistant","content":"","tool_calls":[`+callJSON("n3", "list", `[3, 2, 1]`)+`]}`)},
		{name: "args spaced json", messages: arr(user, `{"role":"assistant","content":"","tool_calls":[`+callJSON("n4", "f", "{ \"k\" :\n 2 , \"a\":\"b\" }")+`]}`), genPrompt: true},
		{name: "system mid conversation", messages: arr(user, final, `{"role":"system","content":"Now answer in French."}`, `{"role":"user","content":"Encore?"}`), genPrompt: true},
		{name: "empty content", messages: arr(`{"role":"user","content":""}`), genPrompt: true},
		{name: "tool schema numbers", messages: arr(user), tools: tools(`{"type":"function","function":{"name":"n","description":"d","parameters":{"type":"object","properties":{"p":{"type":"number","default":1.0,"maximum":1e5,"minimum":-2.50,"multipleOf":0.001,"examples":[1e16,123456789012345678]}}}}}`), genPrompt: true},
		{name: "full agent loop", messages: arr(sys, user, call2, res2a, res2b, final, `{"role":"user","content":"thanks"}`), tools: tools(toolWeather, toolSearch, toolShell), genPrompt: true, kwargs: `{"enable_thinking":false}`},
		{name: "tool name field", messages: arr(user, call1, `{"role":"tool","tool_call_id":"call_1","name":"get_weather","content":"sunny"}`), tools: tools(toolWeather), genPrompt: true},
	}
}
