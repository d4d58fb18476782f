// Package compress shrinks ShareGPT SFT conversations to a token budget,
// as Hermes' trajectory compressor does: the turns in the middle of a
// conversation that is over budget are replaced by one summary turn,
// written by an LLM, while its opening turns and its last turns stay as
// they were. It reads and writes the JSONL that `rollout export sft`
// writes (and Hermes' batch runner), one conversation per line.
package compress

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/rollout-rl/rollout/trajectory"
)

// Tokenizer counts the tokens of a text (the target model's tokenizer).
type Tokenizer interface {
	Count(ctx context.Context, text string) (int, error)
}

// Summarizer writes a summary of text in about maxTokens tokens.
type Summarizer interface {
	Summarize(ctx context.Context, text string, maxTokens int) (string, error)
}

// Options are the compressor's budget and protected turns.
type Options struct {
	// TargetTokens is the budget of a whole conversation (default 15,250).
	TargetTokens int
	// SummaryTokens is the size the summary is written to (default 750).
	SummaryTokens int
	// ProtectLast turns at the end stay as they are (default 4; negative:
	// none).
	ProtectLast int
	// Notice, when set, is appended to the system turn of a compressed
	// conversation (default: SummaryNotice; "-" for none).
	Notice string
	// Concurrency is how many conversations are worked on at once
	// (default 8).
	Concurrency int
}

// SummaryNotice tells the model that some of its context was summarised.
const SummaryNotice = "Some of your previous tool responses may be summarized to preserve context."

// turnCounts is how many turns of one conversation are counted at once.
const turnCounts = 8

// summaryPrefix opens the summary turn.
const summaryPrefix = "[CONTEXT SUMMARY]: "

func (o *Options) defaults() error {
	if o.TargetTokens == 0 {
		o.TargetTokens = 15250
	}
	if o.SummaryTokens == 0 {
		o.SummaryTokens = 750
	}
	switch {
	case o.ProtectLast == 0:
		o.ProtectLast = 4
	case o.ProtectLast < 0:
		o.ProtectLast = 0
	}
	if o.Notice == "" {
		o.Notice = SummaryNotice
	}
	if o.Concurrency == 0 {
		o.Concurrency = 8
	}
	if o.TargetTokens < 1 || o.SummaryTokens < 1 || o.Concurrency < 1 {
		return errors.New("compress: target and summary tokens and concurrency must be positive")
	}
	if o.SummaryTokens >= o.TargetTokens {
		return fmt.Errorf("compress: the summary (%d tokens) must be smaller than the target (%d)", o.SummaryTokens, o.TargetTokens)
	}
	return nil
}

// Stats are what a run did, line by line counted (compression_metrics).
type Stats struct {
	Lines       int `json:"lines"`
	WithinLimit int `json:"within_limit"` // already at or under the target: unchanged
	Compressed  int `json:"compressed"`
	// StillOver: compressed, but still over the target (the protected
	// turns alone exceed it).
	StillOver int `json:"still_over"`
	// Uncompressible: over the target with no turns to summarise between
	// the protected ones: written unchanged.
	Uncompressible int `json:"uncompressible"`
	// Failed: the summarizer failed for good: written unchanged.
	Failed          int   `json:"failed"`
	TokensBefore    int64 `json:"tokens_before"`
	TokensAfter     int64 `json:"tokens_after"`
	TurnsSummarized int   `json:"turns_summarized"`
	// Errors are the summarizer's failures, by line (1-based).
	Errors []LineError `json:"errors,omitempty"`
}

// LineError is one line's failure.
type LineError struct {
	Line  int    `json:"line"`
	Error string `json:"error"`
}

// result is one line, worked on.
type result struct {
	line    []byte
	outcome outcome
	before  int
	after   int
	turns   int
	err     error
}

type outcome int

const (
	within outcome = iota
	compressed
	stillOver
	uncompressible
	failed
)

