package runner

import (
	"fmt"
	"math"
	"time"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/parsers"
)

// DefaultMaxInfraFailedFraction is max_infra_failed_fraction's default.
const DefaultMaxInfraFailedFraction = 0.5

// MaxInfraFailed is max_infra_failed_fraction with its default.
func (c Config) MaxInfraFailed() float64 {
	if c.MaxInfraFailedFraction == nil {
		return DefaultMaxInfraFailedFraction
	}
	return *c.MaxInfraFailedFraction
}

// validateRanges range-checks the numeric fields that Validate's first
// pass does not: durations, sampling, inference knobs, dataset and eval
// fields, the Atropos keys and the exit policy. Errors name the field by
// its YAML path. Zero means "the default" wherever a default exists, so
// only impossible values are refused.
func (c Config) validateRanges(bad func(field, format string, args ...any) error) error {
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"rollout_timeout", time.Duration(c.RolloutTimeout)},
		{"reward_timeout", time.Duration(c.RewardTimeout)},
		{"inference.timeout", c.Inference.Timeout},
		{"inference.backoff_base", c.Inference.BackoffBase},
		{"inference.backoff_max", c.Inference.BackoffMax},
		{"inference.breaker_cooldown", c.Inference.BreakerCooldown},
		{"inference.health_timeout", c.Inference.HealthTimeout},
		{"inference.ready_timeout", c.Inference.ReadyTimeout},
		{"inference.unreachable_timeout", c.Inference.UnreachableTimeout},
	} {
		if d.v < 0 {
			return bad(d.field, "%s is negative; want a positive duration (e.g. 90s), or leave it unset for the default", d.v)
		}
	}
	if err := c.Async.validate(bad); err != nil {
		return err
	}
	if b, m := c.Inference.BackoffBase, c.Inference.BackoffMax; b > 0 && m > 0 && b > m {
		return bad("inference.backoff_base", "%s exceeds inference.backoff_max %s", b, m)
	}
	switch {
	case c.Inference.Retries < -1:
		return bad("inference.retries", "%d; want -1 (no retries), 0 (the default, 3) or positive", c.Inference.Retries)
	case c.Inference.BreakerFailures < 0:
		return bad("inference.breaker_failures", "must not be negative (0 = the default, 5)")
	case c.Inference.MaxConcurrentPerEndpoint < 0:
		return bad("inference.max_concurrent_per_endpoint", "must not be negative (0 = no cap)")
	case c.MaxConsecutiveInvalid < 0:
		return bad("max_consecutive_invalid", "must not be negative (0 = the default, 5)")
	case c.Output.MaxRowsPerFile < 0:
		return bad("output.max_rows_per_file", "must not be negative (0 = the default, 10000)")
	case c.Eval.K < 0:
		return bad("eval.k", "must not be negative (0 = the group size)")
	case !finite(c.Eval.PassThreshold):
		return bad("eval.pass_threshold", "%v is not a number", c.Eval.PassThreshold)
	case c.Dataset.Offset < 0:
		return bad("dataset.offset", "must not be negative")
	case c.Dataset.Limit < 0:
		return bad("dataset.limit", "must not be negative (0 = every item)")
	case c.Dataset.Epochs < 0:
		return bad("dataset.epochs", "must not be negative (0 = 1)")
	case c.PolicyVersion != nil && *c.PolicyVersion < 0:
		return bad("policy_version", "must not be negative")
	}
	if c.Parser != "" {
		if _, err := parsers.Get(c.Parser); err != nil {
			return bad("parser", "%v", err)
		}
	}
	if c.ReasoningParser != "" {
		if _, err := parsers.GetReasoning(c.ReasoningParser); err != nil {
			return bad("reasoning_parser", "%v", err)
		}
	}
	if f := c.Inference.MaxUnscoredShare; f != nil && (!finite(*f) || *f < 0 || *f > 1) {
		return bad("inference.max_unscored_share", "%v: want a share between 0 and 1", *f)
	}
	if f := c.MaxInfraFailedFraction; f != nil && (!finite(*f) || *f < 0 || *f > 1) {
		return bad("max_infra_failed_fraction", "%v; want a fraction in [0, 1]", *f)
	}
	if err := validSampling("sampling", c.Sampling, bad); err != nil {
		return err
	}
	if err := validSampling("inference.sampling", c.Inference.Sampling, bad); err != nil {
		return err
	}
	if err := c.Atropos.AtroposKnobs.Validate(); err != nil {
		return fmt.Errorf("%w: atropos.%w", ErrConfig, err)
	}
	return nil
}

// validSampling range-checks the sampling fields a server would refuse (or
// worse, accept with a meaning nobody asked for) with prefix's YAML path.
func validSampling(prefix string, s inference.Sampling, bad func(field, format string, args ...any) error) error {
	f := func(name string) string { return prefix + "." + name }
	switch {
	case s.Temperature != nil && (!finite(*s.Temperature) || *s.Temperature < 0):
		return bad(f("temperature"), "%v; want a number ≥ 0", *s.Temperature)
	case s.TopP != nil && (!finite(*s.TopP) || *s.TopP <= 0 || *s.TopP > 1):
		return bad(f("top_p"), "%v; want a number in (0, 1]", *s.TopP)
	case s.TopK != nil && *s.TopK < -1:
		return bad(f("top_k"), "%d; want -1 or 0 (off) or a positive count", *s.TopK)
	case s.MinP != nil && (!finite(*s.MinP) || *s.MinP < 0 || *s.MinP > 1):
		return bad(f("min_p"), "%v; want a number in [0, 1]", *s.MinP)
	case s.MaxTokens < 0:
		return bad(f("max_tokens"), "%d; want at least 1 (or leave it unset for the server's limit)", s.MaxTokens)
	case s.RepetitionPenalty != nil && (!finite(*s.RepetitionPenalty) || *s.RepetitionPenalty <= 0):
		return bad(f("repetition_penalty"), "%v; want a number > 0 (1 = off)", *s.RepetitionPenalty)
	case s.PresencePenalty != nil && (!finite(*s.PresencePenalty) || *s.PresencePenalty < -2 || *s.PresencePenalty > 2):
		return bad(f("presence_penalty"), "%v; want a number in [-2, 2] (0 = off)", *s.PresencePenalty)
	case s.FrequencyPenalty != nil && (!finite(*s.FrequencyPenalty) || *s.FrequencyPenalty < -2 || *s.FrequencyPenalty > 2):
		return bad(f("frequency_penalty"), "%v; want a number in [-2, 2] (0 = off)", *s.FrequencyPenalty)
	}
	for i, st := range s.Stop {
		if st == "" {
			return bad(fmt.Sprintf("%s[%d]", f("stop"), i), "an empty stop string would end every generation at once")
		}
	}
	return nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
