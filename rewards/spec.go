package rewards

import (
	"fmt"
	"strings"
	"time"
)

// Spec names a reward in configuration (YAML envs). Type selects the
// reward; the other fields are its parameters.
type Spec struct {
	Type   string  `yaml:"type" json:"type"`
	Name   string  `yaml:"name,omitempty" json:"name,omitempty"`
	Weight float64 `yaml:"weight,omitempty" json:"weight,omitempty"`

	// exit_code, tests_passed
	Command string        `yaml:"command,omitempty" json:"command,omitempty"`
	Cwd     string        `yaml:"cwd,omitempty" json:"cwd,omitempty"`
	Want    any           `yaml:"want,omitempty" json:"want,omitempty"` // exit code (int) or file content (string)
	Timeout time.Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	Report  string        `yaml:"report,omitempty" json:"report,omitempty"`

	// file_content
	Path      string `yaml:"path,omitempty" json:"path,omitempty"`
	Mode      string `yaml:"mode,omitempty" json:"mode,omitempty"`
	TrimSpace bool   `yaml:"trim_space,omitempty" json:"trim_space,omitempty"`

	// numeric_match
	RelTol float64 `yaml:"rel_tol,omitempty" json:"rel_tol,omitempty"`
	AbsTol float64 `yaml:"abs_tol,omitempty" json:"abs_tol,omitempty"`

	// format, match_fraction
	Regex        string `yaml:"regex,omitempty" json:"regex,omitempty"`
	MaxChars     int    `yaml:"max_chars,omitempty" json:"max_chars,omitempty"`
	RequireBoxed bool   `yaml:"require_boxed,omitempty" json:"require_boxed,omitempty"`

	// llm_judge
	BaseURL string `yaml:"base_url,omitempty" json:"base_url,omitempty"`
	Model   string `yaml:"model,omitempty" json:"model,omitempty"`
	Prompt  string `yaml:"prompt,omitempty" json:"prompt,omitempty"`
	Retries int    `yaml:"retries,omitempty" json:"retries,omitempty"`
}

// Types lists the reward types a Spec may name.
var Types = []string{"exit_code", "file_content", "tests_passed", "numeric_match", "format", "match_fraction", "llm_judge"}

// Build turns one spec into a Reward.
func Build(s Spec) (Reward, error) {
	switch s.Type {
	case "exit_code":
		want := 0
		if s.Want != nil {
			n, ok := s.Want.(int)
			if !ok {
				return nil, fmt.Errorf("exit_code: want must be an integer, got %v", s.Want)
			}
			want = n
		}
		if s.Command == "" {
			return nil, fmt.Errorf("exit_code: command is required")
		}
		return ExitCode{Command: s.Command, Cwd: s.Cwd, Want: want, Timeout: s.Timeout}, nil
	case "file_content":
		want, ok := s.Want.(string)
		if !ok {
			return nil, fmt.Errorf("file_content %s: want must be a string", s.Path)
		}
		return NewFileContent(s.Path, s.Mode, want, s.TrimSpace)
	case "tests_passed":
		if s.Command == "" || s.Report == "" {
			return nil, fmt.Errorf("tests_passed: command and report are required")
		}
		return TestsPassed{Command: s.Command, Cwd: s.Cwd, Report: s.Report, Timeout: s.Timeout}, nil
	case "numeric_match":
		return NumericMatch{RelTol: s.RelTol, AbsTol: s.AbsTol}, nil
	case "format":
		return NewFormat(s.Regex, s.MaxChars, s.RequireBoxed)
	case "match_fraction":
		return NewMatchFraction(s.Regex)
	case "llm_judge":
		return NewJudge(Judge{BaseURL: s.BaseURL, Model: s.Model, Prompt: s.Prompt, Retries: s.Retries, Timeout: s.Timeout})
	case "":
		return nil, fmt.Errorf("reward type is required (one of %s)", strings.Join(Types, ", "))
	}
	return nil, fmt.Errorf("unknown reward type %q (one of %s)", s.Type, strings.Join(Types, ", "))
}

// BuildSum turns specs into a weighted Sum. A spec without a weight weighs
// 1; names default to the type, made unique with a suffix.
func BuildSum(specs []Spec) (Sum, error) {
	if len(specs) == 0 {
		return nil, fmt.Errorf("no rewards configured")
	}
	seen := map[string]int{}
	out := make(Sum, 0, len(specs))
	for i, s := range specs {
		r, err := Build(s)
		if err != nil {
			return nil, fmt.Errorf("rewards[%d]: %w", i, err)
		}
		name := s.Name
		if name == "" {
			name = s.Type
		}
		seen[name]++
		if seen[name] > 1 {
			name = fmt.Sprintf("%s_%d", name, seen[name])
		}
		w := s.Weight
		if w == 0 {
			w = 1
		}
		out = append(out, Part{Name: name, Weight: w, Reward: r})
	}
	return out, nil
}
