package rewards

import (
	"context"
	"fmt"
	"regexp"
	"unicode/utf8"
)

// MatchFraction is a dense reward: the fraction of the final message's
// characters (runes) covered by the leftmost non-overlapping matches of
// Regex, in [0, 1]. An empty final message scores 0. It suits toy envs
// for training tests, where a binary reward gives a tiny random model too
// little signal (examples/grpo-cpu).
type MatchFraction struct {
	Regex string
	re    *regexp.Regexp
}

// NewMatchFraction compiles the regex once.
func NewMatchFraction(regex string) (*MatchFraction, error) {
	if regex == "" {
		return nil, fmt.Errorf("match_fraction: regex is required")
	}
	re, err := regexp.Compile(regex)
	if err != nil {
		return nil, fmt.Errorf("match_fraction: bad regex: %w", err)
	}
	return &MatchFraction{Regex: regex, re: re}, nil
}

var _ Reward = (*MatchFraction)(nil)

// Score implements Reward.
func (m *MatchFraction) Score(_ context.Context, in Input) (Score, error) {
	total := utf8.RuneCountInString(in.Final)
	if total == 0 {
		return Score{Value: 0, Components: map[string]float64{}}, nil
	}
	covered := 0
	for _, loc := range m.re.FindAllStringIndex(in.Final, -1) {
		covered += utf8.RuneCountInString(in.Final[loc[0]:loc[1]])
	}
	return Score{Value: float64(covered) / float64(total), Components: map[string]float64{}}, nil
}
