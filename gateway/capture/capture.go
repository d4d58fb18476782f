// Package capture is the gateway's Completer: it owns sessions, renders
// each call's messages through a tokens-mode inference episode, generates,
// parses with rollout's parsers, anchors the harness's echoed history to
// the replies that produced it, and records every session as a graph of
// token-exact branches (gateway.SessionRecord). Handler serves the front
// doors and the probes harnesses make under one base URL per session.
package capture

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/parsers"
)

// Options configure a Gateway. Zero limits take the defaults below.
type Options struct {
	// Parser and ReasoningParser name rollout's tool-call and reasoning
	// parsers (parsers.Get, parsers.GetReasoning; "" for no reasoning
	// parser). Parser is required.
	Parser          string
	ReasoningParser string
	// Models are the model names a harness may call (the first is what
	// /v1/models lists first); empty serves the engine's own model name.
	Models []string
	// Sampling is the run's sampler: it governs every generation, whatever
	// a harness asks (what it asked is only recorded), unless a session was
	// opened with its own (OpenWith). Sampling.MaxTokens is the run's
	// per-call cap (0: none but the context).
	Sampling inference.Sampling
	// ContextLength is the context window /v1/models and /props report
	// when the engine does not say (the engine's own value always wins;
	// 0: unknown). It is reported, not enforced: the engine enforces its
	// own.
	ContextLength int
	// MaxSessions bounds the open sessions (default 10000);
	// MaxCallsPerSession a session's calls (default 1000); MaxBodyBytes a
	// request body (default 32 MiB).
	MaxSessions        int
	MaxCallsPerSession int
	MaxBodyBytes       int64
	// IdleTimeout closes a session that has had no call for this long and
	// none in flight (0: never; the caller closes it). The gateway then
	// calls OnExpire with the session's record; Close on it fails as on
	// any closed session. A session holds a timer, no goroutine.
	IdleTimeout time.Duration
	// OnExpire, when set, receives each session IdleTimeout closed, with
	// its record (or the error finishing its branches), on the timer's
	// goroutine.
	OnExpire func(s *Session, rec gateway.SessionRecord, err error)
	// Doors are the front doors ServeSession mounts (gateway/builtin's
	// FrontDoors in production).
	Doors  []gateway.FrontDoor
	Logger *slog.Logger
}

// Defaults of Options' limits.
const (
	DefaultMaxSessions        = 10000
	DefaultMaxCallsPerSession = 1000
	DefaultMaxBodyBytes       = 32 << 20
)

// withDefaults is o with every unset limit at its default.
func (o Options) withDefaults() Options {
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	o.MaxCallsPerSession = o.CallLimit()
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	return o
}

// CallLimit is the number of calls a session may make under o
// (MaxCallsPerSession, or its default when unset).
func (o Options) CallLimit() int {
	if o.MaxCallsPerSession > 0 {
		return o.MaxCallsPerSession
	}
	return DefaultMaxCallsPerSession
}

// turnGenerator is the tokens-mode episode the gateway needs: one
// generation with a per-call max_tokens fitted to the context.
type turnGenerator interface {
	inference.Episode
	GenerateWith(ctx context.Context, messages []openai.ChatCompletionMessage, o inference.TurnOptions) (inference.Turn, error)
}

// contextReporter is a policy that knows its served model and context
// window (inference.Client).
type contextReporter interface {
	Context(ctx context.Context, model string) (string, int, error)
}

// Gateway is the capturing Completer. It is safe for concurrent use; it
// holds no goroutine per session.
type Gateway struct {
	policy inference.Policy
	opts   Options
	tp     parsers.Parser
	rp     parsers.ReasoningParser
	log    *slog.Logger
	prefix string // reply id prefix, random per gateway
	seq    atomic.Uint64
	tools  toolCache

	mu       sync.Mutex
	sessions map[string]*Session
	engine   string // the engine's model name, once learned
	ctxLen   int    // its context window, once learned (0: unknown)
	learned  bool
}

var _ gateway.Completer = (*Gateway)(nil)

