package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// Kinds of invalid calls. An invalid call is answered with a tool message
// explaining the problem and is never dispatched.
const (
	InvalidUnknownTool = "unknown_tool"
	InvalidJSON        = "invalid_json"
	InvalidNotObject   = "not_object"
	InvalidSchema      = "schema"
	InvalidParse       = "parse_error" // the parser could not read the call
)

// InvalidCallError is a call the model got wrong.
type InvalidCallError struct {
	Kind   string
	Tool   string
	Detail string
	// Result is the tool message content that explains the error to the
	// model (JSON with an "error" key, Hermes' strings where it has them).
	Result string
}

func (e *InvalidCallError) Error() string {
	return fmt.Sprintf("invalid call to %s (%s): %s", e.Tool, e.Kind, e.Detail)
}

// Call is a validated call ready to execute.
type Call struct {
	ID      string
	Name    string
	RawArgs string
	Args    Args
	tool    *entry
}

// Tool returns the tool the call targets.
func (c *Call) Tool() Tool { return c.tool.tool }

// Paths returns what the call touches, for parallel scheduling.
func (c *Call) Paths() []string {
	if c.tool.tool.Paths == nil {
		return nil
	}
	return c.tool.tool.Paths(c.Args)
}

// loopOnlyTools are interactive-agent tools Hermes answers with a fixed
// error in RL environments.
var loopOnlyTools = map[string]string{
	"memory":         "Memory is not available in RL environments.",
	"session_search": "Session search is not available in RL environments.",
	"delegate_task":  "delegate_task must be handled by the agent loop",
}

// ErrorResult renders {"error": msg}.
func ErrorResult(msg string) string { return marshal(map[string]any{"error": msg}) }

// Prepare decodes, coerces and validates a call's arguments. The error is
// always an *InvalidCallError.
func (s *Set) Prepare(id, name, rawArgs string) (*Call, error) {
	e, ok := s.byName[name]
	if !ok {
		if msg, special := loopOnlyTools[name]; special {
			return nil, &InvalidCallError{Kind: InvalidUnknownTool, Tool: name, Detail: "not available in RL rollouts", Result: ErrorResult(msg)}
		}
		return nil, &InvalidCallError{Kind: InvalidUnknownTool, Tool: name, Detail: "unknown tool",
			Result: ErrorResult(fmt.Sprintf("Unknown tool '%s'. Available tools: %s", name, pyList(s.names)))}
	}
	if strings.TrimSpace(rawArgs) == "" {
		rawArgs = "{}"
	}
	v, err := decodeJSON(rawArgs)
	if err != nil {
		return nil, &InvalidCallError{Kind: InvalidJSON, Tool: name, Detail: err.Error(),
			Result: ErrorResult(fmt.Sprintf("Invalid JSON in tool arguments: %v. Please retry with valid JSON.", err))}
	}
	obj, ok := v.(map[string]any)
	if !ok {
		got := jsonType(v)
		return nil, &InvalidCallError{Kind: InvalidNotObject, Tool: name, Detail: "arguments are a JSON " + got,
			Result: ErrorResult(fmt.Sprintf("Invalid tool arguments: expected a JSON object, got a JSON %s. Please retry with the arguments as a JSON object.", got))}
	}
	coerceObject(obj, e.props)
	if err := e.schema.Validate(obj); err != nil {
		detail := schemaErrorText(err)
		return nil, &InvalidCallError{Kind: InvalidSchema, Tool: name, Detail: detail,
			Result: ErrorResult(fmt.Sprintf("Invalid arguments for %s: %s. Please retry with arguments that match the tool's schema.", name, detail))}
	}
	return &Call{ID: id, Name: name, RawArgs: rawArgs, Args: Args(obj), tool: e}, nil
}

func decodeJSON(s string) (any, error) {
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the JSON value")
	}
	return v, nil
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	default:
		return "object"
	}
}

// pyList renders names like Python's list repr, as Hermes' message does.
func pyList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = "'" + n + "'"
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func schemaErrorText(err error) string {
	lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
	var out []string
	for i, l := range lines {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "- "))
		if i == 0 && strings.HasPrefix(l, "jsonschema validation failed") {
			continue
		}
		if l != "" {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return strings.TrimSpace(err.Error())
	}
	return strings.Join(out, "; ")
}

// coerceObject fixes the usual model mistakes in place, guided by the
// object schema sch: numbers and booleans sent as strings, "null", arrays
// and objects sent as JSON strings, a bare scalar where an array is wanted.
func coerceObject(obj map[string]any, sch map[string]any) {
	props, _ := sch["properties"].(map[string]any)
	for k, v := range obj {
		ps, ok := props[k].(map[string]any)
		if !ok {
			continue
		}
		obj[k] = coerce(v, ps)
	}
}

