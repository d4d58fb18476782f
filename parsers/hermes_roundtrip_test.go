package parsers

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// Round trip: calls generated at random are rendered in each family's
// format after some prose, parsed back, and must come out identical (name,
// arguments as compact JSON in the same key order, content = the prose).
// This covers the space between the hand-written golden cases.

type rtCall struct {
	name string
	keys []string
	vals []any
}

func (c rtCall) argsJSON() string {
	var a argsBuilder
	for i, k := range c.keys {
		a.add(k, mustJSON(c.vals[i]))
	}
	return a.String()
}

// valueText is how an XML family writes a value: strings raw, the rest as JSON.
func valueText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return string(mustJSON(v))
}

var rtStrings = []string{"ls -la", "héllo wörld", "東京", "quote \" and back\\slash", "two\nlines", "tab\there", "<b>bold</b> & co", "emoji 🚀", "{not json}", "123", "true", "null", "a,b;c"}

func rtValue(r *rand.Rand, depth int) any {
	switch k := r.IntN(7); {
	case k == 0 && depth < 2:
		return map[string]any{"k": rtValue(r, depth+1), "n": r.IntN(100)}
	case k == 1 && depth < 2:
		return []any{rtValue(r, depth+1), r.IntN(5)}
	case k == 2:
		return r.IntN(100000) - 500
	case k == 3:
		return float64(r.IntN(1000)) + 0.25
	case k == 4:
		return r.IntN(2) == 0
	default:
		return rtStrings[r.IntN(len(rtStrings))]
	}
}

func rtCalls(r *rand.Rand) []rtCall {
	n := 1 + r.IntN(4)
	calls := make([]rtCall, n)
	for i := range calls {
		c := rtCall{name: fmt.Sprintf("tool_%d", i)} // one schema per call: types never conflict
		for j := 0; j < r.IntN(5); j++ {
			c.keys = append(c.keys, fmt.Sprintf("p%d", j))
			c.vals = append(c.vals, rtValue(r, 0))
		}
		calls[i] = c
	}
	return calls
}

// rtTools types every parameter of every generated call with the JSON type
// of its value, as a real tool schema would.
func rtTools(calls []rtCall) []ToolSchema {
	props := map[string]map[string]any{}
	for _, c := range calls {
		if props[c.name] == nil {
			props[c.name] = map[string]any{}
		}
		for i, k := range c.keys {
			t := "string"
			switch c.vals[i].(type) {
			case map[string]any:
				t = "object"
			case []any:
				t = "array"
			case int:
				t = "integer"
			case float64:
				t = "number"
			case bool:
				t = "boolean"
			}
			props[c.name][k] = map[string]any{"type": t}
		}
	}
	var tools []ToolSchema
	for name, p := range props {
		params, _ := json.Marshal(map[string]any{"type": "object", "properties": p})
		tools = append(tools, ToolSchema{Name: name, Parameters: params})
	}
	return tools
}

func jsonCall(c rtCall, argsKey string) string {
	return `{"name": ` + strings.TrimSpace(string(mustJSON(c.name))) + `, "` + argsKey + `": ` + c.argsJSON() + `}`
}

// mustJSON encodes like the models do (no HTML escaping of <, >, &).
func mustJSON(v any) []byte {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return []byte(strings.TrimSuffix(b.String(), "\n"))
}

var rtFormats = map[string]func(calls []rtCall) string{
	"hermes": func(calls []rtCall) string {
		var b strings.Builder
		for _, c := range calls {
			b.WriteString("<tool_call>\n" + jsonCall(c, "arguments") + "\n</tool_call>\n")
		}
		return b.String()
	},
	"longcat": func(calls []rtCall) string {
		var b strings.Builder
		for _, c := range calls {
			b.WriteString("<longcat_tool_call>" + jsonCall(c, "arguments") + "</longcat_tool_call>")
		}
		return b.String()
	},
	"mistral": func(calls []rtCall) string {
		var b strings.Builder
		for _, c := range calls {
			b.WriteString("[TOOL_CALLS]" + c.name + c.argsJSON())
		}
		return b.String()
	},
	"llama3_json": func(calls []rtCall) string {
		parts := make([]string, len(calls))
		for i, c := range calls {
			parts[i] = jsonCall(c, "parameters")
		}
		return "<|python_tag|>" + strings.Join(parts, "; ")
	},
	"deepseek_v3": func(calls []rtCall) string {
		var b strings.Builder
		b.WriteString(dsCallsBegin)
		for _, c := range calls {
			b.WriteString(dsCallBegin + "function" + dsSep + c.name + "\n```json\n" + c.argsJSON() + "\n```" + dsCallEnd)
		}
		return b.String() + dsCallsEnd
	},
	"deepseek_v31": func(calls []rtCall) string {
		var b strings.Builder
		b.WriteString(dsCallsBegin)
		for _, c := range calls {
			b.WriteString(dsCallBegin + c.name + dsSep + c.argsJSON() + dsCallEnd)
		}
		return b.String() + dsCallsEnd
	},
	"kimi_k2": func(calls []rtCall) string {
		var b strings.Builder
		b.WriteString(kimiSectionBegin)
		for i, c := range calls {
			b.WriteString(fmt.Sprintf("%sfunctions.%s:%d%s%s%s", kimiCallBegin, c.name, i, kimiArgBegin, c.argsJSON(), kimiCallEnd))
		}
		return b.String() + "<|tool_calls_section_end|>"
	},
	"glm47": func(calls []rtCall) string {
		var b strings.Builder
		for _, c := range calls {
			b.WriteString("<tool_call>" + c.name + "\n")
			for i, k := range c.keys {
				b.WriteString("<arg_key>" + k + "</arg_key>\n<arg_value>" + valueText(c.vals[i]) + "</arg_value>\n")
			}
			b.WriteString("</tool_call>")
		}
		return b.String()
	},
	"qwen3_coder": func(calls []rtCall) string {
		var b strings.Builder
		for _, c := range calls {
			b.WriteString("<tool_call>\n<function=" + c.name + ">\n")
			for i, k := range c.keys {
				b.WriteString("<parameter=" + k + ">\n" + valueText(c.vals[i]) + "\n</parameter>\n")
			}
			b.WriteString("</function>\n</tool_call>\n")
		}
		return b.String()
	},
}

