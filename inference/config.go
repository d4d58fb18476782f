package inference

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
)

// Backend names accepted by Config.Backend.
const (
	BackendChat         = "chat"          // /v1/chat/completions, server-side parsing
	BackendVLLM         = "vllm"          // tokens mode over /v1/completions with id prompts
	BackendVLLMGenerate = "vllm-generate" // tokens mode over /inference/v1/generate + /detokenize
	BackendSGLang       = "sglang"        // tokens mode over SGLang /generate
	BackendAtropos      = "atropos"       // tokens mode over the Atropos custom vLLM /generate
	BackendLlamaCpp     = "llamacpp"      // tokens mode over llama-server's /apply-template, /tokenize, /completion
)

// Backends lists the accepted backend names.
func Backends() []string {
	return []string{BackendChat, BackendVLLM, BackendVLLMGenerate, BackendSGLang, BackendAtropos, BackendLlamaCpp}
}

// Values of Config.SamplerFields.
const (
	SamplerFieldsFull   = "full"
	SamplerFieldsOpenAI = "openai"
)

// Config selects a backend and its endpoints. Durations in YAML are Go
// duration strings ("30s").
type Config struct {
	Backend   string   `yaml:"backend" json:"backend"`
	Endpoints []string `yaml:"endpoints" json:"endpoints"`
	// TokenizerEndpoints serve /tokenize and /detokenize for the same
	// model when the generation servers do not (the Atropos custom server
	// has neither): e.g. a GPU-less vLLM render server. Empty: Endpoints.
	TokenizerEndpoints []string `yaml:"tokenizer_endpoints,omitempty" json:"tokenizer_endpoints,omitempty"`
	// Model is the served model name; empty takes the first of /v1/models.
	Model  string `yaml:"model,omitempty" json:"model,omitempty"`
	APIKey string `yaml:"api_key,omitempty" json:"-"`
	// Timeout bounds one HTTP attempt (default 10m).
	Timeout                  time.Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	MaxConcurrentPerEndpoint int           `yaml:"max_concurrent_per_endpoint,omitempty" json:"max_concurrent_per_endpoint,omitempty"`
	// Retries after a connection error or 5xx (default 3; -1 disables).
	Retries         int           `yaml:"retries,omitempty" json:"retries,omitempty"`
	BackoffBase     time.Duration `yaml:"backoff_base,omitempty" json:"backoff_base,omitempty"`
	BackoffMax      time.Duration `yaml:"backoff_max,omitempty" json:"backoff_max,omitempty"`
	BreakerFailures int           `yaml:"breaker_failures,omitempty" json:"breaker_failures,omitempty"`
	BreakerCooldown time.Duration `yaml:"breaker_cooldown,omitempty" json:"breaker_cooldown,omitempty"`
	HealthTimeout   time.Duration `yaml:"health_timeout,omitempty" json:"health_timeout,omitempty"`
	// ReadyTimeout bounds the start check: every endpoint must answer
	// /v1/models (and serve the model) within it (default 10s; raise it
	// when the servers start together with the run). See health.go.
	ReadyTimeout time.Duration `yaml:"ready_timeout,omitempty" json:"ready_timeout,omitempty"`
	// UnreachableTimeout fails a running run once no endpoint has
	// answered for that long (default 60s).
	UnreachableTimeout time.Duration `yaml:"unreachable_timeout,omitempty" json:"unreachable_timeout,omitempty"`
	// ChatTokenIDs makes the chat backend ask for return_token_ids and
	// logprobs (vLLM ≥ 0.10.2, the simulator). Leave off for OpenAI or
	// OpenRouter, which reject unknown fields.
	ChatTokenIDs bool `yaml:"chat_token_ids,omitempty" json:"chat_token_ids,omitempty"`
	// SamplerFields chooses which sampler fields the chat backend states:
	// "full" (default: temperature, top_p, top_k, min_p, repetition,
	// presence and frequency penalties, plus llama.cpp's own when the
	// server is llama.cpp) or "openai" (temperature, top_p, presence and
	// frequency penalty only, for APIs that reject unknown fields). Token
	// backends always send the full sampler.
	SamplerFields string `yaml:"sampler_fields,omitempty" json:"sampler_fields,omitempty"`
	// MaxUnscoredShare fails a run (after writing its rows) whose ok
	// rollouts sampled more than this share of their ids without a
	// logprob (Sequence.Unscored: untrained; llama.cpp gives every id one
	// through its scoring pass, so only a server that refuses it leaves
	// any). Default DefaultMaxUnscoredShare; 1 never fails.
	MaxUnscoredShare *float64 `yaml:"max_unscored_share,omitempty" json:"max_unscored_share,omitempty"`
	// Sampling holds defaults; an EpisodeSpec's fields override them one by one.
	Sampling Sampling `yaml:"sampling,omitempty" json:"sampling,omitempty"`
	// TwoRenderSegments makes tokens mode render every new segment twice
	// (the base conversation and the base plus the new messages), as it did
	// before the closing count was learned per assistant shape; off by
	// default: one render per turn once the shape is known
	// (docs/inference.md). Kept for comparison (rollout bench) and as an
	// escape hatch.
	TwoRenderSegments bool `yaml:"two_render_segments,omitempty" json:"two_render_segments,omitempty"`
	// RoutedExperts asks the engine for the mixture-of-experts routing of
	// every token (routing replay, R3): vllm-generate (vLLM started with
	// --enable-return-routed-experts) and sglang (started with
	// --enable-return-routed-experts) only. The record carries the experts
	// aligned with the token ids (docs/trajectory-schema.md).
	RoutedExperts bool `yaml:"routed_experts,omitempty" json:"routed_experts,omitempty"`
	// RoutedExpertsTopK is the router's top-k. SGLang reports each
	// position's experts as one flat row of layers × top-k ids, so sglang
	// needs it to split the row; vLLM's array carries its shape, which is
	// checked against it when set.
	RoutedExpertsTopK int `yaml:"routed_experts_topk,omitempty" json:"routed_experts_topk,omitempty"`
	// LocalRender renders tokens-mode prompts in-process from the model's
	// own files instead of through the server: a GGUF file (llama.cpp) or
	// a Hugging Face model directory with tokenizer.json and
	// tokenizer_config.json (vLLM, SGLang). Byte-level BPE tokenizers only.
	// Every conversation shape is checked against the server's render
	// first (LocalRenderVerifyFirst renders, default 2) and then one render
	// in LocalRenderVerifyEvery (default 64); one difference turns it off
	// for the run (localrender.go, docs/inference.md).
	LocalRender            string       `yaml:"local_render,omitempty" json:"local_render,omitempty"`
	LocalRenderVerifyFirst int          `yaml:"local_render_verify_first,omitempty" json:"local_render_verify_first,omitempty"`
	LocalRenderVerifyEvery int          `yaml:"local_render_verify_every,omitempty" json:"local_render_verify_every,omitempty"`
	Logger                 *slog.Logger `yaml:"-" json:"-"`
}

