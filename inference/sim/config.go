package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"
)

// Config configures a simulated server. The zero value plus a Family is a
// valid configuration.
type Config struct {
	// Addr to listen on; default 127.0.0.1:0 (a free port).
	Addr string `yaml:"addr" json:"addr,omitempty"`
	// Model is the served model name; default "rollout-sim".
	Model string `yaml:"model" json:"model,omitempty"`
	// Family is the tool-call format the policy emits and the
	// --tool-call-parser the server parses chat output with.
	Family string `yaml:"family" json:"family,omitempty"`
	// Template is the chat template; default chosen from the family.
	Template string `yaml:"template" json:"template,omitempty"`
	// MaxModelLen is the context length; default 32768.
	MaxModelLen int     `yaml:"max_model_len" json:"max_model_len,omitempty"`
	Latency     Latency `yaml:"latency" json:"latency"`
	Faults      Faults  `yaml:"faults" json:"faults"`
	Seed        int64   `yaml:"seed" json:"seed,omitempty"`
	// SuccessProb is the probability that an episode follows its script's
	// correct path; default 1. Set SuccessProbSet to use an explicit 0.
	SuccessProb float64 `yaml:"success_prob" json:"success_prob,omitempty"`
	// SuccessProbSet marks SuccessProb as explicitly set (so 0 is kept).
	SuccessProbSet bool     `yaml:"-" json:"-"`
	Scripts        []Script `yaml:"scripts" json:"scripts,omitempty"`
	// Reasoning makes the policy open every turn with a <think> block.
	Reasoning bool `yaml:"reasoning" json:"reasoning,omitempty"`
	// Bench, when set, replaces scripts with a fixed throughput workload.
	Bench *Bench `yaml:"bench" json:"bench,omitempty"`
	// ExactLength makes every generation exactly max_tokens long, cut with
	// finish_reason "length".
	ExactLength bool `yaml:"exact_length" json:"exact_length,omitempty"`
	// Now is the clock used for "created" fields; tests pin it.
	Now func() time.Time `yaml:"-" json:"-"`
	// Logger, when set, logs one line per request (route, status,
	// duration, injected fault).
	Logger *slog.Logger `yaml:"-" json:"-"`
	// Engine selects the server the simulator imitates: "vllm" (default:
	// vLLM's routes plus SGLang's and Atropos' /generate) or "llamacpp"
	// (llama.cpp's llama-server: /completion, /tokenize, /detokenize,
	// /apply-template, /props, chat logprobs with ids; docs/simulator.md).
	Engine string `yaml:"engine" json:"engine,omitempty"`
	// Slots is llama-server's -np (llamacpp engine): MaxModelLen is one
	// slot's context and /v1/models meta.n_ctx reports MaxModelLen×Slots.
	// Default 1.
	Slots int `yaml:"slots" json:"slots,omitempty"`
	// PrefillAssistant (llamacpp engine) renders a trailing assistant
	// message as a prefill to continue, without its closing, as
	// llama-server does unless started with --no-prefill-assistant.
	// Default false: the simulator behaves like a server started with it.
	PrefillAssistant bool `yaml:"prefill_assistant" json:"prefill_assistant,omitempty"`
	// RecordSamplers makes the server keep the sampler fields of every
	// generation request (Server.Samplers), for tests of what reached it.
	RecordSamplers bool `yaml:"-" json:"-"`
	// RecordGenerations makes the server keep what it sampled for every
	// generation request (Server.Generations): ids, logprobs, the version
	// of each id, aborts and keep-mode freezes.
	RecordGenerations bool `yaml:"-" json:"-"`
	// Experts makes the simulated model a mixture of experts whose server
	// returns routed experts (vLLM and SGLang started with
	// --enable-return-routed-experts): vLLM's /inference/v1/generate
	// fills choices[].routed_experts, SGLang's /generate fills
	// meta_info.routed_experts when asked (docs/simulator.md). The experts
	// of a position are a deterministic function of (position, token id,
	// layer). Nil: a dense model, no routing returned.
	Experts *Experts `yaml:"experts,omitempty" json:"experts,omitempty"`
}

