package atropos

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"
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

	// Name is sent as desired_name; the API answers with wandb_name
	// "<Name>_<k>" ("rollout").
	Name string
	// MaxTokenLength is sent as max_token_length; the API weights envs by
	// it (2048, BaseEnvConfig's default).
	MaxTokenLength int
	// Weight is sent as weight (1.0).
	Weight float64
	// MinBatchAllocation is sent as min_batch_allocation (nil: null).
	MinBatchAllocation *float64

	// MaxBatchesOffPolicy is the throttle: intake pauses while the groups
	// queued at the API plus this bridge's undelivered and admitted groups
	// hold at least MaxBatchesOffPolicy trainer batches (3, as Atropos).
	MaxBatchesOffPolicy int
	// TotalSteps stops intake once current_step plus the queued batches
	// exceed it. 0 takes num_steps from /register-env; negative: never.
	TotalSteps int
	// MaxPending bounds the groups spooled but not yet accepted by the API
	// (e.g. during an outage) plus the admitted groups still running;
	// intake pauses at the bound (256).
	MaxPending int

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

	// OmitMessages leaves the conversations (messages) out of the groups.
	OmitMessages bool
	// ZeroAdvantageOnTruncation sets overrides[i].set_advantage_to_zero on
	// rollouts stopped by the length limit.
	ZeroAdvantageOnTruncation bool
	// SendEqualScores sends groups whose scores are all equal; by default
	// they are skipped (counted), as Atropos' ensure_scores_are_not_same:
	// their advantages are all zero.
	SendEqualScores bool
	// AllowMissingLogprobs sends groups without inference_logprobs; by
	// default such a group is a configuration error, because the reference
	// GRPO trainer raises on it.
	AllowMissingLogprobs bool
	// ContinueOnReject keeps the run going after the API refused a group
	// (4xx); the group is in the dead letters either way. By default the
	// refusal stops intake and fails the run with the API's answer.
	ContinueOnReject bool

	// HTTPClient sends the requests (default: a client with its own
	// transport, whose idle connections Close releases).
	HTTPClient *http.Client
	// Logger receives the bridge's logs (slog.Default()).
	Logger *slog.Logger

	// segmentBytes rotates spool segments (64 MiB); tests lower it.
	segmentBytes int64
}

func (o *Options) defaults() {
	if o.Name == "" {
		o.Name = "rollout"
	}
	if o.MaxTokenLength == 0 {
		o.MaxTokenLength = 2048
	}
	if o.Weight == 0 {
		o.Weight = 1
	}
	if o.MaxBatchesOffPolicy == 0 {
		o.MaxBatchesOffPolicy = 3
	}
	if o.MaxPending == 0 {
		o.MaxPending = 256
	}
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
	case o.MaxTokenLength < 0:
		return bad("MaxTokenLength: must not be negative")
	case o.MinBatchAllocation != nil && (*o.MinBatchAllocation < 0 || *o.MinBatchAllocation > 1):
		return bad("MinBatchAllocation: must be within [0, 1], got %v", *o.MinBatchAllocation)
	case o.MaxBatchesOffPolicy < 0:
		return bad("MaxBatchesOffPolicy: must not be negative")
	case o.MaxPending < 0:
		return bad("MaxPending: must not be negative")
	case o.PollInterval < 0, o.RegisterInterval < 0, o.RetryMin < 0, o.RetryMax < o.RetryMin, o.RequestTimeout < 0:
		return bad("intervals must be positive and RetryMin <= RetryMax")
	case o.ListBatch < 0:
		return bad("ListBatch: must not be negative")
	}
	o.URL = strings.TrimRight(o.URL, "/")
	return nil
}
