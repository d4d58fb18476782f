package render

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
	openai "github.com/sashabaranov/go-openai"
)

// This file renders chat templates the way llama.cpp's server feeds them
// (checked against llama.cpp's common/chat.cpp and common/jinja, 2026, and
// byte for byte against llama-server 0.7.0 from Debian sid by
// llamacpp_template_test.go):
//
//   - A message is an ordered dict {role, content, tool_calls, reasoning_content,
//     name, tool_call_id}; the last four only when set (common_chat_msg::
//     to_json_oaicompat). Content is a string (null becomes ""), or, for a
//     list of parts, the list of {type: "text", text} parts when the template
//     reads typed content (llama.cpp's supports_typed_content capability),
//     else the texts joined by "\n".
//   - A tool call is {type: "function", function: {name, arguments}, id}
//     where arguments is the parsed JSON value of the argument string (vLLM's
//     chat_utils._postprocess_messages and llama.cpp both parse it). A string
//     that is not JSON stays a string (llama.cpp refuses the request then).
//   - Tools become {type: "function", function: {name, description,
//     parameters}} with description "" when absent and other fields dropped
//     (common_chat_tools_to_json_oaicompat); key order inside parameters is
//     the request's.
//   - tojson prints like Python's json.dumps(x, ensure_ascii=False) with
//     separators (", ", ": "): floats as Python's repr (1.0, 100000.0,
//     1e+16, 1e-07), non-ASCII unescaped, U+2028/U+2029 raw; with
//     indent=N as json.dumps(x, ensure_ascii=False, indent=N) (indent.go).
//
// ardanlabs/jinja's own tojson prints floats with Go's %g (1.0 as "1",
// 1e6 as "1e+06") and escapes U+2028/U+2029, and its filters cannot be
// replaced. So values it would print differently travel through the
// template as marked strings (see sentinel constants) and the rendered text
// is rewritten afterwards; every other value is a native jinja value.

// Sentinels are Unicode noncharacters, which no chat text carries; input
// that contains one is refused rather than misrendered.
const (
	numOpen  = '\uFDD0' // numOpen + Python text of a number + numClose
	numClose = '\uFDD1'
	lineSep  = '\uFDD2' // stands for U+2028 inside the template
	paraSep  = '\uFDD3' // stands for U+2029 inside the template
	// tojson(indent=N) is compiled as tojson with these separators,
	// followed by indentOpen + N + indentClose (see indentCall).
	indentItem  = '\uFDD4'
	indentKey   = '\uFDD5'
	indentOpen  = '\uFDD6'
	indentClose = '\uFDD7'
)

// reserved are the sentinels: text that carries one is refused.
const reserved = "\uFDD0\uFDD1\uFDD2\uFDD3\uFDD4\uFDD5\uFDD6\uFDD7"

// Template is a compiled chat template. It is immutable after NewTemplate
// and safe for concurrent use.
type Template struct {
	tmpl *jinja.Template
	bos  jinja.Value
	eos  jinja.Value
	// typedContent: the template reads content given as a list of text
	// parts, so a multi-part message is passed as parts, not joined.
	typedContent bool
	// indents: the template calls tojson(indent=N) (see indentCall).
	indents bool
}

// NewTemplate compiles src; bos and eos are the token texts the template may
// read as bos_token / eos_token.
func NewTemplate(src, bos, eos string) (*Template, error) {
	src, indents := rewriteIndent(src)
	tm, err := compile(src)
	if err != nil {
		return nil, err
	}
	t := &Template{tmpl: tm, bos: jinja.NewString(bos), eos: jinja.NewString(eos), indents: indents}
	t.typedContent = t.readsTypedContent()
	return t, nil
}

// compile wraps jinja.Compile, turning a parser panic into an error.
func compile(src string) (tm *jinja.Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("render: template: compile: %v", r)
		}
	}()
	tm, err = jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("render: template: %w", err)
	}
	return tm, nil
}

// probeText marks the probe message of readsTypedContent.
const probeText = "rollout-typed-content-probe"

// readsTypedContent renders one user message whose content is a list of
// text parts and reports whether the template read the parts' text, as
// llama.cpp's template capability probe (common/jinja/caps.cpp) and vLLM's
// content-format detection do: the text must appear, and not as the
// printed list itself (a template that prints content as a string).
func (t *Template) readsTypedContent() bool {
	part := newDict()
	part.AsDict().Set("type", jinja.NewString("text"))
	part.AsDict().Set("text", jinja.NewString(probeText))
	msg := newDict()
	msg.AsDict().Set("role", jinja.NewString("user"))
	msg.AsDict().Set("content", jinja.NewList([]jinja.Value{part}))
	vars := map[string]jinja.Value{
		"messages":              jinja.NewList([]jinja.Value{msg}),
		"add_generation_prompt": jinja.NewBool(false),
		"bos_token":             t.bos,
		"eos_token":             t.eos,
	}
	out, err := t.render(vars)
	return err == nil && strings.Contains(out, probeText) && !strings.Contains(out, "'type'")
}