func schemaTypes(sch map[string]any) []string {
	switch t := sch["type"].(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, x := range t {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

func coerce(v any, sch map[string]any) any {
	types := schemaTypes(sch)
	if len(types) == 0 {
		// Union via anyOf/oneOf: take the first alternative that accepts
		// the value after coercion.
		for _, key := range []string{"anyOf", "oneOf"} {
			alts, _ := sch[key].([]any)
			for _, a := range alts {
				as, ok := a.(map[string]any)
				if !ok {
					continue
				}
				if c, ok := coerceTo(v, as, schemaTypes(as)); ok {
					return c
				}
			}
		}
		return v
	}
	if c, ok := coerceTo(v, sch, types); ok {
		return c
	}
	return v
}

// coerceTo tries the types in order; ok reports that v (possibly changed)
// has one of them.
func coerceTo(v any, sch map[string]any, types []string) (any, bool) {
	for _, t := range types {
		if c, ok := coerceOne(v, sch, t, len(types) == 1 || !contains(types, "string")); ok {
			return c, true
		}
	}
	return v, false
}

func coerceOne(v any, sch map[string]any, t string, wrapScalar bool) (any, bool) {
	switch t {
	case "string":
		_, ok := v.(string)
		return v, ok
	case "integer":
		switch x := v.(type) {
		case json.Number:
			if _, ok := new(big.Int).SetString(x.String(), 10); ok {
				return x, true
			}
			// 3.0 is an integer for JSON schema.
			if f, err := x.Float64(); err == nil && f == float64(int64(f)) {
				return x, true
			}
		case string:
			s := strings.TrimSpace(x)
			if _, ok := new(big.Int).SetString(s, 10); ok {
				return json.Number(s), true
			}
		}
	case "number":
		switch x := v.(type) {
		case json.Number:
			return x, true
		case string:
			s := strings.TrimSpace(x)
			if f, err := strconv.ParseFloat(s, 64); err == nil && !isNaNInf(s) {
				_ = f
				return json.Number(s), true
			}
		}
	case "boolean":
		switch x := v.(type) {
		case bool:
			return x, true
		case string:
			switch strings.ToLower(strings.TrimSpace(x)) {
			case "true":
				return true, true
			case "false":
				return false, true
			}
		}
	case "null":
		if v == nil {
			return nil, true
		}
		if s, ok := v.(string); ok && strings.TrimSpace(s) == "null" {
			return nil, true
		}
	case "array":
		items, _ := sch["items"].(map[string]any)
		switch x := v.(type) {
		case []any:
			return coerceItems(x, items), true
		case string:
			if d, err := decodeJSON(x); err == nil {
				if arr, ok := d.([]any); ok {
					return coerceItems(arr, items), true
				}
			}
			if wrapScalar {
				return coerceItems([]any{x}, items), true
			}
		case nil:
		case map[string]any:
			if wrapScalar {
				return coerceItems([]any{x}, items), true
			}
		default:
			if wrapScalar {
				return coerceItems([]any{x}, items), true
			}
		}
	case "object":
		switch x := v.(type) {
		case map[string]any:
			coerceObject(x, sch)
			return x, true
		case string:
			if d, err := decodeJSON(x); err == nil {
				if obj, ok := d.(map[string]any); ok {
					coerceObject(obj, sch)
					return obj, true
				}
			}
		}
	}
	return v, false
}

func coerceItems(arr []any, items map[string]any) []any {
	if items == nil {
		return arr
	}
	for i := range arr {
		arr[i] = coerce(arr[i], items)
	}
	return arr
}

func isNaNInf(s string) bool {
	l := strings.ToLower(s)
	return strings.Contains(l, "nan") || strings.Contains(l, "inf")
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// Argument accessors for handlers. The schema has been validated, so a
// wrong type cannot occur for declared properties; missing keys yield def.

// String returns args[k] as a string.
func (a Args) String(k, def string) string {
	if s, ok := a[k].(string); ok {
		return s
	}
	return def
}

// Int returns args[k] as an int.
func (a Args) Int(k string, def int) int {
	switch x := a[k].(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return int(i)
		}
		if f, err := x.Float64(); err == nil {
			return int(f)
		}
	case float64:
		return int(x)
	case int:
		return x
	}
	return def
}

// Bool returns args[k] as a bool.
func (a Args) Bool(k string, def bool) bool {
	if b, ok := a[k].(bool); ok {
		return b
	}
	return def
}

// Has reports whether k is present and not null.
func (a Args) Has(k string) bool { return a[k] != nil }

func marshal(v any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only unsupported values (channels, NaN) fail; handlers never
		// produce them, but the model still deserves valid JSON.
		return `{"error":"internal: could not encode tool result"}`
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

// sortedKeys is used for deterministic output.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
