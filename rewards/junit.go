package rewards

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
)

// TestsPassed runs a test command that writes a JUnit XML report (pytest
// --junitxml) and scores the fraction of tests that passed. Skipped tests do
// not count. A run that produced no report scores 0 with tests_total = 0:
// the code under test did not even collect (a model failure), unless the
// command could not start at all, which is an error.
type TestsPassed struct {
	Command string // e.g. "python3 -m pytest -q --junitxml=/tmp/junit.xml tests"
	Cwd     string
	Report  string // path of the JUnit XML file inside the sandbox
	Timeout time.Duration
}

var _ Reward = TestsPassed{}

// Score implements Reward.
func (r TestsPassed) Score(ctx context.Context, in Input) (Score, error) {
	if err := needBox(in, "tests_passed"); err != nil {
		return Score{}, err
	}
	res, err := exec(ctx, in, sandbox.ExecRequest{Command: r.Command, Cwd: r.Cwd, Timeout: orDefault(r.Timeout, 5*time.Minute)})
	if err != nil {
		return Score{}, err
	}
	comps := map[string]float64{"exit_code": float64(res.ExitCode)}
	if res.TimedOut {
		comps["timed_out"] = 1
	}
	data, err := in.Box.ReadFile(ctx, r.Report)
	if errors.Is(err, sandbox.ErrNotFound) {
		comps["tests_total"] = 0
		return Score{Value: 0, Components: comps}, nil
	}
	if err != nil {
		return Score{}, fmt.Errorf("%w: read %s: %w", ErrReward, r.Report, err)
	}
	c, err := ParseJUnit(data)
	if err != nil {
		// A report the test runner wrote but we cannot read is not the
		// model's fault.
		return Score{}, fmt.Errorf("%w: %s: %w", ErrReward, r.Report, err)
	}
	comps["tests_total"] = float64(c.Total)
	comps["tests_passed"] = float64(c.Passed)
	comps["tests_failed"] = float64(c.Failed)
	comps["tests_skipped"] = float64(c.Skipped)
	v := 0.0
	if c.Total > 0 {
		v = float64(c.Passed) / float64(c.Total)
	}
	return Score{Value: v, Components: comps}, nil
}

// JUnitCounts counts test cases of a JUnit report. Total excludes skipped.
type JUnitCounts struct {
	Total, Passed, Failed, Skipped int
}

type junitCase struct {
	Failure []struct{} `xml:"failure"`
	Error   []struct{} `xml:"error"`
	Skipped []struct{} `xml:"skipped"`
}

type junitSuite struct {
	Cases  []junitCase  `xml:"testcase"`
	Suites []junitSuite `xml:"testsuite"`
}

// ParseJUnit counts the test cases of a JUnit XML document, whether its
// root is <testsuites> or <testsuite>, with suites nested at any depth.
func ParseJUnit(data []byte) (JUnitCounts, error) {
	var root junitSuite
	if err := xml.Unmarshal(data, &root); err != nil {
		return JUnitCounts{}, fmt.Errorf("parse JUnit XML: %w", err)
	}
	var c JUnitCounts
	var walk func(s junitSuite)
	walk = func(s junitSuite) {
		for _, tc := range s.Cases {
			switch {
			case len(tc.Skipped) > 0:
				c.Skipped++
			case len(tc.Failure) > 0 || len(tc.Error) > 0:
				c.Failed++
				c.Total++
			default:
				c.Passed++
				c.Total++
			}
		}
		for _, sub := range s.Suites {
			walk(sub)
		}
	}
	walk(root)
	return c, nil
}