// Run reads ShareGPT JSONL from in and writes it to out in the same order,
// each conversation over opts.TargetTokens compressed; every other field
// of a line is kept as it was. A line that is not a JSON object with a
// "conversations" array stops the run with its line number (nothing is
// dropped silently); a tokenizer that fails stops it too; a summarizer
// that fails leaves that conversation unchanged and is counted in Stats.
func Run(ctx context.Context, in io.Reader, out io.Writer, tok Tokenizer, sum Summarizer, opts Options) (Stats, error) {
	var st Stats
	if err := opts.defaults(); err != nil {
		return st, err
	}
	type job struct {
		n    int
		line []byte
		res  chan result
	}
	// Lines are read in order and their results written in order; up to
	// Concurrency are worked on at once.
	jobs := make(chan job, opts.Concurrency)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(jobs)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 1<<20), 256<<20)
		n := 0
		for sc.Scan() {
			n++
			line := append([]byte(nil), sc.Bytes()...)
			if len(strings.TrimSpace(string(line))) == 0 {
				continue
			}
			j := job{n: n, line: line, res: make(chan result, 1)}
			select {
			case jobs <- j:
			case <-gctx.Done():
				return gctx.Err()
			}
			g.Go(func() error {
				r := compressLine(gctx, j.line, tok, sum, opts)
				if r.err != nil && r.outcome != failed {
					return fmt.Errorf("line %d: %w", j.n, r.err)
				}
				j.res <- r
				return nil
			})
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("read line %d: %w", n+1, err)
		}
		return nil
	})
	bw := bufio.NewWriter(out)
	g.Go(func() error {
		for j := range jobs {
			var r result
			select {
			case r = <-j.res:
			case <-gctx.Done():
				return gctx.Err()
			}
			st.Lines++
			st.TokensBefore += int64(r.before)
			st.TokensAfter += int64(r.after)
			st.TurnsSummarized += r.turns
			switch r.outcome {
			case within:
				st.WithinLimit++
			case compressed:
				st.Compressed++
			case stillOver:
				st.Compressed++
				st.StillOver++
			case uncompressible:
				st.Uncompressible++
			case failed:
				st.Failed++
				st.Errors = append(st.Errors, LineError{Line: j.n, Error: r.err.Error()})
			}
			if _, err := bw.Write(r.line); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			if err := bw.WriteByte('\n'); err != nil {
				return fmt.Errorf("write: %w", err)
			}
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return st, err
	}
	if err := bw.Flush(); err != nil {
		return st, fmt.Errorf("write: %w", err)
	}
	return st, nil
}

// compressLine works on one JSONL line.
func compressLine(ctx context.Context, line []byte, tok Tokenizer, sum Summarizer, opts Options) result {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(line, &obj); err != nil {
		return result{err: fmt.Errorf("not a JSON object: %w", err)}
	}
	var conv []trajectory.ShareGPTTurn
	if raw, ok := obj["conversations"]; !ok {
		return result{err: errors.New(`no "conversations" array`)}
	} else if err := json.Unmarshal(raw, &conv); err != nil {
		return result{err: fmt.Errorf(`"conversations": %w`, err)}
	}
	// One request per turn, a few at a time: a long conversation's turns
	// would otherwise be counted one round trip after the other.
	counts := make([]int, len(conv))
	cg, cctx := errgroup.WithContext(ctx)
	cg.SetLimit(turnCounts)
	for i, t := range conv {
		cg.Go(func() error {
			n, err := tok.Count(cctx, t.Value)
			if err != nil {
				return fmt.Errorf("count the tokens of turn %d: %w", i, err)
			}
			counts[i] = n
			return nil
		})
	}
	if err := cg.Wait(); err != nil {
		return result{err: err}
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	r := result{line: line, outcome: within, before: total, after: total}
	if total <= opts.TargetTokens {
		return r
	}
	start, end := region(conv, opts.ProtectLast)
	// Summarise turns from the region's start until what goes reaches the
	// excess plus the summary's own size.
	need := total - opts.TargetTokens + opts.SummaryTokens
	cut, got := start, 0
	for cut < end && got < need {
		got += counts[cut]
		cut++
	}
	if cut-start < 1 {
		r.outcome = uncompressible
		return r
	}
	summary, err := sum.Summarize(ctx, summaryInput(conv[start:cut]), opts.SummaryTokens)
	if err != nil {
		r.outcome, r.err = failed, fmt.Errorf("summarize turns %d-%d: %w", start, cut-1, err)
		return r
	}
	sumTurn := trajectory.ShareGPTTurn{From: "human", Value: summaryPrefix + strings.TrimSpace(summary)}
	n, err := tok.Count(ctx, sumTurn.Value)
	if err != nil {
		return result{err: fmt.Errorf("count the summary's tokens: %w", err)}
	}
	out := make([]trajectory.ShareGPTTurn, 0, len(conv)-(cut-start)+1)
	out = append(out, conv[:start]...)
	out = append(out, sumTurn)
	out = append(out, conv[cut:]...)
	after := total - got + n
	if opts.Notice != "-" {
		// The system turn, when there is one, is among the protected
		// opening turns, at the same index as in conv.
		for i := range out[:start] {
			if out[i].From == "system" {
				out[i].Value += "\n\n" + opts.Notice
				if c, err := tok.Count(ctx, out[i].Value); err == nil {
					after += c - counts[i]
				}
				break
			}
		}
	}
	raw, err := marshal(out)
	if err != nil {
		return result{err: err}
	}
	obj["conversations"] = raw
	if r.line, err = marshal(obj); err != nil {
		return result{err: err}
	}
	r.after, r.turns, r.outcome = after, cut-start, compressed
	if after > opts.TargetTokens {
		r.outcome = stillOver
	}
	return r
}

// region is the span of turns that may be summarised: after the opening
// (the first system, human, gpt and tool turns, as long as they are in the
// first half) and before the last protectLast turns.
func region(conv []trajectory.ShareGPTTurn, protectLast int) (start, end int) {
	seen := map[string]bool{}
	for i, t := range conv {
		if i >= len(conv)/2 {
			break
		}
		if seen[t.From] {
			break
		}
		seen[t.From] = true
		start = i + 1
	}
	end = max(len(conv)-protectLast, start)
	return start, end
}

// summaryInput is the summarised turns as the summarizer reads them, each
// value over 3,000 characters cut to its first 1,500 and last 500.
func summaryInput(turns []trajectory.ShareGPTTurn) string {
	var b strings.Builder
	for i, t := range turns {
		if i > 0 {
			b.WriteString("\n\n")
		}
		v := t.Value
		if r := []rune(v); len(r) > 3000 {
			v = string(r[:1500]) + "\n…[cut]…\n" + string(r[len(r)-500:])
		}
		fmt.Fprintf(&b, "[%s]\n%s", t.From, v)
	}
	return b.String()
}

// marshal encodes v as one line without escaping <, > and &: the values
// are full of <tool_call> and <think> tags, and the export writes them
// as they are.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
