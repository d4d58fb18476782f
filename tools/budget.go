package tools

import (
	"context"
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// Budget bounds what tool results cost the context window (Hermes §7).
type Budget struct {
	// DefaultResultChars is the per-result threshold (default 100,000).
	DefaultResultChars int `json:"default_result_chars" yaml:"default_result_chars"`
	// TurnChars is the per-turn budget over all tool results of a turn
	// (default 200,000); the largest results are spilled first.
	TurnChars int `json:"turn_chars" yaml:"turn_chars"`
	// PreviewChars is the preview kept in place of a spilled result.
	PreviewChars int `json:"preview_chars" yaml:"preview_chars"`
	// Overrides are per-tool thresholds; a negative value disables spilling.
	Overrides map[string]int `json:"overrides,omitempty" yaml:"overrides,omitempty"`
	// Dir is where spilled results go inside the sandbox.
	Dir string `json:"dir" yaml:"dir"`
}

// Budget defaults.
const (
	DefaultResultChars = 100_000
	DefaultTurnChars   = 200_000
	DefaultPreview     = 1_500
	DefaultResultsDir  = "/tmp/hermes-results"
	persistedTag       = "<persisted-output>"
)

// DefaultBudget is Hermes' DEFAULT_BUDGET.
func DefaultBudget() Budget {
	return Budget{DefaultResultChars: DefaultResultChars, TurnChars: DefaultTurnChars, PreviewChars: DefaultPreview, Dir: DefaultResultsDir}
}

func (b Budget) withDefaults() Budget {
	if b.DefaultResultChars == 0 {
		b.DefaultResultChars = DefaultResultChars
	}
	if b.TurnChars == 0 {
		b.TurnChars = DefaultTurnChars
	}
	if b.PreviewChars <= 0 {
		b.PreviewChars = DefaultPreview
	}
	if b.Dir == "" {
		b.Dir = DefaultResultsDir
	}
	return b
}

// Threshold returns the per-result threshold for a tool; negative means
// unlimited. read_file is pinned to unlimited: spilling its output would
// make the model read the spill file, which would spill again.
func (b Budget) Threshold(t Tool) int {
	b = b.withDefaults()
	if t.Name == "read_file" {
		return -1
	}
	if v, ok := b.Overrides[t.Name]; ok {
		return v
	}
	if t.MaxResultChars != 0 {
		return t.MaxResultChars
	}
	return b.DefaultResultChars
}

// ApplyResult enforces the per-result threshold on one result.
func (b Budget) ApplyResult(ctx context.Context, rt *Runtime, t Tool, callID, content string) string {
	th := b.Threshold(t)
	if th < 0 || len(content) <= th || utf8.RuneCountInString(content) <= th {
		return content
	}
	return b.persist(ctx, rt, callID, content)
}

// ApplyTurn enforces the per-turn budget: while the turn's results exceed
// it, the largest not-yet-spilled result is spilled. contents are rewritten
// in place; ids are the matching tool_call ids.
func (b Budget) ApplyTurn(ctx context.Context, rt *Runtime, ids []string, contents []string) {
	b = b.withDefaults()
	if b.TurnChars < 0 {
		return
	}
	sizes := make([]int, len(contents))
	total := 0
	for i, c := range contents {
		sizes[i] = utf8.RuneCountInString(c)
		total += sizes[i]
	}
	if total <= b.TurnChars {
		return
	}
	order := make([]int, len(contents))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(x, y int) bool { return sizes[order[x]] > sizes[order[y]] })
	for _, i := range order {
		if total <= b.TurnChars {
			return
		}
		if strings.Contains(contents[i], persistedTag) {
			continue
		}
		contents[i] = b.persist(ctx, rt, ids[i], contents[i])
		n := utf8.RuneCountInString(contents[i])
		total += n - sizes[i]
		sizes[i] = n
	}
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

func (b Budget) persist(ctx context.Context, rt *Runtime, callID, content string) string {
	b = b.withDefaults()
	total := utf8.RuneCountInString(content)
	preview := previewOf(content, b.PreviewChars)
	name := unsafeName.ReplaceAllString(callID, "_")
	if name == "" || name == "." || name == ".." {
		rt.mu.Lock()
		rt.resultsN++
		name = fmt.Sprintf("result_%d", rt.resultsN)
		rt.mu.Unlock()
	}
	file := path.Join(b.Dir, name+".txt")
	if err := writeSandboxFile(ctx, rt, file, []byte(content)); err != nil {
		rt.logger().Warn("could not persist large tool result", "rollout", rt.RolloutID, "file", file, "err", err)
		return fmt.Sprintf("%s\n\n[Truncated: tool response was %d chars. Full output could not be saved to sandbox.]", preview, total)
	}
	return fmt.Sprintf("%s\nThis tool result was too large (%d characters, %s).\nFull output saved to: %s\nUse the read_file tool with offset and limit to access specific sections of this output.\n\nPreview (first %d chars):\n%s\n</persisted-output>",
		persistedTag, total, humanSize(total), file, b.PreviewChars, preview)
}

// previewOf keeps the first n chars, cut back to the last newline when that
// newline lies past half of the preview; "..." marks a cut.
func previewOf(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	p := HeadRunes(s, n)
	if i := strings.LastIndexByte(p, '\n'); i > len(p)/2 {
		p = p[:i]
	}
	return p + "\n..."
}

func humanSize(chars int) string {
	if chars >= 1<<20 {
		return fmt.Sprintf("%.1f MB", float64(chars)/(1<<20))
	}
	return fmt.Sprintf("%.1f KB", float64(chars)/1024)
}

// writeSandboxFile creates the parent directory (argv, no shell) and writes
// the file through the sandbox's file API.
func writeSandboxFile(ctx context.Context, rt *Runtime, file string, data []byte) error {
	if rt == nil || rt.Sandbox == nil {
		return errors.New("no sandbox to write to")
	}
	res, err := rt.argv(ctx, 30*time.Second, "mkdir", "-p", "--", path.Dir(file))
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("mkdir %s: exit %d: %s", path.Dir(file), res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return rt.Sandbox.WriteFile(ctx, file, data, 0o644)
}

// HeadRunes is the first n runes of s (s itself when it is shorter): the
// one rune-safe cut of tool output, also used by the agent loop for what
// it records of failed calls.
func HeadRunes(s string, n int) string {
	i := 0
	for j := range s {
		if i == n {
			return s[:j]
		}
		i++
	}
	return s
}

func tailRunes(s string, n int) string {
	if n <= 0 {
		return ""
	}
	i := len(s)
	for k := 0; k < n && i > 0; k++ {
		_, sz := utf8.DecodeLastRuneInString(s[:i])
		i -= sz
	}
	return s[i:]
}
