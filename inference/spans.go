package inference

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ByteRange is a half-open byte range [Start, End) of a turn's Text.
type ByteRange struct{ Start, End int }

// TokenSpan is a half-open range [Start, End) of a turn's sampled ids
// (Turn.CompletionIDs); -1, -1 when it could not be placed exactly.
type TokenSpan struct{ Start, End int }

// noSpan is a span that could not be placed.
var noSpan = TokenSpan{-1, -1}

// TokenSpans maps byte ranges of a tokens-mode turn's text to the sampled
// ids that produced them: Start is the last id whose text begins at or
// before the range, End the first id boundary at or after its end, so
// that the ids [Start, End) detokenise to text that contains the range.
//
// Boundaries come from the pieces the generation response spelled for
// the episode's last turn when ids are that turn's and every piece but a
// final control token is known (llama.cpp's completion_probabilities:
// no request at all); otherwise from the server's own detokenizer: the
// text of the first k ids must be a prefix of text, and k is found by
// bisection (about 2·log2(len(ids)) /detokenize calls per range, made
// only for turns with tool calls). A prefix that is not one of text's (an
// id sequence cut inside a UTF-8 character decodes to a replacement) is
// stepped back to the previous id. A range that cannot be placed exactly
// gets -1, -1; an error is only a failed request.
func (e *tokenEpisode) TokenSpans(ctx context.Context, ids []int32, text string, ranges []ByteRange) ([]TokenSpan, error) {
	out := make([]TokenSpan, len(ranges))
	if len(ranges) == 0 {
		return out, nil
	}
	p := prefixer{ids: ids, text: text, known: map[int]int{0: 0}, detok: func(ctx context.Context, ids []int32) (string, error) {
		return e.c.tok.Detokenize(ctx, e.tokOpts("span"+strconv.Itoa(len(ids))), e.spec.Model, ids)
	}}
	e.mu.Lock()
	if pc := e.lastPieces; pc != nil && len(ids) > 0 && slices.Equal(ids, e.lastIDs) {
		body := len(ids)
		if pc.empty(body - 1) {
			body-- // the stop token (a control token, spelled empty)
		}
		if t, ok := pc.textOf(body); ok && t == text {
			p.local = pc
		}
	}
	e.mu.Unlock()
	for i, r := range ranges {
		sp, err := p.span(ctx, r)
		if err != nil {
			return nil, fmt.Errorf("episode %s: token spans: %w", e.spec.ID, err)
		}
		out[i] = sp
	}
	return out, nil
}

// prefixer measures prefixes of ids in bytes of text, memoised.
type prefixer struct {
	ids   []int32
	text  string
	known map[int]int // k → len(detok(ids[:k])), or -1 when not a prefix of text
	detok func(context.Context, []int32) (string, error)
	// local, when set, measures prefixes from the ids' pieces instead of
	// detok (no request).
	local *tokenPieces
}

// length is the byte length of the text of ids[:k] when it is a prefix of
// text, else -1.
func (p *prefixer) length(ctx context.Context, k int) (int, error) {
	if n, ok := p.known[k]; ok {
		return n, nil
	}
	if p.local != nil {
		n := p.local.prefixLen(k, p.text)
		p.known[k] = n
		return n, nil
	}
	t, err := p.detok(ctx, p.ids[:k])
	if err != nil {
		return 0, err
	}
	n := len(t)
	if !strings.HasPrefix(p.text, t) {
		n = -1
	}
	p.known[k] = n
	return n, nil
}

// settled is length at the largest k' ≤ k whose text is a prefix of text
// (at most a few steps back: an unfinished UTF-8 character is ≤ 3 ids).
func (p *prefixer) settled(ctx context.Context, k int) (at, n int, err error) {
	for k >= 0 {
		n, err := p.length(ctx, k)
		if err != nil {
			return 0, 0, err
		}
		if n >= 0 {
			return k, n, nil
		}
		k--
	}
	return 0, 0, nil
}

// span places r. f(k), the length of the longest valid prefix of at most
// k ids (settled), does not decrease with k, so both ends bisect on it.
func (p *prefixer) span(ctx context.Context, r ByteRange) (TokenSpan, error) {
	if r.Start < 0 || r.End < r.Start || r.End > len(p.text) {
		return noSpan, nil
	}
	f := func(k int) (int, error) {
		_, n, err := p.settled(ctx, k)
		return n, err
	}
	// Start: the largest valid k with length(k) ≤ r.Start.
	lo, hi := 0, len(p.ids)
	for lo < hi {
		mid := (lo + hi + 1) / 2
		n, err := f(mid)
		if err != nil {
			return noSpan, err
		}
		if n <= r.Start {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	start, _, err := p.settled(ctx, lo)
	if err != nil {
		return noSpan, err
	}
	// End: the smallest k with f(k) ≥ r.End (such a k is valid itself).
	lo, hi = start, len(p.ids)
	for lo < hi {
		mid := (lo + hi) / 2
		n, err := f(mid)
		if err != nil {
			return noSpan, err
		}
		if n >= r.End {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	n, err := f(lo)
	if err != nil {
		return noSpan, err
	}
	if n < r.End {
		return noSpan, nil // the ids' text never reaches the range's end
	}
	return TokenSpan{start, lo}, nil
}
