package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/parsers"
)

// Class says which calls of one turn may run at the same time.
type Class int

const (
	// Exclusive calls run alone, in call order (terminal, process, todo and
	// any user tool that does not say otherwise).
	Exclusive Class = iota
	// ReadOnly calls change nothing; they may run together with each other
	// and with path-scoped calls on other paths.
	ReadOnly
	// PathScoped calls change only the paths returned by Tool.Paths.
	PathScoped
)

func (c Class) String() string {
	switch c {
	case ReadOnly:
		return "read-only"
	case PathScoped:
		return "path-scoped"
	default:
		return "exclusive"
	}
}

// Args are a call's arguments after decoding (numbers as json.Number),
// coercion and schema validation.
type Args map[string]any

// Handler runs one call. The returned string is the tool message content
// (JSON for the built-ins). A returned error means the call could not run:
// errors wrapping sandbox.ErrUnavailable/ErrClosed or a context error end
// the episode; any other error is reported to the model as
// "Tool execution failed: ...".
type Handler func(ctx context.Context, rt *Runtime, args Args) (string, error)

// Tool describes one tool.
type Tool struct {
	Name        string
	Description string
	// Parameters is the JSON schema of the arguments (an object schema).
	Parameters json.RawMessage
	Toolset    string
	Class      Class
	// Paths lists what a PathScoped (or ReadOnly) call touches; used only to
	// decide whether the calls of a turn may run in parallel.
	Paths func(args Args) []string
	// MaxResultChars is the per-result budget threshold: 0 = the budget's
	// default, negative = never persisted (read_file, to avoid
	// persist→read→persist loops).
	MaxResultChars int
	Handler        Handler
}

type entry struct {
	tool   Tool
	schema *jsonschema.Schema
	props  map[string]any // decoded schema, for coercion
}

// Registry holds tools by name. Safe for concurrent use.
type Registry struct {
	mu    sync.RWMutex
	tools map[string]*entry
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{tools: map[string]*entry{}} }

// Default returns a registry with every built-in tool registered.
func Default() *Registry {
	r := NewRegistry()
	for _, t := range Builtins() {
		if err := r.Register(t); err != nil {
			panic("tools: built-in " + t.Name + ": " + err.Error())
		}
	}
	return r
}

// Register adds a tool. It fails on a duplicate or empty name, a missing
// handler or toolset, or a schema that does not compile.
func (r *Registry) Register(t Tool) error {
	if t.Name == "" || strings.ContainsAny(t.Name, " \t\n") {
		return fmt.Errorf("register tool: invalid name %q", t.Name)
	}
	if t.Handler == nil {
		return fmt.Errorf("register tool %s: no handler", t.Name)
	}
	if t.Toolset == "" {
		return fmt.Errorf("register tool %s: no toolset", t.Name)
	}
	if t.Class == PathScoped && t.Paths == nil {
		return fmt.Errorf("register tool %s: path-scoped tools need a Paths function", t.Name)
	}
	if len(t.Parameters) == 0 {
		t.Parameters = json.RawMessage(`{"type":"object","properties":{}}`)
	}
	e, err := compileEntry(t)
	if err != nil {
		return fmt.Errorf("register tool %s: %w", t.Name, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.tools[t.Name]; dup {
		return fmt.Errorf("register tool %s: already registered", t.Name)
	}
	r.tools[t.Name] = e
	return nil
}

func compileEntry(t Tool) (*entry, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(t.Parameters))
	if err != nil {
		return nil, fmt.Errorf("parse schema: %w", err)
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return nil, errors.New("schema is not a JSON object")
	}
	c := jsonschema.NewCompiler()
	url := "tool://" + t.Name + ".json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("add schema: %w", err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("compile schema: %w", err)
	}
	return &entry{tool: t, schema: sch, props: obj}, nil
}

// Names lists the registered tools, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.tools))
	for n := range r.tools {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Toolsets lists the toolsets that have at least one tool, sorted.
func (r *Registry) Toolsets() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	seen := map[string]bool{}
	for _, e := range r.tools {
		seen[e.tool.Toolset] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Tool returns the registered tool called name.
func (r *Registry) Tool(name string) (Tool, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.tools[name]
	if !ok {
		return Tool{}, false
	}
	return e.tool, true
}

// Resolve builds the tool set of a rollout. enabled and disabled hold
// toolset names or tool names; an empty enabled list means every
// registered tool. Disabled entries are applied last, so they win. An
// unknown name is an error (tools never vanish silently).
func (r *Registry) Resolve(enabled, disabled []string) (*Set, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	pick := map[string]bool{}
	expand := func(name string) ([]string, error) {
		// Toolset names win over tool names ("terminal" is both).
		var out []string
		for n, e := range r.tools {
			if e.tool.Toolset == name {
				out = append(out, n)
			}
		}
		if len(out) > 0 {
			return out, nil
		}
		if _, ok := r.tools[name]; ok {
			return []string{name}, nil
		}
		return nil, fmt.Errorf("unknown tool or toolset %q", name)
	}
	if len(enabled) == 0 {
		for n := range r.tools {
			pick[n] = true
		}
	}
	for _, name := range enabled {
		names, err := expand(name)
		if err != nil {
			return nil, fmt.Errorf("enable: %w", err)
		}
		for _, n := range names {
			pick[n] = true
		}
	}
	for _, name := range disabled {
		names, err := expand(name)
		if err != nil {
			return nil, fmt.Errorf("disable: %w", err)
		}
		for _, n := range names {
			delete(pick, n)
		}
	}
	s := &Set{byName: map[string]*entry{}}
	for n := range pick {
		s.byName[n] = r.tools[n]
		s.names = append(s.names, n)
	}
	sort.Strings(s.names)
	return s, nil
}

// Set is the immutable tool set of one rollout (or one group).
type Set struct {
	names  []string
	byName map[string]*entry
}

// Names lists the tools of the set, sorted.
func (s *Set) Names() []string { return append([]string(nil), s.names...) }

// Len is the number of tools.
func (s *Set) Len() int { return len(s.names) }

// Tool returns the tool called name if the set has it.
func (s *Set) Tool(name string) (Tool, bool) {
	e, ok := s.byName[name]
	if !ok {
		return Tool{}, false
	}
	return e.tool, true
}

// OpenAI returns the set as an OpenAI `tools` array, sorted by name.
func (s *Set) OpenAI() []openai.Tool {
	out := make([]openai.Tool, 0, len(s.names))
	for _, n := range s.names {
		t := s.byName[n].tool
		out = append(out, openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
			Name: t.Name, Description: t.Description, Parameters: t.Parameters,
		}})
	}
	return out
}

// Schemas returns the set in the form tool-call parsers take.
func (s *Set) Schemas() []parsers.ToolSchema {
	out := make([]parsers.ToolSchema, 0, len(s.names))
	for _, n := range s.names {
		t := s.byName[n].tool
		out = append(out, parsers.ToolSchema{Name: t.Name, Description: t.Description, Parameters: t.Parameters})
	}
	return out
}
