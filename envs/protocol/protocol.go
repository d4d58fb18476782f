// Package protocol is the contract between rollout and the environment
// protocols of the field (OpenEnv, NeMo Gym resources servers): an env
// server reached through an Endpoint, one Session per rollout that lists
// the server's tools, calls them (a step), reports per-step rewards and
// the end of the episode, scores the finished episode, and closes. Each
// protocol lives in its own package beside its siblings (envs/openenv,
// envs/nemogym) and registers a Factory here; envs/protocol/builtin is
// the one list of the built-ins. The package knows neither sandboxes nor
// rollouts: envs binds a session to a rollout, the runner drives it.
package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	openai "github.com/sashabaranov/go-openai"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/internal/util/registry"
)

// ErrViolation is wrapped by every answer of an env server that breaks its
// protocol (bad JSON, an unexpected message, a missing field). Callers
// also see it wrapped in the sandbox class the envs adapter adds: a
// misbehaving env server is an infrastructure failure, never the model's.
var ErrViolation = errors.New("env server protocol violation")

// ErrUnreachable is wrapped by every failure to reach an env server or to
// hear back from it in time (refused, reset, closed mid-episode, past the
// call timeout, at capacity).
var ErrUnreachable = errors.New("env server unreachable")

// ErrConfig is wrapped by an invalid protocol configuration.
var ErrConfig = errors.New("invalid env protocol config")

// Endpoint is how a session reaches its env server: an HTTP client whose
// transport dials it (through the rollout's sandbox tunnel, or the
// network for a server given by URL) and the server's base URL.
type Endpoint struct {
	Client *http.Client
	// BaseURL is the server's root, e.g. "http://127.0.0.1:8000" (no
	// trailing slash). For a server in the sandbox the host part is only
	// a name: the client's transport dials the tunnel whatever it says.
	BaseURL string
	// Name says which server this is in errors ("openenv server in
	// sandbox d1f… (port 8000)", "nemo_gym server http://…").
	Name string
}

// Tool is one tool the env server offers the model.
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage // a JSON Schema object
}

// Step is the server's answer to one tool call.
type Step struct {
	// Text is the tool result the model reads (the observation).
	Text string
	// Failed marks Text as a tool error the model caused (bad arguments,
	// a tool that refused): data, not an infrastructure failure.
	Failed bool
	// Reward is the step's reward when the server gave one.
	Reward *float64
	// Done says the episode is over (OpenEnv's done).
	Done bool
}

// Score is a finished episode's reward and its named components.
type Score struct {
	Value      float64
	Components map[string]float64
}

// Item is what a session is opened for: the dataset item's fields, the
// rollout's id (an episode id) and the conversation the model starts from.
type Item struct {
	Data      map[string]any
	RolloutID string
}

// Session is one rollout's episode on an env server. Calls come from one
// goroutine at a time. Errors wrap ErrViolation or ErrUnreachable (or a
// context error) and name the server.
type Session interface {
	// Opening is what the server said when the episode began (OpenEnv's
	// reset observation), shown to the model after the task's messages;
	// "" when it said nothing the model should read.
	Opening() string
	// Tools are the tools the server offers this episode.
	Tools() []Tool
	// Call runs one tool call (a step).
	Call(ctx context.Context, name string, args json.RawMessage) (Step, error)
	// Score scores the finished episode; messages is its transcript and
	// steps the answers Call gave, in order.
	Score(ctx context.Context, messages []openai.ChatCompletionMessage, steps []Step) (Score, error)
	// Close ends the episode on the server. It is idempotent.
	Close(ctx context.Context) error
}

// Protocol opens sessions on env servers of one protocol.
type Protocol interface {
	Name() string
	// Open starts one episode for it on the server at ep.
	Open(ctx context.Context, ep Endpoint, it Item) (Session, error)
}

// Prompter is implemented by protocols whose items carry their own
// opening messages (a NeMo Gym row's responses_create_params.input): the
// env then needs no prompt template.
type Prompter interface {
	Messages(data map[string]any) ([]openai.ChatCompletionMessage, error)
}

// Factory builds a protocol from its options node (nil: the defaults),
// decoding strictly.
type Factory func(options *yaml.Node) (Protocol, error)

var factories = registry.New[Factory]("env protocol")

// Register makes a protocol available by name; it panics on a duplicate
// (registration happens at init).
func Register(name string, f Factory) { factories.Register(name, f) }

// Names lists the registered protocols, sorted.
func Names() []string { return factories.Names() }

// New builds the protocol called name.
func New(name string, options *yaml.Node) (Protocol, error) {
	f, ok := factories.Lookup(name)
	if !ok {
		known := strings.Join(Names(), ", ")
		if known == "" {
			known = "none linked into this binary"
		}
		return nil, fmt.Errorf("%w: unknown env protocol %q (known: %s)", ErrConfig, name, known)
	}
	p, err := f(options)
	if err != nil {
		return nil, fmt.Errorf("env protocol %s: %w", name, err)
	}
	return p, nil
}

// Violationf is an ErrViolation naming the server.
func Violationf(ep Endpoint, format string, a ...any) error {
	return fmt.Errorf("%s: %w: %s", ep.Name, ErrViolation, fmt.Sprintf(format, a...))
}

// Unreachablef is an ErrUnreachable naming the server.
func Unreachablef(ep Endpoint, format string, a ...any) error {
	return fmt.Errorf("%s: %w: %s", ep.Name, ErrUnreachable, fmt.Sprintf(format, a...))
}
