package atropos

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/runner"
)

// Options configure a Bridge. Zero values take the defaults noted.
type Options struct {
	// URL of the Atropos trajectory API (run-api), e.g.
	// http://localhost:8000. Required.
	URL string
	// SpoolDir holds the on-disk spool: every group is written there
	// before it is sent and stays until the API accepted it; dead letters
	// (groups the API refused) go to SpoolDir/rejected.jsonl. Required.
	// One bridge per directory.
	SpoolDir string
	// GroupSize is the registered group_size: the run's rollouts per item
	// (runner.Config.GroupSize). Required. It must divide the trainer's
	// batch size.
	GroupSize int

	// AtroposKnobs are the knobs a run config sets (its atropos keys):
	// name, weight, min_batch_allocation, max_token_length, the throttle
	// (max_batches_off_policy, max_pending, total_steps) and what is sent.
	// Their defaults and validation are the struct's own.
	runner.AtroposKnobs

	// PollInterval is the /status-env period (500ms; Atropos envs use
	// 100ms).
	PollInterval time.Duration
	// RegisterInterval is the wait between /register-env attempts while
	// the trainer has not started (1s).
	RegisterInterval time.Duration
	// RetryMin and RetryMax bound the jittered exponential backoff between
	// failed sends and while the API is unreachable (250ms, 10s).
	RetryMin, RetryMax time.Duration
	// RequestTimeout bounds one HTTP request (60s).
	RequestTimeout time.Duration
	// ListBatch is the most groups sent in one /scored_data_list request
	// when several are waiting (8); 1 sends every group to /scored_data.
	ListBatch int

	// AllowMissingLogprobs sends groups without inference_logprobs; by
	// default such a group is a configuration error, because the reference
	// GRPO trainer raises on it.
	AllowMissingLogprobs bool
	// HTTPClient sends the requests (default: a client with its own
	// transport, whose idle connections Close releases).
	HTTPClient *http.Client
	// Logger receives the bridge's logs (slog.Default()).
	Logger *slog.Logger

	// segmentBytes rotates spool segments (64 MiB); tests lower it.
	segmentBytes int64
}

func (o *Options) defaults() {
	o.AtroposKnobs = o.AtroposKnobs.WithDefaults()
	if o.PollInterval == 0 {
		o.PollInterval = 500 * time.Millisecond
	}
	if o.RegisterInterval == 0 {
		o.RegisterInterval = time.Second
	}
	if o.RetryMin == 0 {
		o.RetryMin = 250 * time.Millisecond
	}
	if o.RetryMax == 0 {
		o.RetryMax = 10 * time.Second
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = time.Minute
	}
	if o.ListBatch == 0 {
		o.ListBatch = 8
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.segmentBytes == 0 {
		o.segmentBytes = 64 << 20
	}
}

func (o *Options) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	u, err := url.Parse(o.URL)
	switch {
	case o.URL == "":
		return bad("URL: required (the Atropos API, e.g. http://localhost:8000)")
	case err != nil:
		return bad("URL %q: %v", o.URL, err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return bad("URL %q: want http(s)://host[:port]", o.URL)
	case o.SpoolDir == "":
		return bad("SpoolDir: required")
	case o.GroupSize <= 0:
		return bad("GroupSize: must be positive, got %d", o.GroupSize)
	case o.PollInterval < 0, o.RegisterInterval < 0, o.RetryMin < 0, o.RetryMax < o.RetryMin, o.RequestTimeout < 0:
		return bad("intervals must be positive and RetryMin <= RetryMax")
	case o.ListBatch < 0:
		return bad("ListBatch: must not be negative")
	}
	if err := o.AtroposKnobs.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	o.URL = strings.TrimRight(o.URL, "/")
	return nil
}
