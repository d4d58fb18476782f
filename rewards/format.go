package rewards

import (
	"context"
	"fmt"
	"regexp"
	"strings"
)

// Format scores 1 when the final message has the required shape: it
// matches Regex (when set), is at most MaxChars long (when set), and — when
// RequireBoxed — holds a \boxed{} answer.
type Format struct {
	Regex        string
	MaxChars     int
	RequireBoxed bool
	re           *regexp.Regexp
}

// NewFormat compiles the regex once.
func NewFormat(regex string, maxChars int, requireBoxed bool) (*Format, error) {
	f := &Format{Regex: regex, MaxChars: maxChars, RequireBoxed: requireBoxed}
	if regex != "" {
		re, err := regexp.Compile(regex)
		if err != nil {
			return nil, fmt.Errorf("format: bad regex: %w", err)
		}
		f.re = re
	}
	return f, nil
}

var _ Reward = (*Format)(nil)

// Score implements Reward.
func (f *Format) Score(_ context.Context, in Input) (Score, error) {
	ok := true
	if f.re != nil && !f.re.MatchString(in.Final) {
		ok = false
	}
	if f.MaxChars > 0 && len([]rune(in.Final)) > f.MaxChars {
		ok = false
	}
	if f.RequireBoxed && !strings.Contains(in.Final, `\boxed{`) {
		ok = false
	}
	return boolScore(ok, nil), nil
}