// Apply renders msgs with tools (the raw JSON array of OpenAI tool objects
// as the request carried it, or nil), the generation prompt when genPrompt,
// and kwargs (chat_template_kwargs) as extra template variables.
func (t *Template) Apply(msgs []openai.ChatCompletionMessage, tools json.RawMessage, genPrompt bool, kwargs map[string]any) (string, error) {
	var c converter
	vars := make(map[string]jinja.Value, 5+len(kwargs))
	for k, v := range kwargs {
		jv, err := c.goValue(v)
		if err != nil {
			return "", fmt.Errorf("render: chat_template_kwargs[%q]: %w", k, err)
		}
		vars[k] = jv
	}
	list, err := c.messages(msgs, t.typedContent)
	if err != nil {
		return "", err
	}
	vars["messages"] = list
	if tv, ok, err := c.tools(tools); err != nil {
		return "", err
	} else if ok {
		vars["tools"] = tv
	}
	vars["add_generation_prompt"] = jinja.NewBool(genPrompt)
	vars["bos_token"] = t.bos
	vars["eos_token"] = t.eos
	out, err := t.render(vars)
	if err != nil {
		return "", err
	}
	if t.indents {
		if out, err = reindent(out); err != nil {
			return "", err
		}
	}
	if c.marked {
		out = unmark(out)
	}
	return out, nil
}

// render runs the template; a panic inside the engine becomes an error.
func (t *Template) render(vars map[string]jinja.Value) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("render: template: %v", r)
		}
	}()
	out, err = t.tmpl.RenderValues(vars)
	if err != nil {
		return "", fmt.Errorf("render: template: %w", err)
	}
	return out, nil
}

// converter turns request data into jinja values; marked records whether a
// sentinel was written, so the output needs unmark.
type converter struct {
	marked bool
}

func newDict() jinja.Value { return jinja.NewDict() }

func setStr(d *jinja.Dict, k, v string, c *converter) error {
	s, err := c.str(v)
	if err != nil {
		return fmt.Errorf("%s: %w", k, err)
	}
	d.Set(k, s)
	return nil
}

// messages converts the conversation.
func (c *converter) messages(msgs []openai.ChatCompletionMessage, typed bool) (jinja.Value, error) {
	items := make([]jinja.Value, 0, len(msgs))
	for i := range msgs {
		v, err := c.message(&msgs[i], typed)
		if err != nil {
			return jinja.Value{}, fmt.Errorf("render: messages[%d]: %w", i, err)
		}
		items = append(items, v)
	}
	return jinja.NewList(items), nil
}

// message converts one message, keys in llama.cpp's order.
func (c *converter) message(m *openai.ChatCompletionMessage, typed bool) (jinja.Value, error) {
	if m.Role == "" {
		return jinja.Value{}, errors.New("role is empty")
	}
	v := newDict()
	d := v.AsDict()
	if err := setStr(d, "role", m.Role, c); err != nil {
		return jinja.Value{}, err
	}
	content, err := c.content(m, typed)
	if err != nil {
		return jinja.Value{}, err
	}
	d.Set("content", content)
	if len(m.ToolCalls) > 0 {
		calls, err := c.toolCalls(m.ToolCalls)
		if err != nil {
			return jinja.Value{}, err
		}
		d.Set("tool_calls", calls)
	}
	for _, f := range [...]struct{ k, v string }{
		{"reasoning_content", m.ReasoningContent}, {"name", m.Name}, {"tool_call_id", m.ToolCallID},
	} {
		if f.v == "" {
			continue
		}
		if err := setStr(d, f.k, f.v, c); err != nil {
			return jinja.Value{}, err
		}
	}
	return v, nil
}

// content is the message's content: a string, or its text parts as a list
// (typed) or joined by newlines.
func (c *converter) content(m *openai.ChatCompletionMessage, typed bool) (jinja.Value, error) {
	if len(m.MultiContent) == 0 {
		return c.str(m.Content)
	}
	if m.Content != "" {
		return jinja.Value{}, errors.New("content and multi-part content are both set")
	}
	texts := make([]string, 0, len(m.MultiContent))
	for j, p := range m.MultiContent {
		if p.Type != openai.ChatMessagePartTypeText {
			return jinja.Value{}, fmt.Errorf("content[%d]: part type %q is not supported (text only)", j, p.Type)
		}
		texts = append(texts, p.Text)
	}
	if !typed {
		return c.str(strings.Join(texts, "\n"))
	}
	parts := make([]jinja.Value, len(texts))
	for j, s := range texts {
		pv := newDict()
		pd := pv.AsDict()
		pd.Set("type", jinja.NewString("text"))
		if err := setStr(pd, "text", s, c); err != nil {
			return jinja.Value{}, fmt.Errorf("content[%d]: %w", j, err)
		}
		parts[j] = pv
	}
	return jinja.NewList(parts), nil
}

