package envs

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"

	reg "github.com/rollout-rl/rollout/internal/util/registry"
)

// ErrConfig is wrapped by every invalid env configuration.
var ErrConfig = errors.New("invalid env config")

// Factory builds an env from its YAML config node (nil for defaults).
// Factories decode strictly: unknown keys are errors.
type Factory func(cfg *yaml.Node) (Env, error)

var registry = reg.New[Factory]("env")

// Register makes an env available by name. It panics on duplicates:
// registration happens at init.
func Register(name string, f Factory) { registry.Register(name, f) }

// Names lists the registered envs, sorted.
func Names() []string { return registry.Names() }

// New builds the env called name with cfg.
func New(name string, cfg *yaml.Node) (Env, error) {
	f, ok := registry.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown env %q; known envs: %s", name, strings.Join(Names(), ", "))
	}
	e, err := f(cfg)
	if err != nil {
		return nil, fmt.Errorf("env %s: %w", name, err)
	}
	return e, nil
}

// decodeStrict fills out from node, refusing unknown keys with the line
// they are on; a nil node leaves out untouched (the defaults).
func decodeStrict(node *yaml.Node, out any) error {
	if node == nil || node.Kind == 0 {
		return nil
	}
	if err := checkKnown(node, reflect.TypeOf(out)); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if err := node.Decode(out); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return nil
}

// checkKnown reports the first mapping key in node that has no field in t
// (yaml.v3 checks KnownFields only when decoding from text, and a config
// embedded in a larger file arrives as a node).
func checkKnown(node *yaml.Node, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if node.Kind == yaml.AliasNode {
		node = node.Alias
	}
	switch {
	case t.Kind() == reflect.Struct && node.Kind == yaml.MappingNode:
		fields := yamlFields(t)
		for i := 0; i+1 < len(node.Content); i += 2 {
			k := node.Content[i]
			ft, ok := fields[k.Value]
			if !ok {
				return fmt.Errorf("line %d: field %s not found in type %s", k.Line, k.Value, t)
			}
			if err := checkKnown(node.Content[i+1], ft); err != nil {
				return err
			}
		}
	case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && node.Kind == yaml.SequenceNode:
		for _, c := range node.Content {
			if err := checkKnown(c, t.Elem()); err != nil {
				return err
			}
		}
	case t.Kind() == reflect.Map && node.Kind == yaml.MappingNode:
		for i := 1; i < len(node.Content); i += 2 {
			if err := checkKnown(node.Content[i], t.Elem()); err != nil {
				return err
			}
		}
	}
	return nil
}

// yamlFields maps yaml key names to field types, following inline fields.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			for k, v := range yamlFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}
