package inference

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/internal/util/secrets"
)

// TeacherConfig is the teacher endpoint of on-policy distillation
// (docs/distillation.md): a vLLM server (or the simulator) that serves
// prompt_logprobs on /v1/completions for the student's vocabulary.
type TeacherConfig struct {
	// Endpoint is the teacher's base URL (with or without /v1).
	Endpoint string `yaml:"endpoint" json:"endpoint"`
	// Model is the served teacher model name.
	Model string `yaml:"model" json:"model"`
	// TopK teacher logprobs per completion token (default 20, vLLM's
	// default --max-logprobs; raise the server's limit for more).
	TopK int `yaml:"top_k,omitempty" json:"top_k,omitempty"`
	// APIKeyEnv names the environment variable holding the key.
	APIKeyEnv string `yaml:"api_key_env,omitempty" json:"api_key_env,omitempty"`
	// Timeout bounds one request (default 2m); Retries after a connection
	// error or 5xx (default 3; -1 disables).
	Timeout time.Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	Retries int           `yaml:"retries,omitempty" json:"retries,omitempty"`
	// Hints, when set, has a judge extract hints from what followed each
	// turn and the teacher score hinted turns under the hint-enhanced
	// context (HintTurns).
	Hints *HintConfig `yaml:"hints,omitempty" json:"hints,omitempty"`
}

// teacherIdleConns is how many idle connections a teacher keeps.
const teacherIdleConns = 1024

// Teacher scores token sequences with a teacher's prompt_logprobs.
type Teacher struct {
	cfg    TeacherConfig
	url    string
	apiKey string
	http   *http.Client
	hints  *hintSetup // nil without hints
}