// toolCalls converts an assistant's tool calls, arguments parsed.
func (c *converter) toolCalls(calls []openai.ToolCall) (jinja.Value, error) {
	items := make([]jinja.Value, len(calls))
	for j, tc := range calls {
		if tc.Function.Name == "" {
			return jinja.Value{}, fmt.Errorf("tool_calls[%d]: function name is empty", j)
		}
		fv := newDict()
		fd := fv.AsDict()
		if err := setStr(fd, "name", tc.Function.Name, c); err != nil {
			return jinja.Value{}, fmt.Errorf("tool_calls[%d]: %w", j, err)
		}
		args, err := c.arguments(tc.Function.Arguments)
		if err != nil {
			return jinja.Value{}, fmt.Errorf("tool_calls[%d]: arguments: %w", j, err)
		}
		fd.Set("arguments", args)
		cv := newDict()
		cd := cv.AsDict()
		cd.Set("type", jinja.NewString("function"))
		cd.Set("function", fv)
		if tc.ID != "" {
			if err := setStr(cd, "id", tc.ID, c); err != nil {
				return jinja.Value{}, fmt.Errorf("tool_calls[%d]: %w", j, err)
			}
		}
		items[j] = cv
	}
	return jinja.NewList(items), nil
}

// arguments parses a tool call's argument string; text that is not JSON
// stays a string.
func (c *converter) arguments(s string) (jinja.Value, error) {
	if strings.TrimSpace(s) == "" {
		return c.str(s)
	}
	saved := c.marked
	v, err := c.json([]byte(s))
	if err != nil {
		c.marked = saved
		return c.str(s)
	}
	return v, nil
}

// tools converts the request's tools array; ok is false when there are none
// (the template then sees tools undefined).
func (c *converter) tools(raw json.RawMessage) (jinja.Value, bool, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return jinja.Value{}, false, nil
	}
	v, err := c.json(trimmed)
	if err != nil {
		return jinja.Value{}, false, fmt.Errorf("render: tools: %w", err)
	}
	if !v.IsList() {
		return jinja.Value{}, false, errors.New("render: tools: not a JSON array")
	}
	in := v.AsList().Items
	if len(in) == 0 {
		return jinja.Value{}, false, nil
	}
	out := make([]jinja.Value, len(in))
	for i, tv := range in {
		nt, err := normalizeTool(tv)
		if err != nil {
			return jinja.Value{}, false, fmt.Errorf("render: tools[%d]: %w", i, err)
		}
		out[i] = nt
	}
	return jinja.NewList(out), true, nil
}

// normalizeTool rebuilds a tool as llama.cpp does: {type, function: {name,
// description, parameters}}.
func normalizeTool(tv jinja.Value) (jinja.Value, error) {
	if !tv.IsDict() {
		return jinja.Value{}, errors.New("not an object")
	}
	td := tv.AsDict()
	if typ, ok := td.Get("type"); !ok || !typ.IsString() || typ.AsString() != "function" {
		return jinja.Value{}, errors.New(`type must be "function"`)
	}
	fn, ok := td.Get("function")
	if !ok || !fn.IsDict() {
		return jinja.Value{}, errors.New("function is missing or not an object")
	}
	fd := fn.AsDict()
	name, ok := fd.Get("name")
	if !ok || !name.IsString() {
		return jinja.Value{}, errors.New("function.name is missing or not a string")
	}
	desc, ok := fd.Get("description")
	if !ok {
		desc = jinja.NewString("")
	} else if !desc.IsString() {
		return jinja.Value{}, errors.New("function.description is not a string")
	}
	params, ok := fd.Get("parameters")
	if !ok {
		return jinja.Value{}, errors.New("function.parameters is missing")
	}
	nf := newDict()
	nf.AsDict().Set("name", name)
	nf.AsDict().Set("description", desc)
	nf.AsDict().Set("parameters", params)
	nt := newDict()
	nt.AsDict().Set("type", jinja.NewString("function"))
	nt.AsDict().Set("function", nf)
	return nt, nil
}

// str converts a string, swapping U+2028/U+2029 for their sentinels.
func (c *converter) str(s string) (jinja.Value, error) {
	if !strings.ContainsAny(s, "\u2028\u2029"+reserved) {
		return jinja.NewString(s), nil
	}
	if strings.ContainsAny(s, reserved) {
		return jinja.Value{}, errors.New("text contains a Unicode noncharacter U+FDD0..U+FDD7, which the renderer reserves")
	}
	c.marked = true
	return jinja.NewString(strings.NewReplacer("\u2028", string(lineSep), "\u2029", string(paraSep)).Replace(s)), nil
}

