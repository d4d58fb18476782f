package envs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"sync"
	"text/template"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/util/secrets"
)

// Responsive is implemented by envs that answer the model turn by turn: a
// user simulator, a game, a tutor (docs/env-feedback.md). The answer's
// contract (agentloop.Feedback, agentloop.Responder) belongs to the agent
// loop, its consumer. Responder returns the responder of one rollout of
// item, or nil when the env has none (a YAML env without a responder
// block). Envs are shared by concurrent rollouts: what the returned
// responder keeps between turns is its own.
type Responsive interface {
	Responder(item datasets.Item) agentloop.Responder
}

// itemResponder is an env's answer to a turn of any item; forItem binds it
// to one rollout's item.
type itemResponder interface {
	respond(ctx context.Context, item datasets.Item, turn int, transcript []openai.ChatCompletionMessage) (agentloop.Feedback, error)
}

// forItem is r's responder for one rollout of it.
func forItem(r itemResponder, it datasets.Item) agentloop.Responder {
	return agentloop.ResponderFunc(func(ctx context.Context, turn int, transcript []openai.ChatCompletionMessage) (agentloop.Feedback, error) {
		return r.respond(ctx, it, turn, transcript)
	})
}

// lastAssistant is the content of the last assistant message.
func lastAssistant(msgs []openai.ChatCompletionMessage) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == openai.ChatMessageRoleAssistant {
			return msgs[i].Content
		}
	}
	return ""
}

// ResponderOf returns e's responder for one rollout of it, or nil when e
// has none.
func ResponderOf(e Env, it datasets.Item) agentloop.Responder {
	if r, ok := e.(Responsive); ok {
		return r.Responder(it)
	}
	return nil
}

// toolTurn reports whether the turn just played called tools (the
// conversation ends with their results): the model has not replied to
// the user yet.
func toolTurn(transcript []openai.ChatCompletionMessage) bool {
	return len(transcript) > 0 && transcript[len(transcript)-1].Role == openai.ChatMessageRoleTool
}

// ---- scripted responder (YAML) ----

// ScriptedRule is one rule of a scripted responder: when Match (a Go
// regexp, a template over the item's fields) matches the last assistant
// message, answer Reply (a template; it may use {{.match}}, the matched
// text, and the item's fields), optionally end the episode and give a turn
// reward. The first matching rule wins. Rules answer the model's replies:
// a turn that called tools gets no answer (the model is still working).
type ScriptedRule struct {
	Match  string   `yaml:"match" json:"match"`
	Reply  string   `yaml:"reply,omitempty" json:"reply,omitempty"`
	Done   bool     `yaml:"done,omitempty" json:"done,omitempty"`
	Reward *float64 `yaml:"reward,omitempty" json:"reward,omitempty"`
}

// ScriptedSpec is a rule list with a fallback for replies no rule matches.
type ScriptedSpec struct {
	Rules []ScriptedRule `yaml:"rules" json:"rules"`
	// Otherwise answers a turn no rule matches ("" = no message: a turn
	// without tool calls then finishes the episode).
	Otherwise string `yaml:"otherwise,omitempty" json:"otherwise,omitempty"`
	// OtherwiseReward is the turn reward when no rule matches (unset = none).
	OtherwiseReward *float64 `yaml:"otherwise_reward,omitempty" json:"otherwise_reward,omitempty"`
}