// NewTeacher validates cfg and reads its keys' variables (internal/util/secrets).
func NewTeacher(cfg TeacherConfig) (*Teacher, error) {
	if cfg.Endpoint == "" || cfg.Model == "" {
		return nil, errors.New("distill: teacher endpoint and model are required")
	}
	if cfg.TopK == 0 {
		cfg.TopK = 20
	}
	if cfg.TopK < 1 {
		return nil, fmt.Errorf("distill: top_k %d must be positive", cfg.TopK)
	}
	if cfg.Timeout < 0 {
		return nil, errors.New("distill: timeout must not be negative")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	switch {
	case cfg.Retries == 0:
		cfg.Retries = 3
	case cfg.Retries < 0:
		cfg.Retries = 0
	}
	// A transport of its own, as a pool's: scores are asked for by many
	// rollouts at once, and net/http's default keeps two idle connections
	// per host (every further one is dialled and dropped); Close must not
	// close the default transport's connections for the whole process.
	t := &Teacher{cfg: cfg, http: &http.Client{Timeout: cfg.Timeout, Transport: newTransport(teacherIdleConns, nil)}}
	if cfg.APIKeyEnv != "" {
		var err error
		if t.apiKey, err = secrets.Lookup(cfg.APIKeyEnv); err != nil {
			return nil, fmt.Errorf("distill: api_key_env: %w", err)
		}
	}
	base, err := normalizeBase(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("distill: %w", err)
	}
	t.url = base + "/v1/completions"
	if cfg.Hints != nil {
		h, err := newHintSetup(cfg, base, t.apiKey)
		if err != nil {
			return nil, err
		}
		t.hints = h
	}
	return t, nil
}

// TopK is the number of teacher logprobs per scored position.
func (t *Teacher) TopK() int { return t.cfg.TopK }

// Close releases idle connections.
func (t *Teacher) Close() error {
	t.http.CloseIdleConnections()
	return nil
}

type teacherEntry struct {
	Logprob float64 `json:"logprob"`
	Rank    int     `json:"rank"`
}

type teacherResponse struct {
	Choices []struct {
		PromptLogprobs []map[string]*teacherEntry `json:"prompt_logprobs"`
	} `json:"choices"`
}

// Score asks the teacher for its top-K distribution at every position of
// ids (a completion request with the ids as the prompt, max_tokens 1 and
// prompt_logprobs K) and returns, for each position p in want, the K
// most likely token ids (by rank) and their logprobs given ids[:p]. Other
// positions get nil. Position 0 cannot be scored.
func (t *Teacher) Score(ctx context.Context, ids []int32, want func(p int) bool) ([][]int32, [][]float32, error) {
	if len(ids) < 2 {
		return nil, nil, &Error{Class: ErrRequest, Op: "POST /v1/completions", Msg: "distill: fewer than 2 tokens to score"}
	}
	body, err := json.Marshal(map[string]any{"model": t.cfg.Model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": t.cfg.TopK, "temperature": 0})
	if err != nil {
		return nil, nil, err
	}
	var resp teacherResponse
	if err := t.post(ctx, route{t.cfg.Endpoint, t.url, "POST /v1/completions", t.apiKey}, body, &resp); err != nil {
		return nil, nil, err
	}
	if len(resp.Choices) == 0 || len(resp.Choices[0].PromptLogprobs) != len(ids) {
		n := 0
		if len(resp.Choices) > 0 {
			n = len(resp.Choices[0].PromptLogprobs)
		}
		return nil, nil, &Error{Class: ErrInfra, Endpoint: t.cfg.Endpoint, Op: "POST /v1/completions", Msg: fmt.Sprintf("distill: teacher returned %d prompt_logprobs positions for %d tokens", n, len(ids))}
	}
	pl := resp.Choices[0].PromptLogprobs
	outIDs := make([][]int32, len(ids))
	outLPs := make([][]float32, len(ids))
	for p := range ids {
		if p == 0 || !want(p) {
			continue
		}
		type kv struct {
			id   int32
			rank int
			lp   float64
		}
		var top []kv
		for k, e := range pl[p] {
			if e == nil {
				continue
			}
			id, err := strconv.ParseInt(k, 10, 32)
			if err != nil || math.IsNaN(e.Logprob) || e.Logprob > 0 {
				return nil, nil, &Error{Class: ErrInfra, Endpoint: t.cfg.Endpoint, Op: "POST /v1/completions", Msg: fmt.Sprintf("distill: position %d: bad entry %q: %+v", p, k, *e)}
			}
			if e.Rank <= t.cfg.TopK {
				top = append(top, kv{int32(id), e.Rank, e.Logprob})
			}
		}
		if len(top) == 0 {
			return nil, nil, &Error{Class: ErrInfra, Endpoint: t.cfg.Endpoint, Op: "POST /v1/completions", Msg: fmt.Sprintf("distill: position %d has no teacher logprobs", p)}
		}
		sort.Slice(top, func(a, b int) bool { return top[a].rank < top[b].rank })
		outIDs[p] = make([]int32, len(top))
		outLPs[p] = make([]float32, len(top))
		for i, e := range top {
			outIDs[p][i], outLPs[p][i] = e.id, float32(e.lp)
		}
	}
	return outIDs, outLPs, nil
}

// route is one URL the teacher posts to: its own completions route, its
// /tokenize, or the hint judge's chat route (with the judge's key).
type route struct {
	endpoint, url, op, apiKey string
}

// post sends body along r, retrying a connection error or a 5xx, and
// decodes the answer into out.
func (t *Teacher) post(ctx context.Context, r route, body []byte, out any) error {
	op := r.op
	var last error
	var floor time.Duration // a 429's Retry-After
	for attempt := 0; attempt <= t.cfg.Retries; attempt++ {
		if attempt > 0 {
			d := time.Duration(200<<attempt)*time.Millisecond + time.Duration(rand.Int64N(int64(100*time.Millisecond)))
			d, floor = max(d, floor), 0
			select {
			case <-ctx.Done():
				return &Error{Class: ErrInfra, Endpoint: r.endpoint, Op: op, Msg: "distill: cancelled", Err: ctx.Err()}
			case <-time.After(d):
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
		if err != nil {
			return &Error{Class: ErrRequest, Endpoint: r.endpoint, Op: op, Msg: "distill: build request", Err: err}
		}
		req.Header.Set("Content-Type", "application/json")
		if r.apiKey != "" {
			req.Header.Set("Authorization", "Bearer "+r.apiKey)
		}
		resp, err := t.http.Do(req)
		if err != nil {
			last = &Error{Class: ErrInfra, Endpoint: r.endpoint, Op: op, Msg: "distill: unreachable", Err: err}
			if ctx.Err() != nil {
				return last
			}
			continue
		}
		data, err := io.ReadAll(io.LimitReader(resp.Body, 512<<20))
		resp.Body.Close()
		switch {
		case err != nil:
			last = &Error{Class: ErrInfra, Endpoint: r.endpoint, Op: op, Status: resp.StatusCode, Msg: "distill: read response", Err: err}
			continue
		case resp.StatusCode >= 500:
			last = &Error{Class: ErrInfra, Endpoint: r.endpoint, Op: op, Status: resp.StatusCode, Msg: "distill: " + serverMessage(data)}
			continue
		case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout:
			// Overload (a hosted teacher's or judge's rate limit), not a
			// bad request; scoring and judging are safe to send again.
			last = &Error{Class: ErrInfra, Endpoint: r.endpoint, Op: op, Status: resp.StatusCode, Msg: "distill: " + serverMessage(data)}
			floor = retryAfter(resp.Header)
			continue
		case resp.StatusCode != http.StatusOK:
			return &Error{Class: ErrRequest, Endpoint: r.endpoint, Op: op, Status: resp.StatusCode, Msg: "distill: " + serverMessage(data)}
		}
		if err := json.Unmarshal(data, out); err != nil {
			return &Error{Class: ErrInfra, Endpoint: r.endpoint, Op: op, Status: resp.StatusCode, Msg: "distill: malformed response: " + snippet(data), Err: err}
		}
		return nil
	}
	return last
}

// Ready is the teacher's start check: the student's (Client.Ready, on a
// client of the teacher's endpoint and model) for the teacher and then,
// when it is another server or model, the hint judge. The error names
// which failed and wraps ErrModelNotServed, ErrEndpointRefused (401/403)
// or ErrUnreachable (no answer within wait).
func (t *Teacher) Ready(ctx context.Context, wait time.Duration) error {
	type check struct{ role, endpoint, model, apiKey string }
	checks := []check{{"distill teacher", t.cfg.Endpoint, t.cfg.Model, t.apiKey}}
	if h := t.hints; h != nil && (h.judge.endpoint != t.cfg.Endpoint || h.model != t.cfg.Model) {
		checks = append(checks, check{"distill hint judge", h.judge.endpoint, h.model, h.judge.apiKey})
	}
	for _, c := range checks {
		cl, err := Open(Config{Backend: BackendChat, Endpoints: []string{c.endpoint}, Model: c.model, APIKey: c.apiKey, ReadyTimeout: wait})
		if err == nil {
			err = cl.Ready(ctx, 0)
			_ = cl.Close()
		}
		if err != nil {
			return fmt.Errorf("%s start check: %w", c.role, err)
		}
	}
	return nil
}

// maxRetryAfter caps the wait a server's Retry-After asks for.
const maxRetryAfter = 30 * time.Second

// retryAfter reads a Retry-After header given in seconds (the form rate
// limiters send), capped at maxRetryAfter; 0 when absent or a date.
func retryAfter(h http.Header) time.Duration {
	secs, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After")))
	if err != nil || secs <= 0 {
		return 0
	}
	return min(time.Duration(secs)*time.Second, maxRetryAfter)
}