// New returns a gateway generating through policy. Policy must be a
// tokens-mode inference client; New fails on an unknown parser name.
func New(policy inference.Policy, opts Options) (*Gateway, error) {
	if policy == nil {
		return nil, errors.New("capture: no policy")
	}
	if m, ok := policy.(interface{ TokensMode() bool }); ok && !m.TokensMode() {
		return nil, errors.New("capture: the gateway needs a tokens-mode inference backend (vllm, vllm-generate, sglang, llamacpp, atropos), not chat")
	}
	if opts.Parser == "" {
		return nil, errors.New("capture: no tool-call parser named (Options.Parser)")
	}
	tp, err := parsers.Get(opts.Parser)
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	var rp parsers.ReasoningParser
	if opts.ReasoningParser != "" {
		if rp, err = parsers.GetReasoning(opts.ReasoningParser); err != nil {
			return nil, fmt.Errorf("capture: %w", err)
		}
	}
	opts = opts.withDefaults()
	if opts.Sampling.MaxTokens < 0 || opts.ContextLength < 0 || opts.IdleTimeout < 0 {
		return nil, errors.New("capture: negative max_tokens, context length or idle timeout")
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &Gateway{policy: policy, opts: opts, tp: tp, rp: rp, log: log, prefix: hex.EncodeToString(b[:]), sessions: map[string]*Session{}}, nil
}

// modelInfo returns the engine's model name and context window, learned
// once from the engine (a failure is not cached).
func (g *Gateway) modelInfo(ctx context.Context) (string, int, error) {
	g.mu.Lock()
	if g.learned {
		defer g.mu.Unlock()
		return g.engine, g.ctxLen, nil
	}
	g.mu.Unlock()
	name, n := "", 0
	if cr, ok := g.policy.(contextReporter); ok {
		var err error
		name, n, err = cr.Context(ctx, "")
		if err != nil {
			return "", 0, classify(fmt.Errorf("learn the engine's model and context: %w", err))
		}
	}
	if n == 0 {
		n = g.opts.ContextLength
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.engine, g.ctxLen, g.learned = name, n, true
	return name, n, nil
}

// served returns the model names a harness may call.
func (g *Gateway) served(ctx context.Context) ([]string, int, error) {
	name, n, err := g.modelInfo(ctx)
	if err != nil {
		return nil, 0, err
	}
	if len(g.opts.Models) > 0 {
		return g.opts.Models, n, nil
	}
	if name == "" {
		return nil, 0, gateway.Errorf(gateway.ErrUpstream, "", "the engine reports no model name and Options.Models is empty")
	}
	return []string{name}, n, nil
}

// Open starts a session. spec.ID names the rollout in engine request ids
// and logs (never the secret session id); spec.Group shares engine
// affinity across a group; spec.Model is the engine model ("" its first);
// spec.Tools and spec.Sampling are ignored (a harness's calls bring their
// tools; the gateway's Options.Sampling governs).
func (g *Gateway) Open(ctx context.Context, spec inference.EpisodeSpec) (*Session, error) {
	return g.open(ctx, spec, g.opts.Sampling, g.opts.MaxCallsPerSession)
}

// SessionOptions are one session's own settings (OpenWith).
type SessionOptions struct {
	// Sampling, when set, governs every generation of the session instead
	// of Options.Sampling (a trainer's per-group sampling). As with the
	// gateway's, what the harness sends is only recorded.
	Sampling *inference.Sampling
	// MaxCalls, when positive, is the session's call limit instead of
	// Options.MaxCallsPerSession.
	MaxCalls int
}

// OpenWith is Open with the session's own sampler and call limit.
func (g *Gateway) OpenWith(ctx context.Context, spec inference.EpisodeSpec, o SessionOptions) (*Session, error) {
	sampling := g.opts.Sampling
	if o.Sampling != nil {
		sampling = *o.Sampling
	}
	if sampling.MaxTokens < 0 || o.MaxCalls < 0 {
		return nil, gateway.Errorf(gateway.ErrBadRequest, "", "the session's max_tokens (%d) or call limit (%d) is negative", sampling.MaxTokens, o.MaxCalls)
	}
	maxCalls := g.opts.MaxCallsPerSession
	if o.MaxCalls > 0 {
		maxCalls = o.MaxCalls
	}
	return g.open(ctx, spec, sampling, maxCalls)
}

func (g *Gateway) open(ctx context.Context, spec inference.EpisodeSpec, sampling inference.Sampling, maxCalls int) (*Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id, err := newSessionID()
	if err != nil {
		return nil, fmt.Errorf("capture: session id: %w", err)
	}
	if spec.ID == "" {
		spec.ID = "gw" + strconv.FormatUint(g.seq.Add(1), 10)
	}
	spec.Tools, spec.Sampling = nil, sampling
	s := &Session{g: g, id: id, spec: spec, maxCalls: maxCalls, replies: map[string]*reply{}, toolIDs: map[string]*reply{}, unanchored: map[uint64]bool{}}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.sessions) >= g.opts.MaxSessions {
		return nil, gateway.Errorf(gateway.ErrOverloaded, "", "%d sessions open (the gateway's limit)", len(g.sessions))
	}
	if d := g.opts.IdleTimeout; d > 0 {
		// Armed under s.mu, which the expiry takes first: it never sees
		// the timer unassigned.
		s.mu.Lock()
		s.last = time.Now()
		s.timer = time.AfterFunc(d, s.expire)
		s.mu.Unlock()
	}
	g.sessions[id] = s
	return s, nil
}

// newSessionID is 160 random bits, base32: unguessable, URL-safe.
func newSessionID() (string, error) {
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "s" + base32.HexEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]), nil
}

func (g *Gateway) session(id string) (*Session, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.sessions[id]
	if !ok {
		return nil, gateway.Errorf(gateway.ErrSession, "", "no open session with this id")
	}
	return s, nil
}

// Sessions is the number of open sessions.
func (g *Gateway) Sessions() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.sessions)
}

// Complete answers one call of a session (gateway.Completer).
func (g *Gateway) Complete(ctx context.Context, session string, call gateway.Call) (gateway.Reply, error) {
	s, err := g.session(session)
	if err != nil {
		return gateway.Reply{}, err
	}
	return s.complete(ctx, call)
}

// Models lists the served models with the engine's context window.
func (g *Gateway) Models(ctx context.Context, session string) ([]gateway.Model, error) {
	if _, err := g.session(session); err != nil {
		return nil, err
	}
	names, n, err := g.served(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]gateway.Model, len(names))
	for i, name := range names {
		out[i] = gateway.Model{ID: name, ContextLength: n, OwnedBy: "rollout"}
	}
	return out, nil
}

// classify maps an inference error to the gateway's kinds, keeping the
// engine's message.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var ge *gateway.Error
	if errors.As(err, &ge) {
		return err
	}
	kind := gateway.ErrUpstream
	var ie *inference.Error
	switch {
	case errors.Is(err, inference.ErrContextLength):
		kind = gateway.ErrContextLength
	case errors.Is(err, inference.ErrRequest):
		kind = gateway.ErrBadRequest
	case errors.As(err, &ie) && (ie.Status == http.StatusTooManyRequests || ie.Status == http.StatusServiceUnavailable):
		kind = gateway.ErrOverloaded
	}
	return &gateway.Error{Kind: kind, Err: err}
}