func (c Config) poolConfig(endpoints []string) PoolConfig {
	return PoolConfig{
		Endpoints:                endpoints,
		APIKey:                   c.APIKey,
		Timeout:                  c.Timeout,
		MaxConcurrentPerEndpoint: c.MaxConcurrentPerEndpoint,
		Retries:                  c.Retries,
		BackoffBase:              c.BackoffBase,
		BackoffMax:               c.BackoffMax,
		BreakerFailures:          c.BreakerFailures,
		BreakerCooldown:          c.BreakerCooldown,
		HealthTimeout:            c.HealthTimeout,
		Logger:                   c.Logger,
	}
}

// DefaultMaxUnscoredShare is inference.max_unscored_share's default: 1 %
// of a run's sampled ids may go untrained before the run fails.
const DefaultMaxUnscoredShare = 0.01

// UnscoredLimit is max_unscored_share with its default applied.
func (c Config) UnscoredLimit() float64 {
	if c.MaxUnscoredShare == nil {
		return DefaultMaxUnscoredShare
	}
	return *c.MaxUnscoredShare
}

// Client is the Policy built from a Config. It also exposes its pools for
// health pages and benchmarks. Close it when done.
type Client struct {
	cfg    Config
	pool   *Pool
	tok    *Pool          // == pool unless TokenizerEndpoints is set
	local  *localRenderer // Config.LocalRender; nil without
	gen    generator
	log    *slog.Logger
	mu     sync.Mutex
	models map[string]int // model → max_model_len (0 unknown)
	first  string         // resolved default model
	// modelsOnce collapses the /v1/models calls of episodes starting
	// together (thousands at a run's start) into one request.
	modelsOnce singleflight.Group
	closing    map[string][]int32
	// prefill (llama.cpp), per closing key: the server renders a trailing
	// assistant message as a prefill (llama-server's default), so no
	// render may end with one.
	prefill map[string]bool
	// closingTail (llama.cpp), per closing key: the closing and the user
	// turn "x" after it, as the probe rendered them (CheckTemplate).
	closingTail map[string][]int32
	eotText     map[string]string
	// segClosings is the number of assistant closings in the base render
	// of segment, learned per assistant shape (segmentShape).
	segClosings map[string]int
	// learnOnce collapses the template probes and end-of-turn decodes of
	// episodes that miss the caches above together (every episode of a
	// run's first wave) into one request each.
	learnOnce singleflight.Group
	// llama is true when the server is llama.cpp (the backend says so, or
	// /v1/models carries llama.cpp's "meta" block).
	llama bool
	// llamaForced and llamaScoreRefused serve llama.cpp's scoring pass
	// (llamacpp_score.go).
	llamaForced       llamaForced
	llamaScoreRefused atomic.Bool
	sampler           samplerState
	gate              *gate // policy versions and in-flight weight updates (async.go)
}