// UserSimSpec is an LLM-backed user simulator: any OpenAI-compatible chat
// endpoint plays the user. It sees the conversation with the roles swapped
// (the policy's turns as "user", its own earlier replies as "assistant")
// after System, a template over the item's fields. A reply containing
// DoneMarker ends the episode (the marker is removed). Its tokens are
// never trained: they enter the policy's conversation as user messages.
type UserSimSpec struct {
	BaseURL     string   `yaml:"base_url" json:"base_url"`
	Model       string   `yaml:"model" json:"model"`
	APIKeyEnv   string   `yaml:"api_key_env,omitempty" json:"api_key_env,omitempty"`
	System      string   `yaml:"system" json:"system"`
	DoneMarker  string   `yaml:"done_marker,omitempty" json:"done_marker,omitempty"`
	Temperature *float64 `yaml:"temperature,omitempty" json:"temperature,omitempty"`
	MaxTokens   int      `yaml:"max_tokens,omitempty" json:"max_tokens,omitempty"`
	// Timeout bounds one answer, retries included (default 2m).
	Timeout time.Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`
}

// ResponderSpec is the `responder` block of a YAML env: exactly one of
// scripted and user_simulator.
type ResponderSpec struct {
	Scripted      *ScriptedSpec `yaml:"scripted,omitempty" json:"scripted,omitempty"`
	UserSimulator *UserSimSpec  `yaml:"user_simulator,omitempty" json:"user_simulator,omitempty"`
}

type compiledRule struct {
	rule  ScriptedRule
	reply *template.Template
}

// scripted answers by rules.
type scripted struct {
	spec  ScriptedSpec
	rules []compiledRule
	other *template.Template
	mu    sync.Mutex
	cache map[string]*regexp.Regexp // rendered pattern → compiled
}

func newScripted(s ScriptedSpec) (*scripted, error) {
	if len(s.Rules) == 0 && s.Otherwise == "" {
		return nil, fmt.Errorf("%w: responder.scripted: give at least one rule or otherwise", ErrConfig)
	}
	out := &scripted{spec: s, cache: map[string]*regexp.Regexp{}}
	for i, r := range s.Rules {
		if r.Match == "" {
			return nil, fmt.Errorf("%w: responder.scripted.rules[%d]: match is required", ErrConfig, i)
		}
		if !strings.Contains(r.Match, "{{") {
			if _, err := regexp.Compile(r.Match); err != nil {
				return nil, fmt.Errorf("%w: responder.scripted.rules[%d].match: %v", ErrConfig, i, err)
			}
		}
		if r.Reply == "" && !r.Done && r.Reward == nil {
			return nil, fmt.Errorf("%w: responder.scripted.rules[%d]: give reply, done or reward", ErrConfig, i)
		}
		if err := finite(r.Reward); err != nil {
			return nil, fmt.Errorf("%w: responder.scripted.rules[%d].reward: %v", ErrConfig, i, err)
		}
		t, err := template.New("reply").Option("missingkey=error").Parse(r.Reply)
		if err != nil {
			return nil, fmt.Errorf("%w: responder.scripted.rules[%d].reply: %v", ErrConfig, i, err)
		}
		out.rules = append(out.rules, compiledRule{rule: r, reply: t})
	}
	if err := finite(s.OtherwiseReward); err != nil {
		return nil, fmt.Errorf("%w: responder.scripted.otherwise_reward: %v", ErrConfig, err)
	}
	t, err := template.New("otherwise").Option("missingkey=error").Parse(s.Otherwise)
	if err != nil {
		return nil, fmt.Errorf("%w: responder.scripted.otherwise: %v", ErrConfig, err)
	}
	out.other = t
	return out, nil
}

func finite(v *float64) error {
	if v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0)) {
		return fmt.Errorf("%v is not a finite number", *v)
	}
	return nil
}

func (s *scripted) regexp(pattern string) (*regexp.Regexp, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if re, ok := s.cache[pattern]; ok {
		return re, nil
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, err
	}
	if len(s.cache) < 4096 {
		s.cache[pattern] = re
	}
	return re, nil
}

func (s *scripted) respond(_ context.Context, it datasets.Item, turn int, transcript []openai.ChatCompletionMessage) (agentloop.Feedback, error) {
	if toolTurn(transcript) {
		return agentloop.Feedback{}, nil // rules answer replies, not tool calls
	}
	text := lastAssistant(transcript)
	data := map[string]any{}
	for k, v := range it.Data {
		data[k] = v
	}
	data["turn"] = turn
	for i, cr := range s.rules {
		pattern, err := render(fmt.Sprintf("responder.scripted.rules[%d].match", i), cr.rule.Match, it)
		if err != nil {
			return agentloop.Feedback{}, err
		}
		re, err := s.regexp(pattern)
		if err != nil {
			return agentloop.Feedback{}, fmt.Errorf("%w: %s row %d: responder.scripted.rules[%d].match %q: %v", datasets.ErrInvalid, it.Source, it.Row, i, pattern, err)
		}
		m := re.FindString(text)
		if m == "" && !re.MatchString(text) {
			continue
		}
		data["match"] = m
		var b strings.Builder
		if err := cr.reply.Execute(&b, data); err != nil {
			return agentloop.Feedback{}, fmt.Errorf("%w: %s row %d: responder.scripted.rules[%d].reply: %v", datasets.ErrInvalid, it.Source, it.Row, i, err)
		}
		fb := agentloop.Feedback{Done: cr.rule.Done, Reward: cr.rule.Reward, Detail: fmt.Sprintf("rule %d", i)}
		if b.Len() > 0 {
			fb.Messages = []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: b.String()}}
		}
		return fb, nil
	}
	fb := agentloop.Feedback{Reward: s.spec.OtherwiseReward, Detail: "otherwise"}
	var b strings.Builder
	if err := s.other.Execute(&b, data); err != nil {
		return agentloop.Feedback{}, fmt.Errorf("%w: %s row %d: responder.scripted.otherwise: %v", datasets.ErrInvalid, it.Source, it.Row, err)
	}
	if b.Len() > 0 {
		fb.Messages = []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: b.String()}}
	}
	return fb, nil
}

// ---- LLM user simulator ----

// userSim plays the user through the inference chat client. A nil policy
// is opened lazily from spec.
type userSim struct {
	spec   UserSimSpec
	policy inference.Policy
	system *template.Template
}

// ErrUserSim wraps failures of the user simulator's endpoint.
var ErrUserSim = errors.New("user simulator")

func newUserSim(s UserSimSpec) (*userSim, error) {
	if s.BaseURL == "" || s.Model == "" {
		return nil, fmt.Errorf("%w: responder.user_simulator: base_url and model are required", ErrConfig)
	}
	if s.System == "" {
		return nil, fmt.Errorf("%w: responder.user_simulator: system (the user's persona and goal) is required", ErrConfig)
	}
	if s.MaxTokens < 0 || s.Timeout < 0 {
		return nil, fmt.Errorf("%w: responder.user_simulator: max_tokens and timeout must not be negative", ErrConfig)
	}
	t, err := template.New("system").Option("missingkey=error").Parse(s.System)
	if err != nil {
		return nil, fmt.Errorf("%w: responder.user_simulator.system: %v", ErrConfig, err)
	}
	cfg := inference.Config{Backend: inference.BackendChat, Endpoints: []string{s.BaseURL}, Model: s.Model, Timeout: s.Timeout}
	if s.APIKeyEnv != "" {
		var err error
		if cfg.APIKey, err = secrets.Lookup(s.APIKeyEnv); err != nil {
			return nil, fmt.Errorf("%w: responder.user_simulator.api_key_env: %w", ErrConfig, err)
		}
	}
	c, err := inference.Open(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: responder.user_simulator: %v", ErrConfig, err)
	}
	return &userSim{spec: s, policy: c, system: t}, nil
}

// swapRoles is the conversation as the simulated user sees it: the
// policy's visible replies as "user", the env's earlier messages as
// "assistant". Tool traffic and the task's own system prompt are left out.
func swapRoles(system string, transcript []openai.ChatCompletionMessage) []openai.ChatCompletionMessage {
	out := []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleSystem, Content: system}}
	for _, m := range transcript {
		switch m.Role {
		case openai.ChatMessageRoleAssistant:
			if strings.TrimSpace(m.Content) != "" {
				out = append(out, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleUser, Content: m.Content})
			}
		case openai.ChatMessageRoleUser:
			// The task's opening message is the simulated user's own
			// first line; later ones are its earlier replies.
			out = append(out, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant, Content: m.Content})
		}
	}
	return out
}

func (u *userSim) respond(ctx context.Context, it datasets.Item, turn int, transcript []openai.ChatCompletionMessage) (agentloop.Feedback, error) {
	var sys strings.Builder
	if err := u.system.Execute(&sys, it.Data); err != nil {
		return agentloop.Feedback{}, fmt.Errorf("%w: %s row %d: responder.user_simulator.system: %v", datasets.ErrInvalid, it.Source, it.Row, err)
	}
	msgs := swapRoles(sys.String(), transcript)
	if toolTurn(transcript) || strings.TrimSpace(lastAssistant(transcript)) == "" || msgs[len(msgs)-1].Role != openai.ChatMessageRoleUser {
		// The policy said nothing visible this turn (tool calls only):
		// the user waits.
		return agentloop.Feedback{Detail: "user_simulator: nothing to answer"}, nil
	}
	// The whole answer is bounded: the client's endpoint pool waits for an
	// endpoint that is down, and a user that never answers must fail the
	// rollout, not hold it.
	ctx, cancel := context.WithTimeout(ctx, u.timeout())
	defer cancel()
	sampling := inference.Sampling{MaxTokens: u.spec.MaxTokens, Temperature: u.spec.Temperature}
	if sampling.MaxTokens == 0 {
		sampling.MaxTokens = 512
	}
	ep, err := u.policy.Start(ctx, inference.EpisodeSpec{ID: fmt.Sprintf("usersim-%s-%d", it.ID, turn), Model: u.spec.Model, Sampling: sampling})
	if err != nil {
		return agentloop.Feedback{}, fmt.Errorf("%w: %w", ErrUserSim, err)
	}
	gen, err := ep.Generate(ctx, msgs)
	if err != nil {
		return agentloop.Feedback{}, fmt.Errorf("%w: %w", ErrUserSim, err)
	}
	text := gen.Content
	if !gen.Parsed {
		text = gen.Text
	}
	fb := agentloop.Feedback{Detail: "user_simulator"}
	if u.spec.DoneMarker != "" && strings.Contains(text, u.spec.DoneMarker) {
		fb.Done = true
		text = strings.TrimSpace(strings.ReplaceAll(text, u.spec.DoneMarker, ""))
	}
	if strings.TrimSpace(text) != "" {
		fb.Messages = []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: text}}
	}
	return fb, nil
}

func (u *userSim) timeout() time.Duration {
	if u.spec.Timeout > 0 {
		return u.spec.Timeout
	}
	return 2 * time.Minute
}

// buildResponder validates a YAML env's responder block.
func buildResponder(s *ResponderSpec) (itemResponder, error) {
	if s == nil {
		return nil, nil
	}
	switch {
	case s.Scripted != nil && s.UserSimulator != nil:
		return nil, fmt.Errorf("%w: responder: give one of scripted and user_simulator, not both", ErrConfig)
	case s.Scripted != nil:
		return newScripted(*s.Scripted)
	case s.UserSimulator != nil:
		return newUserSim(*s.UserSimulator)
	}
	return nil, fmt.Errorf("%w: responder: give scripted or user_simulator", ErrConfig)
}
