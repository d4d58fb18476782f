package envs

import (
	"encoding/json"
	"fmt"

	"github.com/invopop/jsonschema"
	"go.yaml.in/yaml/v3"
)

// Configurable is implemented by envs whose env_config is a typed struct;
// Config returns it with the env's current values (the defaults for an env
// built without config).
type Configurable interface {
	Config() any
}

// DescribeConfig returns the JSON schema of an env's env_config and its
// default values as YAML (empty for envs without configuration).
func DescribeConfig(e Env) (schemaJSON, defaultsYAML string, err error) {
	c, ok := e.(Configurable)
	if !ok {
		return "{}", "", nil
	}
	cfg := c.Config()
	r := &jsonschema.Reflector{FieldNameTag: "yaml", DoNotReference: true, AllowAdditionalProperties: false, RequiredFromJSONSchemaTags: true}
	s, err := json.MarshalIndent(r.Reflect(cfg), "", "  ")
	if err != nil {
		return "", "", fmt.Errorf("schema of %s: %w", e.Name(), err)
	}
	y, err := yaml.Marshal(cfg)
	if err != nil {
		return "", "", fmt.Errorf("defaults of %s: %w", e.Name(), err)
	}
	return string(s), string(y), nil
}

// Config implements Configurable.
func (e *TerminalTasks) Config() any { return e.cfg }

// Config implements Configurable.
func (e *SWETests) Config() any { return e.cfg }

// Config implements Configurable.
func (e *MathPython) Config() any { return e.cfg }

// Config implements Configurable.
func (e *ToolCallMatch) Config() any { return e.cfg }

// Config implements Configurable.
func (e *TerminalBench) Config() any { return e.cfg }

// Config implements Configurable.
func (e *YAMLEnv) Config() any { return e.spec }