// Experts is the simulated model's mixture-of-experts shape.
type Experts struct {
	Layers int `yaml:"layers" json:"layers"`
	TopK   int `yaml:"topk" json:"topk"`
	Num    int `yaml:"num" json:"num"` // experts per layer
}

// Engines the simulator imitates.
const (
	EngineVLLM     = "vllm"
	EngineLlamaCpp = "llamacpp"
)

// Latency models generation time: TTFT + PerToken × tokens + U[0, Jitter).
type Latency struct {
	TTFT     time.Duration `yaml:"ttft" json:"ttft,omitempty"`
	PerToken time.Duration `yaml:"per_token" json:"per_token,omitempty"`
	Jitter   time.Duration `yaml:"jitter" json:"jitter,omitempty"`
}

// Faults are per-request probabilities on the generation routes. Their sum
// must not exceed 1.
type Faults struct {
	ErrorRate     float64 `yaml:"error_rate" json:"error_rate,omitempty"`         // HTTP 500 with a vLLM error body
	HangRate      float64 `yaml:"hang_rate" json:"hang_rate,omitempty"`           // never answer until the client gives up
	DropRate      float64 `yaml:"drop_rate" json:"drop_rate,omitempty"`           // close the connection without a response
	MalformedRate float64 `yaml:"malformed_rate" json:"malformed_rate,omitempty"` // 200 with a body that is not JSON
	TruncateRate  float64 `yaml:"truncate_rate" json:"truncate_rate,omitempty"`   // body cut short, connection closed
}

func (f Faults) total() float64 {
	return f.ErrorRate + f.HangRate + f.DropRate + f.MalformedRate + f.TruncateRate
}

// Script drives the policy for prompts whose first user message contains
// Match.
type Script struct {
	Match string `yaml:"match" json:"match"`
	// Steps is the correct path, one entry per assistant turn.
	Steps []Step `yaml:"steps" json:"steps"`
	// Wrong is taken with probability 1-SuccessProb (when non-empty).
	Wrong []Step `yaml:"wrong" json:"wrong,omitempty"`
}

// Step is one assistant turn: tool calls, or a final answer.
type Step struct {
	ToolCalls []Call `yaml:"tool_calls" json:"tool_calls,omitempty"`
	Final     string `yaml:"final" json:"final,omitempty"`
	// Thought is the reasoning text emitted with Config.Reasoning; a
	// default is derived from the step when empty.
	Thought string `yaml:"thought" json:"thought,omitempty"`
}

// Call is one tool call of a step.
type Call struct {
	Name      string         `yaml:"name" json:"name"`
	Arguments map[string]any `yaml:"arguments" json:"arguments,omitempty"`
}

// Bench is the throughput workload: Turns turns of CallsPerTurn calls to
// Tool each, then a final answer.
type Bench struct {
	Tool         string         `yaml:"tool" json:"tool"`
	CallsPerTurn int            `yaml:"calls_per_turn" json:"calls_per_turn"`
	Turns        int            `yaml:"turns" json:"turns"`
	Arguments    map[string]any `yaml:"arguments" json:"arguments,omitempty"`
}

// ErrUnsupportedFamily is returned for a family the simulator cannot emit.
var ErrUnsupportedFamily = errors.New("tool-call family not supported by the simulator")

// ErrUnsupportedTemplate is returned for an unknown template name.
var ErrUnsupportedTemplate = errors.New("chat template not supported by the simulator")

// defaultTemplate maps each emitted family to the template of the models
// that speak it. Families without a modelled template use ChatML, with the
// family's own call syntax inside assistant turns.
var defaultTemplate = map[string]string{
	"hermes":      "hermes",
	"qwen3_coder": "qwen3",
	"llama3_json": "llama3",
	"mistral":     "mistral",
	"deepseek_v3": "deepseek_v3",
	"kimi_k2":     "chatml",
	"glm45":       "chatml",
}