var _ Policy = (*Client)(nil)

// New builds the Policy the rest of the project uses. It makes no network
// call: the model and its context length are resolved on the first Start.
func New(cfg Config) (Policy, error) {
	c, err := Open(cfg)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Open is New returning the concrete type.
func Open(cfg Config) (*Client, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Client{cfg: cfg, log: cfg.Logger, models: map[string]int{}, closing: map[string][]int32{}, prefill: map[string]bool{}, closingTail: map[string][]int32{}, eotText: map[string]string{}, segClosings: map[string]int{}, gate: newGate()}
	switch cfg.Backend {
	case BackendChat:
	case BackendVLLM:
		c.gen = completionsGen{}
	case BackendVLLMGenerate:
		c.gen = vllmGenerateGen{}
	case BackendSGLang:
		c.gen = sglangGen{}
	case BackendAtropos:
		c.gen = atroposGen{}
	case BackendLlamaCpp:
		c.gen = llamaGen{c: c}
	case "":
		return nil, fmt.Errorf("inference: backend not set; want one of %s", strings.Join(Backends(), ", "))
	default:
		return nil, fmt.Errorf("inference: unknown backend %q; want one of %s", cfg.Backend, strings.Join(Backends(), ", "))
	}
	switch cfg.SamplerFields {
	case "", SamplerFieldsFull, SamplerFieldsOpenAI:
	default:
		return nil, fmt.Errorf("inference: sampler_fields %q: want %q or %q", cfg.SamplerFields, SamplerFieldsFull, SamplerFieldsOpenAI)
	}
	c.llama = cfg.Backend == BackendLlamaCpp
	if cfg.RoutedExperts {
		switch cfg.Backend {
		case BackendVLLMGenerate:
		case BackendSGLang:
			if cfg.RoutedExpertsTopK <= 0 {
				return nil, fmt.Errorf("inference: routed_experts on sglang needs routed_experts_topk (the router's top-k): SGLang reports each token's experts as one flat row of layers × top-k")
			}
		default:
			return nil, fmt.Errorf("inference: routed_experts is not implemented for backend %q; use %s or %s", cfg.Backend, BackendVLLMGenerate, BackendSGLang)
		}
	}
	if cfg.RoutedExpertsTopK < 0 {
		return nil, fmt.Errorf("inference: routed_experts_topk %d is negative", cfg.RoutedExpertsTopK)
	}
	if cfg.MaxConcurrentPerEndpoint < 0 {
		return nil, fmt.Errorf("inference: max_concurrent_per_endpoint %d is negative", cfg.MaxConcurrentPerEndpoint)
	}
	p, err := NewPool(cfg.poolConfig(cfg.Endpoints))
	if err != nil {
		return nil, fmt.Errorf("inference: %w", err)
	}
	c.pool, c.tok = p, p
	if c.local, err = newLocalRenderer(cfg); err != nil {
		p.Close()
		return nil, err
	}
	if len(cfg.TokenizerEndpoints) > 0 {
		t, err := NewPool(cfg.poolConfig(cfg.TokenizerEndpoints))
		if err != nil {
			return nil, fmt.Errorf("inference tokenizer: %w", err)
		}
		c.tok = t
	}
	return c, nil
}

// Pool is the generation endpoint pool.
func (c *Client) Pool() *Pool { return c.pool }

// Close releases idle connections.
func (c *Client) Close() error {
	c.pool.Close()
	if c.tok != c.pool {
		c.tok.Close()
	}
	return nil
}

// Start begins an episode.
func (c *Client) Start(ctx context.Context, spec EpisodeSpec) (Episode, error) {
	model, maxLen, err := c.resolveModel(ctx, spec.Model)
	if err != nil {
		return nil, err
	}
	spec.Model = model
	spec.Sampling = withNeutral(mergeSampling(c.cfg.Sampling, spec.Sampling), topKOffFor(c.cfg.Backend))
	c.warnSampler(spec.Sampling)
	if spec.Sampling.MaxTokens < 0 {
		return nil, &Error{Class: ErrRequest, Op: "start", RequestID: spec.ID, Msg: fmt.Sprintf("max_tokens %d is negative", spec.Sampling.MaxTokens)}
	}
	tools, err := EncodeTools(spec.Tools)
	if err != nil {
		return nil, &Error{Class: ErrRequest, Op: "start", RequestID: spec.ID, Msg: "tools", Err: err}
	}
	if c.gen == nil {
		e := &chatEpisode{c: c, spec: spec, tools: tools, maxLen: maxLen}
		e.aff.a.key = spec.Group
		return e, nil
	}
	return newTokenEpisode(c, spec, tools, maxLen), nil
}

// resolveModel returns the model name and its max_model_len (0 if the
// server does not say). /v1/models is asked once per model; failures are
// not cached.
func (c *Client) resolveModel(ctx context.Context, want string) (string, int, error) {
	if want == "" {
		want = c.cfg.Model
	}
	c.mu.Lock()
	if want == "" && c.first != "" {
		want = c.first
	}
	if n, ok := c.models[want]; ok && want != "" {
		c.mu.Unlock()
		return want, n, nil
	}
	c.mu.Unlock()
	v, err, _ := c.modelsOnce.Do("models", func() (any, error) {
		resp, err := c.pool.Models(ctx)
		if err != nil {
			return nil, err
		}
		// llama.cpp: no max_model_len, a "meta" block instead; the real
		// per-request limit is one slot's share of the context (/props).
		out := &modelsInfo{resp: resp}
		for _, m := range resp.Data {
			if m.Meta != nil || c.cfg.Backend == BackendLlamaCpp {
				out.llama = true
			}
		}
		if out.llama {
			out.slotCtx = c.llamaContext(ctx)
		}
		return out, nil
	})
	info, _ := v.(*modelsInfo)
	var resp *ModelsResponse
	if info != nil {
		resp = info.resp
	}
	if err != nil {
		if want != "" && c.gen == nil {
			// A chat server without /v1/models (some proxies) still works
			// when the model is named.
			c.log.Warn("inference: /v1/models failed; context-length guard disabled", "model", want, "err", err)
			c.mu.Lock()
			c.models[want] = 0
			c.mu.Unlock()
			return want, 0, nil
		}
		return "", 0, fmt.Errorf("resolve model: %w", err)
	}
	if len(resp.Data) == 0 {
		return "", 0, &Error{Class: ErrInfra, Op: "GET /v1/models", Msg: "server lists no models"}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.llama = c.llama || info.llama
	for _, m := range resp.Data {
		n := m.MaxModelLen
		if n == 0 && m.Meta != nil {
			n = m.Meta.NCtx
			if n == 0 {
				n = m.Meta.NCtxTrain
			}
		}
		if info.slotCtx > 0 && (n == 0 || info.slotCtx < n) {
			n = info.slotCtx
		}
		c.models[m.ID] = n
	}
	if c.first == "" {
		c.first = resp.Data[0].ID
	}
	if want == "" {
		want = c.first
	}
	n, ok := c.models[want]
	if !ok {
		ids := make([]string, 0, len(resp.Data))
		for _, m := range resp.Data {
			ids = append(ids, m.ID)
		}
		return "", 0, &Error{Class: ErrRequest, Op: "GET /v1/models", Msg: fmt.Sprintf("model %q is not served (served: %s)", want, strings.Join(ids, ", "))}
	}
	return want, n, nil
}

// modelsInfo is what one /v1/models (+ /props on llama.cpp) round learns.
type modelsInfo struct {
	resp    *ModelsResponse
	llama   bool
	slotCtx int // llama.cpp /props default_generation_settings.n_ctx
}

// mergeSampling overlays o on base field by field.
func mergeSampling(base, o Sampling) Sampling {
	out := base
	if o.Temperature != nil {
		out.Temperature = o.Temperature
	}
	if o.TopP != nil {
		out.TopP = o.TopP
	}
	if o.TopK != nil {
		out.TopK = o.TopK
	}
	if o.MinP != nil {
		out.MinP = o.MinP
	}
	if o.MaxTokens != 0 {
		out.MaxTokens = o.MaxTokens
	}
	if o.Stop != nil {
		out.Stop = o.Stop
	}
	if o.Seed != nil {
		out.Seed = o.Seed
	}
	if o.RepetitionPenalty != nil {
		out.RepetitionPenalty = o.RepetitionPenalty
	}
	if o.PresencePenalty != nil {
		out.PresencePenalty = o.PresencePenalty
	}
	if o.FrequencyPenalty != nil {
		out.FrequencyPenalty = o.FrequencyPenalty
	}
	if len(base.ChatTemplateKwargs) > 0 || len(o.ChatTemplateKwargs) > 0 {
		out.ChatTemplateKwargs = maps.Clone(base.ChatTemplateKwargs)
		if out.ChatTemplateKwargs == nil {
			out.ChatTemplateKwargs = map[string]any{}
		}
		maps.Copy(out.ChatTemplateKwargs, o.ChatTemplateKwargs)
	}
	if len(base.ExtraBody) > 0 || len(o.ExtraBody) > 0 {
		out.ExtraBody = maps.Clone(base.ExtraBody)
		if out.ExtraBody == nil {
			out.ExtraBody = map[string]any{}
		}
		maps.Copy(out.ExtraBody, o.ExtraBody)
	}
	return out
}
