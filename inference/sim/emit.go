package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// pyJSON serialises v the way Python's json.dumps(v, ensure_ascii=False)
// does with sorted keys: ", " and ": " separators, non-ASCII kept. Models
// trained on such templates emit exactly this spelling, and vLLM's parsers
// re-serialise with it, so the simulator's output round-trips.
func pyJSON(v any) string {
	var b strings.Builder
	writePyJSON(&b, v)
	return b.String()
}

func writePyJSON(b *strings.Builder, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writeJSONString(b, k)
			b.WriteString(": ")
			writePyJSON(b, x[k])
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			writePyJSON(b, e)
		}
		b.WriteByte(']')
	case string:
		writeJSONString(b, x)
	case json.Number:
		b.WriteString(x.String())
	case float64:
		if x == float64(int64(x)) && x < 1e15 && x > -1e15 {
			b.WriteString(strconv.FormatInt(int64(x), 10))
		} else {
			b.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
		}
	case bool:
		b.WriteString(strconv.FormatBool(x))
	default:
		// YAML and Go callers hand in ints, typed slices and maps: normalise
		// through encoding/json once.
		raw, err := json.Marshal(x)
		if err != nil {
			writeJSONString(b, fmt.Sprint(x))
			return
		}
		writePyJSON(b, decodeJSON(raw))
	}
}

func writeJSONString(b *strings.Builder, s string) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	b.Write(bytes.TrimRight(buf.Bytes(), "\n"))
}

// decodeJSON decodes raw into generic values with exact numbers; invalid
// JSON yields nil.
func decodeJSON(raw []byte) any {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil
	}
	return v
}

// emitCall is one call as a family writes it. Args is the decoded argument
// object; RawArgs is used verbatim when the arguments are not a JSON object
// (history replayed from a client may hold anything).
type emitCall struct {
	ID      string // the history's tool-call id (templates that render or check it)
	Name    string
	Args    map[string]any
	RawArgs string
}

func (c emitCall) argsJSON() string {
	if c.Args == nil && c.RawArgs != "" {
		return c.RawArgs
	}
	if c.Args == nil {
		return "{}"
	}
	return pyJSON(c.Args)
}

// scalarText renders an XML-format argument value: strings raw, everything
// else as JSON, as the GLM and Qwen3-Coder templates do.
func scalarText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return pyJSON(v)
}

func sortedArgKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// emitCalls writes calls in family's native syntax. firstIndex is the number
// of calls earlier in the conversation (Kimi K2 numbers calls globally).
func emitCalls(family string, calls []emitCall, firstIndex int) string {
	if len(calls) == 0 {
		return ""
	}
	var b strings.Builder
	switch family {
	case "hermes":
		for i, c := range calls {
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString("<tool_call>\n{\"name\": ")
			writeJSONString(&b, c.Name)
			b.WriteString(", \"arguments\": ")
			b.WriteString(c.argsJSON())
			b.WriteString("}\n</tool_call>")
		}
	case "qwen3_coder":
		for i, c := range calls {
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString("<tool_call>\n<function=" + c.Name + ">\n")
			for _, k := range sortedArgKeys(c.Args) {
				b.WriteString("<parameter=" + k + ">\n" + scalarText(c.Args[k]) + "\n</parameter>\n")
			}
			b.WriteString("</function>\n</tool_call>")
		}
	case "glm45":
		for i, c := range calls {
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString("<tool_call>" + c.Name + "\n")
			for _, k := range sortedArgKeys(c.Args) {
				b.WriteString("<arg_key>" + k + "</arg_key>\n<arg_value>" + scalarText(c.Args[k]) + "</arg_value>\n")
			}
			b.WriteString("</tool_call>")
		}
	case "llama3_json":
		for i, c := range calls {
			if i > 0 {
				b.WriteString("; ")
			}
			b.WriteString("{\"name\": ")
			writeJSONString(&b, c.Name)
			b.WriteString(", \"parameters\": " + c.argsJSON() + "}")
		}
	case "mistral":
		b.WriteString("[TOOL_CALLS][")
		for i, c := range calls {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("{\"name\": ")
			writeJSONString(&b, c.Name)
			b.WriteString(", \"arguments\": " + c.argsJSON() + "}")
		}
		b.WriteString("]")
	case "deepseek_v3":
		b.WriteString("<｜tool▁calls▁begin｜>")
		for _, c := range calls {
			// vLLM's deepseek_v3 regex needs the arguments on one line.
			b.WriteString("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + c.Name + "\n```json\n" + c.argsJSON() + "\n```<｜tool▁call▁end｜>")
		}
		b.WriteString("<｜tool▁calls▁end｜>")
	case "kimi_k2":
		b.WriteString("<|tool_calls_section_begin|>")
		for i, c := range calls {
			fmt.Fprintf(&b, "<|tool_call_begin|>functions.%s:%d<|tool_call_argument_begin|>%s<|tool_call_end|>", c.Name, firstIndex+i, c.argsJSON())
		}
		b.WriteString("<|tool_calls_section_end|>")
	}
	return b.String()
}

// joinContentCalls puts content before the calls with the separator the
// family's models use.
func joinContentCalls(family, content, calls string) string {
	switch {
	case calls == "":
		return content
	case content == "":
		return calls
	case family == "hermes" || family == "qwen3_coder" || family == "glm45":
		return content + "\n" + calls
	default:
		return content + calls
	}
}
