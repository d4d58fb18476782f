package sim

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
)

// promptInfo is what the policy reads back from a rendered prompt. The
// policy works on the prompt text, not on messages, so the chat, completions
// and generate routes behave identically for the same ids.
type promptInfo struct {
	FirstUser        string
	Turn             int      // assistant turns already in the prompt
	Tools            []string // tool names offered in the prompt
	PriorCalls       int      // tool calls already in the prompt (Kimi numbering)
	ThinkingDisabled bool     // the prompt pre-closes an empty think block
}

var toolNameRE = regexp.MustCompile(`\{"function": \{(?:"description": "(?:[^"\\]|\\.)*", )?"name": "((?:[^"\\]|\\.)*)"`)

func inspectPrompt(t *template, family, prompt string) promptInfo {
	var info promptInfo
	if i := strings.Index(prompt, t.userHeader); i >= 0 {
		rest := prompt[i+len(t.userHeader):]
		if j := strings.Index(rest, t.userEnd); j >= 0 {
			rest = rest[:j]
		}
		info.FirstUser = rest
	}
	if t.assistantHeader != "" {
		info.Turn = max(strings.Count(prompt, t.assistantHeader)-1, 0)
	} else {
		info.Turn = strings.Count(prompt, t.turnEnd)
	}
	for _, m := range toolNameRE.FindAllStringSubmatch(prompt, -1) {
		if m[1] != "<function-name>" {
			info.Tools = append(info.Tools, m[1])
		}
	}
	info.PriorCalls = countCalls(family, prompt)
	info.ThinkingDisabled = strings.HasSuffix(prompt, "<think>\n\n</think>\n\n")
	return info
}

// countCalls counts Kimi K2 call markers already in the prompt (minus the
// one in the format instructions): Kimi numbers calls across the whole
// conversation. Other families do not need the count.
func countCalls(family, prompt string) int {
	if family != "kimi_k2" {
		return 0
	}
	n := strings.Count(prompt, "<|tool_call_begin|>")
	if strings.Contains(prompt, "<function-name>") {
		n--
	}
	return max(n, 0)
}

// turnPlan is the policy's decision for one generation.
type turnPlan struct {
	Thought string
	Content string
	Calls   []Call
}

// chooseTurn picks the assistant turn for a prompt. wrong decides, for a
// script with a wrong path, whether this episode is on it.
func (c *Config) chooseTurn(info promptInfo, wrong func(Script) bool) turnPlan {
	if b := c.Bench; b != nil {
		if info.Turn >= b.Turns {
			return turnPlan{Thought: "The benchmark turns are done.", Content: "bench done"}
		}
		args := b.Arguments
		if args == nil {
			args = map[string]any{"command": "true"}
		}
		calls := make([]Call, b.CallsPerTurn)
		for i := range calls {
			calls[i] = Call{Name: b.Tool, Arguments: args}
		}
		return turnPlan{Thought: fmt.Sprintf("Benchmark turn %d.", info.Turn), Calls: calls}
	}
	for _, s := range c.Scripts {
		if !strings.Contains(info.FirstUser, s.Match) {
			continue
		}
		path := s.Steps
		if len(s.Wrong) > 0 && wrong(s) {
			path = s.Wrong
		}
		if info.Turn >= len(path) {
			return turnPlan{Thought: "The task is finished.", Content: "Done."}
		}
		st := path[info.Turn]
		p := turnPlan{Thought: st.Thought, Content: st.Final, Calls: st.ToolCalls}
		if p.Thought == "" {
			p.Thought = defaultThought(p)
		}
		return p
	}
	hasTerminal := false
	for _, t := range info.Tools {
		hasTerminal = hasTerminal || t == "terminal"
	}
	switch {
	case hasTerminal && info.Turn == 0:
		return turnPlan{Thought: "I should look at the working directory first.",
			Calls: []Call{{Name: "terminal", Arguments: map[string]any{"command": "ls -la"}}}}
	case hasTerminal:
		return turnPlan{Thought: "The listing answers the question.", Content: "I listed the working directory; the output is above."}
	default:
		return turnPlan{Thought: "A short greeting is enough.", Content: "Hello! I am the rollout simulator."}
	}
}

// pathFromHistory tells which path of s the earlier assistant turns of the
// prompt followed, by looking for each path's rendered steps: the templates
// re-render calls in the family's own syntax, byte for byte. ok is false
// when the history does not tell the paths apart.
func (c *Config) pathFromHistory(s Script, prompt string, info promptInfo) (wrong, ok bool) {
	score := func(path []Step) int {
		n := 0
		for k := 0; k < info.Turn && k < len(path); k++ {
			if sig := c.stepSignature(path[k]); sig != "" && strings.Contains(prompt, sig) {
				n++
			}
		}
		return n
	}
	right, bad := score(s.Steps), score(s.Wrong)
	if right == bad {
		return false, false
	}
	return bad > right, true
}

// stepSignature is the text a step leaves in a re-rendered history.
func (c *Config) stepSignature(st Step) string {
	if len(st.ToolCalls) == 0 {
		return st.Final
	}
	calls := make([]emitCall, len(st.ToolCalls))
	for i, call := range st.ToolCalls {
		calls[i] = emitCall{Name: call.Name, Args: normaliseArgs(call.Arguments)}
	}
	// Kimi numbers calls globally, so only the first call of a later turn
	// would carry a known index; the name and arguments suffice.
	sig := emitCalls(c.Family, calls, 0)
	if c.Family == "kimi_k2" {
		return strings.TrimPrefix(sig, "<|tool_calls_section_begin|><|tool_call_begin|>functions.")
	}
	return sig
}

func defaultThought(p turnPlan) string {
	if len(p.Calls) == 0 {
		return "I have what I need to answer."
	}
	names := make([]string, len(p.Calls))
	for i, c := range p.Calls {
		names[i] = c.Name
	}
	return "I should call " + strings.Join(names, ", ") + "."
}

// prefaceFamilies keep text before tool calls as content; Llama 3 JSON
// parsers drop it, so the policy does not write any there.
var prefaceFamilies = map[string]bool{"hermes": true, "qwen3_coder": true, "glm45": true, "deepseek_v3": true, "kimi_k2": true, "mistral": true}

// renderTurn writes the plan as raw model text (without the end-of-turn
// token).
func (c *Config) renderTurn(p turnPlan, info promptInfo) string {
	var b strings.Builder
	if c.Reasoning && !info.ThinkingDisabled {
		b.WriteString("<think>\n" + p.Thought + "\n</think>\n\n")
	}
	content := p.Content
	if len(p.Calls) > 0 && content == "" && prefaceFamilies[c.Family] {
		content = "Let me do that."
	}
	calls := make([]emitCall, len(p.Calls))
	for i, call := range p.Calls {
		calls[i] = emitCall{Name: call.Name, Args: normaliseArgs(call.Arguments)}
	}
	b.WriteString(joinContentCalls(c.Family, content, emitCalls(c.Family, calls, info.PriorCalls)))
	return b.String()
}

// normaliseArgs turns YAML/Go values into JSON-shaped values.
func normaliseArgs(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	v, ok := decodeJSON([]byte(pyJSON(m))).(map[string]any)
	if !ok {
		return map[string]any{}
	}
	return v
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}

func hashIDs(ids []int) uint64 {
	h := fnv.New64a()
	var buf [4]byte
	for _, id := range ids {
		buf[0], buf[1], buf[2], buf[3] = byte(id), byte(id>>8), byte(id>>16), byte(id>>24)
		_, _ = h.Write(buf[:])
	}
	return h.Sum64()
}
