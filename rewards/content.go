package rewards

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/rollout-rl/rollout/sandbox"
)

// Match modes for FileContent.
const (
	MatchExact    = "exact"
	MatchContains = "contains"
	MatchRegex    = "regex"
)

// FileContent scores 1 when a file in the sandbox matches. A missing file
// scores 0 (the model did not create it); it is not an error.
type FileContent struct {
	Path string
	Mode string // exact (default), contains, regex
	Want string
	// TrimSpace compares with surrounding whitespace removed (exact mode).
	TrimSpace bool
	re        *regexp.Regexp
}

// NewFileContent validates the mode and compiles a regex once.
func NewFileContent(path, mode, want string, trim bool) (*FileContent, error) {
	r := &FileContent{Path: path, Mode: mode, Want: want, TrimSpace: trim}
	if r.Mode == "" {
		r.Mode = MatchExact
	}
	switch r.Mode {
	case MatchExact, MatchContains:
	case MatchRegex:
		re, err := regexp.Compile(want)
		if err != nil {
			return nil, fmt.Errorf("file_content %s: bad regex: %w", path, err)
		}
		r.re = re
	default:
		return nil, fmt.Errorf("file_content %s: unknown mode %q (want exact, contains or regex)", path, mode)
	}
	if path == "" {
		return nil, errors.New("file_content: path is empty")
	}
	return r, nil
}

var _ Reward = (*FileContent)(nil)

// Score implements Reward.
func (r *FileContent) Score(ctx context.Context, in Input) (Score, error) {
	if err := needBox(in, "file_content"); err != nil {
		return Score{}, err
	}
	data, err := in.Box.ReadFile(ctx, r.Path)
	if errors.Is(err, sandbox.ErrNotFound) {
		return boolScore(false, map[string]float64{"file_exists": 0}), nil
	}
	if err != nil {
		return Score{}, fmt.Errorf("%w: read %s: %w", ErrReward, r.Path, err)
	}
	var ok bool
	switch r.Mode {
	case MatchContains:
		ok = bytes.Contains(data, []byte(r.Want))
	case MatchRegex:
		ok = r.re.Match(data)
	default:
		if r.TrimSpace {
			ok = string(bytes.TrimSpace(data)) == string(bytes.TrimSpace([]byte(r.Want)))
		} else {
			ok = string(data) == r.Want
		}
	}
	return boolScore(ok, map[string]float64{"file_exists": 1}), nil
}