func TestRoundTrip(t *testing.T) {
	proses := []string{"", "Let me check that.", "Plan: read the file, then run the tests — ü.\n\nFirst step:"}
	for family, format := range rtFormats {
		t.Run(family, func(t *testing.T) {
			p, err := Get(family)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, uint64(len(family))))
			for iter := 0; iter < 300; iter++ {
				calls := rtCalls(r)
				prose := proses[r.IntN(len(proses))]
				text := prose + "\n" + format(calls)
				got := p.Parse(text, rtTools(calls))
				if len(got.Errors) > 0 || len(got.ToolCalls) != len(calls) {
					t.Fatalf("input %q:\ngot %d calls, errors %+v", text, len(got.ToolCalls), got.Errors)
				}
				for i, c := range calls {
					if got.ToolCalls[i].Name != c.name || got.ToolCalls[i].Arguments != c.argsJSON() {
						t.Fatalf("input %q:\ncall %d = %s %s, want %s %s", text, i, got.ToolCalls[i].Name, got.ToolCalls[i].Arguments, c.name, c.argsJSON())
					}
				}
				if want := textPtr(prose); (want == nil) != (got.Content == nil) || want != nil && *want != *got.Content {
					t.Fatalf("input %q: content = %v, want %q", text, got.Content, prose)
				}
			}
		})
	}
}

// TestRoundTripTruncated cuts each rendered output at a random point inside
// its last call, as max_tokens would: the calls before it must come back
// exactly, and the cut one is either reported or — when the cut fell after
// its last significant byte — returned intact.
func TestRoundTripTruncated(t *testing.T) {
	for family, format := range rtFormats {
		t.Run(family, func(t *testing.T) {
			p, err := Get(family)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(2, uint64(len(family))))
			for iter := 0; iter < 300; iter++ {
				calls := rtCalls(r)
				n := len(calls)
				full := "Intro.\n" + format(calls)
				before := "Intro.\n" + format(calls[:n-1])
				common := 0
				for common < len(before) && full[common] == before[common] {
					common++
				}
				if common >= len(full)-1 {
					continue
				}
				cut := common + 1 + r.IntN(len(full)-common-1)
				text := full[:cut]
				got := p.Parse(text, rtTools(calls))
				if len(got.ToolCalls) < n-1 || len(got.ToolCalls) > n || len(got.Errors) > 1 {
					t.Fatalf("input %q:\ngot %d calls (want %d or %d), errors %+v", text, len(got.ToolCalls), n-1, n, got.Errors)
				}
				for i, c := range calls[:len(got.ToolCalls)] {
					if got.ToolCalls[i].Name != c.name || got.ToolCalls[i].Arguments != c.argsJSON() {
						t.Fatalf("input %q:\ncall %d = %s %s, want %s %s", text, i, got.ToolCalls[i].Name, got.ToolCalls[i].Arguments, c.name, c.argsJSON())
					}
				}
				// A cut inside the first marker leaves a partial marker, which is
				// text; otherwise the content is the prose alone.
				recognised := len(got.ToolCalls)+len(got.Errors) > 0
				if got.Content == nil || recognised && *got.Content != "Intro." || !strings.HasPrefix(*got.Content, "Intro.") {
					t.Fatalf("input %q: content = %q", text, pDeref(got.Content))
				}
			}
		})
	}
}

func pDeref(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}
