package runner

import (
	"fmt"
	"math"
)

// Atropos configures the Atropos bridge of a collection run: the run acts
// as one Atropos environment of the trajectory API at URL. Package atropos
// opens the bridge; only `rollout run` and run jobs use it.
type Atropos struct {
	// URL of the Atropos API (run-api). Empty: no bridge, unless the
	// server sets a default (`rollout serve --atropos-url`).
	URL string `yaml:"url,omitempty" json:"url,omitempty"`
	// Disabled sends nothing, even when the server sets a default URL.
	Disabled bool `yaml:"disabled,omitempty" json:"disabled,omitempty"`
	// AtroposKnobs are the bridge's own knobs. atropos.Options embeds the
	// same struct, so each knob is declared, defaulted and validated once.
	AtroposKnobs `yaml:",inline"`
}

// AtroposKnobs are the knobs of an Atropos bridge, the `atropos` keys of a
// run config beside url and disabled. Zero values take the defaults noted
// (WithDefaults).
type AtroposKnobs struct {
	// Name is sent as desired_name; the API answers with wandb_name
	// "<Name>_<k>". A run registers the env's name; a bridge opened
	// alone, "rollout".
	Name string `yaml:"name,omitempty" json:"name,omitempty"`
	// Weight is sent as weight (1.0).
	Weight float64 `yaml:"weight,omitempty" json:"weight,omitempty"`
	// MinBatchAllocation is sent as min_batch_allocation (nil: null).
	MinBatchAllocation *float64 `yaml:"min_batch_allocation,omitempty" json:"min_batch_allocation,omitempty"`
	// MaxTokenLength is sent as max_token_length; the API weights envs by
	// it (2048, BaseEnvConfig's default).
	MaxTokenLength int `yaml:"max_token_length,omitempty" json:"max_token_length,omitempty"`
	// MaxBatchesOffPolicy is the throttle: intake pauses while the groups
	// queued at the API plus the bridge's undelivered and admitted groups
	// hold at least MaxBatchesOffPolicy trainer batches (3, as Atropos).
	MaxBatchesOffPolicy int `yaml:"max_batches_off_policy,omitempty" json:"max_batches_off_policy,omitempty"`
	// TotalSteps stops intake once current_step plus the queued batches
	// exceed it. 0 takes num_steps from /register-env; negative: never.
	TotalSteps int `yaml:"total_steps,omitempty" json:"total_steps,omitempty"`
	// MaxPending bounds the groups spooled but not yet accepted by the API
	// (e.g. during an outage) plus the admitted groups still running;
	// intake pauses at the bound (256).
	MaxPending int `yaml:"max_pending,omitempty" json:"max_pending,omitempty"`
	// OmitMessages leaves the conversations (messages) out of the groups.
	OmitMessages bool `yaml:"omit_messages,omitempty" json:"omit_messages,omitempty"`
	// ZeroAdvantageOnTruncation sets overrides[i].set_advantage_to_zero on
	// rollouts stopped by the length limit.
	ZeroAdvantageOnTruncation bool `yaml:"zero_advantage_on_truncation,omitempty" json:"zero_advantage_on_truncation,omitempty"`
	// SendEqualScores sends groups whose scores are all equal; by default
	// they are skipped (counted), as Atropos' ensure_scores_are_not_same:
	// their advantages are all zero.
	SendEqualScores bool `yaml:"send_equal_scores,omitempty" json:"send_equal_scores,omitempty"`
	// ContinueOnReject keeps the run going after the API refused a group
	// (4xx); the group is in the dead letters either way. By default the
	// refusal stops intake and fails the run with the API's answer.
	ContinueOnReject bool `yaml:"continue_on_reject,omitempty" json:"continue_on_reject,omitempty"`
}

// WithDefaults returns k with its zero values replaced by the defaults
// noted on the fields.
func (k AtroposKnobs) WithDefaults() AtroposKnobs {
	if k.Name == "" {
		k.Name = "rollout"
	}
	if k.MaxTokenLength == 0 {
		k.MaxTokenLength = 2048
	}
	if k.Weight == 0 {
		k.Weight = 1
	}
	if k.MaxBatchesOffPolicy == 0 {
		k.MaxBatchesOffPolicy = 3
	}
	if k.MaxPending == 0 {
		k.MaxPending = 256
	}
	return k
}

// Validate refuses impossible knob values (zero is always allowed: the
// default). Errors name the knob by its YAML key below `atropos`; callers
// add their own prefix and error class.
func (k AtroposKnobs) Validate() error {
	switch {
	case math.IsNaN(k.Weight) || math.IsInf(k.Weight, 0) || k.Weight < 0:
		return fmt.Errorf("weight: %v; want a non-negative number", k.Weight)
	case k.MinBatchAllocation != nil && !(*k.MinBatchAllocation >= 0 && *k.MinBatchAllocation <= 1):
		return fmt.Errorf("min_batch_allocation: %v; want a fraction in [0, 1]", *k.MinBatchAllocation)
	case k.MaxTokenLength < 0:
		return fmt.Errorf("max_token_length: must not be negative")
	case k.MaxBatchesOffPolicy < 0:
		return fmt.Errorf("max_batches_off_policy: must not be negative")
	case k.MaxPending < 0:
		return fmt.Errorf("max_pending: must not be negative")
	}
	return nil
}