// familyAliases are parser names whose models write exactly the format of
// a family the simulator emits (the parsers package parses both alike).
var familyAliases = map[string]string{
	"qwen":        "hermes",
	"glm47":       "glm45",
	"qwen3_xml":   "qwen3_coder",
	"llama4_json": "llama3_json",
}

// Families lists the tool-call formats the simulator can emit, aliases
// included.
func Families() []string {
	out := make([]string, 0, len(defaultTemplate)+len(familyAliases))
	for f := range defaultTemplate {
		out = append(out, f)
	}
	for f := range familyAliases {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

// withDefaults validates cfg and fills defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Family == "" {
		c.Family = "hermes"
	}
	if canon, ok := familyAliases[c.Family]; ok {
		c.Family = canon
	}
	def, ok := defaultTemplate[c.Family]
	if !ok {
		return c, fmt.Errorf("family %q: %w (supported: %s)", c.Family, ErrUnsupportedFamily, strings.Join(Families(), ", "))
	}
	if c.Template == "" {
		c.Template = def
	}
	if _, ok := templates[c.Template]; !ok {
		return c, fmt.Errorf("template %q: %w (supported: %s)", c.Template, ErrUnsupportedTemplate, strings.Join(TemplateNames(), ", "))
	}
	if c.Model == "" {
		c.Model = "rollout-sim"
	}
	switch c.Engine {
	case "":
		c.Engine = EngineVLLM
	case EngineVLLM, EngineLlamaCpp:
	default:
		return c, fmt.Errorf("engine %q: want %q or %q", c.Engine, EngineVLLM, EngineLlamaCpp)
	}
	if x := c.Experts; x != nil && (x.Layers <= 0 || x.TopK <= 0 || x.Num < x.TopK || x.Num > 1<<15) {
		return c, fmt.Errorf("experts %+v: want layers and topk positive, topk <= num <= 32768", *x)
	}
	if c.Slots == 0 {
		c.Slots = 1
	}
	if c.Slots < 0 {
		return c, fmt.Errorf("slots %d: must be positive", c.Slots)
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = 32768
	}
	if c.MaxModelLen < 16 {
		return c, fmt.Errorf("max_model_len %d: must be at least 16", c.MaxModelLen)
	}
	if c.Latency.TTFT < 0 || c.Latency.PerToken < 0 || c.Latency.Jitter < 0 {
		return c, fmt.Errorf("latency %+v: durations must not be negative", c.Latency)
	}
	for name, r := range map[string]float64{
		"error_rate": c.Faults.ErrorRate, "hang_rate": c.Faults.HangRate, "drop_rate": c.Faults.DropRate,
		"malformed_rate": c.Faults.MalformedRate, "truncate_rate": c.Faults.TruncateRate,
	} {
		if r < 0 || r > 1 {
			return c, fmt.Errorf("faults.%s %v: must be within [0, 1]", name, r)
		}
	}
	if t := c.Faults.total(); t > 1 {
		return c, fmt.Errorf("fault rates sum to %v: must not exceed 1", t)
	}
	if c.SuccessProb == 0 && !c.SuccessProbSet {
		c.SuccessProb = 1
	}
	if c.SuccessProb < 0 || c.SuccessProb > 1 {
		return c, fmt.Errorf("success_prob %v: must be within [0, 1]", c.SuccessProb)
	}
	for i, s := range c.Scripts {
		if s.Match == "" {
			return c, fmt.Errorf("script %d: match must not be empty", i)
		}
		if len(s.Steps) == 0 {
			return c, fmt.Errorf("script %d (%q): needs at least one step", i, s.Match)
		}
		for j, st := range append(append([]Step{}, s.Steps...), s.Wrong...) {
			for k, call := range st.ToolCalls {
				if call.Name == "" {
					return c, fmt.Errorf("script %d (%q) step %d call %d: name must not be empty", i, s.Match, j, k)
				}
			}
		}
	}
	if b := c.Bench; b != nil {
		if b.Tool == "" || b.CallsPerTurn < 1 || b.Turns < 0 {
			return c, fmt.Errorf("bench %+v: needs a tool, calls_per_turn ≥ 1 and turns ≥ 0", *b)
		}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}