// json decodes one JSON document into ordered jinja values.
func (c *converter) json(data []byte) (jinja.Value, error) {
	p := jsonParser{c: c, data: data}
	v, err := p.value(0)
	if err != nil {
		return jinja.Value{}, err
	}
	p.skipSpace()
	if p.pos != len(data) {
		return jinja.Value{}, p.errf("trailing data after JSON value")
	}
	return v, nil
}

// maxDepth bounds JSON nesting.
const maxDepth = 256

// jsonValidUTF8 reports whether s is valid UTF-8.
func jsonValidUTF8(s string) bool { return utf8.ValidString(s) }

// number converts a JSON number: integers that fit int64 and floats whose Go
// rendering equals Python's stay native; others become marked strings.
func (c *converter) number(s string) (jinja.Value, error) {
	if !strings.ContainsAny(s, ".eE") {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return jinja.NewInt(n), nil
		}
		// Python keeps big integers exact.
		return c.markNumber(s), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return jinja.Value{}, fmt.Errorf("JSON number %q: %w", s, err)
	}
	return c.float(f), nil
}

// float is a native float when the engine prints it as Python would.
func (c *converter) float(f float64) jinja.Value {
	py := pyFloat(f)
	if py == strconv.FormatFloat(f, 'g', -1, 64) {
		return jinja.NewFloat(f)
	}
	return c.markNumber(py)
}

func (c *converter) markNumber(text string) jinja.Value {
	c.marked = true
	return jinja.NewString(string(numOpen) + text + string(numClose))
}

// pyFloat formats f as Python's repr (and so json.dumps) does: the shortest
// round-tripping digits, positional for exponents -4..15 with at least one
// fractional digit, else d.ddde±XX.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case math.IsNaN(f):
		return "NaN"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // e.g. -1.2345e+06
	mant, expPart, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expPart)
	if exp < -4 || exp >= 16 {
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		return fmt.Sprintf("%se%s%02d", mant, sign, exp)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsRune(s, '.') {
		s += ".0"
	}
	return s
}

// goValue converts a kwarg value: JSON-like Go data, json.RawMessage kept
// in order, Go maps in sorted key order.
func (c *converter) goValue(v any) (jinja.Value, error) {
	switch x := v.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(x), nil
	case string:
		return c.str(x)
	case int:
		return jinja.NewInt(int64(x)), nil
	case int64:
		return jinja.NewInt(x), nil
	case int32:
		return jinja.NewInt(int64(x)), nil
	case float64:
		return c.float(x), nil
	case float32:
		return c.float(float64(x)), nil
	case json.Number:
		return c.number(string(x))
	case json.RawMessage:
		return c.json(x)
	case []any:
		items := make([]jinja.Value, len(x))
		for i, e := range x {
			jv, err := c.goValue(e)
			if err != nil {
				return jinja.Value{}, err
			}
			items[i] = jv
		}
		return jinja.NewList(items), nil
	case []string:
		items := make([]jinja.Value, len(x))
		for i, e := range x {
			jv, err := c.str(e)
			if err != nil {
				return jinja.Value{}, err
			}
			items[i] = jv
		}
		return jinja.NewList(items), nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := newDict()
		for _, k := range keys {
			jv, err := c.goValue(x[k])
			if err != nil {
				return jinja.Value{}, err
			}
			d.AsDict().Set(k, jv)
		}
		return d, nil
	}
	return jinja.Value{}, fmt.Errorf("unsupported value of type %T", v)
}

// unmark rewrites sentinels in rendered text: a marked number becomes its
// Python text, and loses the quotes tojson put around it (it was a number
// before it was marked); line and paragraph separators are restored.
func unmark(s string) string {
	b := make([]byte, 0, len(s))
	closeLen := utf8.RuneLen(numClose)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch r {
		case numOpen:
			end := strings.IndexRune(s[i:], numClose)
			if end < 0 {
				b = append(b, s[i:i+size]...)
				i += size
				continue
			}
			text := s[i+size : i+end]
			next := i + end + closeLen
			if len(b) > 0 && b[len(b)-1] == '"' && next < len(s) && s[next] == '"' {
				b = b[:len(b)-1]
				next++
			}
			b = append(b, text...)
			i = next
		case lineSep:
			b = utf8.AppendRune(b, '\u2028')
			i += size
		case paraSep:
			b = utf8.AppendRune(b, '\u2029')
			i += size
		default:
			b = append(b, s[i:i+size]...)
			i += size
		}
	}
	return string(b)
}
