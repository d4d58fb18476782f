package inference

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	json "github.com/segmentio/encoding/json"

	"github.com/rollout-rl/rollout/internal/util/jsonscan"
)

// TokenIDs is a list of token ids on the wire. It decodes itself in one
// pass with no reflection per element: prompts and renders are thousands
// of ids, and decoding them was most of a tokens-mode turn's CPU
// (docs/inference.md, "Client cost"). Encoding needs nothing special:
// the JSON codec the client uses writes []int32 without reflection.
//
// Decoding is strict: an array of integers in int32 range, or null (nil).
// An empty array decodes to an empty, non-nil list, so "field absent or
// null" stays distinguishable from "no ids".
type TokenIDs []int32

var errIDs = errors.New("want an array of integer token ids")

// UnmarshalJSON parses an array of integers (or null).
func (t *TokenIDs) UnmarshalJSON(b []byte) error {
	return unmarshalWhole(b, "token ids", t.scan)
}

// scanIDs parses the array of int32 values (or null) that starts at b[i]
// into dst and returns the offset just past it. It checks the JSON
// grammar of what it reads (wireDecoder hands it bodies the codec has not
// seen): integers only, no leading zeros, in int32 range.
func scanIDs(b []byte, i int, dst []int32) ([]int32, int, error) {
	if isNull(b, i) {
		return nil, i + 4, nil
	}
	if i >= len(b) || b[i] != '[' {
		return nil, 0, fmt.Errorf("token ids: %w, got %s", errIDs, snippet(b[i:]))
	}
	i++
	if dst == nil {
		// A rough guess from the array's length (≥ 2 bytes per id) keeps
		// the slice from growing more than once or twice.
		dst = make([]int32, 0, min(arrayLen(b, i)/4+1, 1<<16))
	}
	i = jsonscan.SkipWS(b, i)
	if i < len(b) && b[i] == ']' {
		return dst, i + 1, nil
	}
	for {
		if i < len(b) && b[i] <= ' ' {
			i = jsonscan.SkipWS(b, i)
		}
		start := i
		neg := i < len(b) && b[i] == '-'
		if neg {
			i++
		}
		// Up to 10 digits fit int64 with room to spare: no overflow check
		// per digit, one on the count and one on the value.
		var v int64
		d0 := i
		for i < len(b) {
			c := b[i] - '0'
			if c > 9 {
				break
			}
			v = v*10 + int64(c)
			i++
		}
		digits := i - d0
		if digits == 0 || (digits > 1 && b[d0] == '0') || (i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E')) {
			end := i
			for end < len(b) && b[end] != ',' && b[end] != ']' {
				end++
			}
			return nil, 0, fmt.Errorf("token ids: element %d is %q, %w", len(dst), b[start:end], errIDs)
		}
		if neg {
			v = -v
		}
		if digits > 10 || v > 1<<31-1 || v < -1<<31 {
			return nil, 0, fmt.Errorf("token ids: element %d is out of int32 range", len(dst))
		}
		dst = append(dst, int32(v))
		if i < len(b) && b[i] <= ' ' {
			i = jsonscan.SkipWS(b, i)
		}
		if i >= len(b) {
			return nil, 0, fmt.Errorf("token ids: unterminated array")
		}
		switch b[i] {
		case ',':
			i++
		case ']':
			return dst, i + 1, nil
		default:
			return nil, 0, fmt.Errorf("token ids: unexpected %q after element %d", b[i], len(dst)-1)
		}
	}
}

// arrayLen is the length in bytes of the flat array (no strings, no
// nesting) whose elements start at b[i]: up to its first ']'.
func arrayLen(b []byte, i int) int {
	if j := bytes.IndexByte(b[i:], ']'); j >= 0 {
		return j
	}
	return len(b) - i
}

// scan decodes the ids at b[i:] for wireDecoder.
func (t *TokenIDs) scan(b []byte, i int) (int, error) {
	ids, end, err := scanIDs(b, i, nil)
	if err != nil {
		return 0, err
	}
	*t = ids
	return end, nil
}

// PromptEcho is a server's echo of the prompt ids (vLLM's
// prompt_token_ids), decoded only to be compared with the prompt sent:
// the ids go into a buffer reused across responses instead of a new
// slice the size of the whole context every turn (docs/inference.md,
// "Client cost"). Release gives the buffer back; a PromptEcho never
// released just leaves its buffer to the collector.
type PromptEcho struct {
	buf *[]int32 // nil: absent or null
	// expect is the prompt as sent (its JSON array); an echo of those
	// very bytes is not parsed: same records that it matched.
	expect []byte
	same   bool
}

var echoPool = sync.Pool{New: func() any { return new([]int32) }}

// UnmarshalJSON parses an array of integers (or null) as TokenIDs does.
func (p *PromptEcho) UnmarshalJSON(b []byte) error {
	err := unmarshalWhole(b, "token ids", p.scan)
	if err != nil {
		p.Release()
	}
	return err
}

// unmarshalWhole runs scan on b, which must hold that one array (or null)
// and nothing after it: an UnmarshalJSON made of a scan.
func unmarshalWhole(b []byte, what string, scan func(b []byte, i int) (int, error)) error {
	end, err := scan(b, jsonscan.SkipWS(b, 0))
	if err == nil && jsonscan.SkipWS(b, end) != len(b) {
		err = fmt.Errorf("%s: data after the array", what)
	}
	return err
}

// scan decodes the ids at b[i:] for wireDecoder.
func (p *PromptEcho) scan(b []byte, i int) (int, error) {
	p.Release()
	if p.same = len(p.expect) > 0 && bytes.HasPrefix(b[i:], p.expect); p.same {
		return i + len(p.expect), nil
	}
	buf := echoPool.Get().(*[]int32)
	ids, end, err := scanIDs(b, i, (*buf)[:0])
	if err != nil || ids == nil {
		echoPool.Put(buf)
		return end, err
	}
	*buf = ids
	p.buf = buf
	return end, nil
}

// Same reports whether the echo was, byte for byte, the prompt as sent
// (then IDs is nil: it was not parsed).
func (p *PromptEcho) Same() bool { return p.same }

// IDs are the echoed ids (nil when the server sent none or when Same),
// valid until Release.
func (p *PromptEcho) IDs() []int32 {
	if p.buf == nil {
		return nil
	}
	return *p.buf
}

// Release gives the buffer back for the next response.
func (p *PromptEcho) Release() {
	if p.buf != nil {
		if cap(*p.buf) <= 1<<20 {
			echoPool.Put(p.buf)
		}
		p.buf = nil
	}
}

// Logprobs is /v1/completions' token_logprobs: a number, or null where
// the server has none, per position. The values share one backing array
// (one allocation per response, not one per token).
type Logprobs []*float64

// UnmarshalJSON parses an array of numbers and nulls (or null).
func (l *Logprobs) UnmarshalJSON(b []byte) error {
	return unmarshalWhole(b, "token logprobs", l.scan)
}

// scan parses the array of numbers and nulls (or null) at b[i:] and
// returns the offset just past it; numbers must follow JSON's grammar.
func (l *Logprobs) scan(b []byte, i int) (int, error) {
	if isNull(b, i) {
		*l = nil
		return i + 4, nil
	}
	if i >= len(b) || b[i] != '[' {
		return 0, fmt.Errorf("token logprobs: want an array of numbers, got %s", snippet(b[i:]))
	}
	i++
	vals := make([]float64, 0, arrayLen(b, i)/8+1)
	var nulls []int // positions of null entries
	i = jsonscan.SkipWS(b, i)
	if i < len(b) && b[i] == ']' {
		*l = Logprobs{}
		return i + 1, nil
	}
	for n := 0; ; n++ {
		i = jsonscan.SkipWS(b, i)
		if isNull(b, i) {
			nulls = append(nulls, n)
			vals = append(vals, 0)
			i += 4
		} else {
			end, ok := numberEnd(b, i)
			v, fast := 0.0, false
			if ok {
				v, fast = exactFloat(b[i:end])
			}
			var err error
			if !fast {
				v, err = strconv.ParseFloat(string(b[i:end]), 64)
			}
			if !ok || err != nil {
				for end < len(b) && b[end] != ',' && b[end] != ']' {
					end++
				}
				return 0, fmt.Errorf("token logprobs: element %d is %q, not a number", n, b[i:end])
			}
			vals = append(vals, v)
			i = end
		}
		i = jsonscan.SkipWS(b, i)
		if i >= len(b) {
			return 0, fmt.Errorf("token logprobs: unterminated array")
		}
		if b[i] == ']' {
			break
		}
		if b[i] != ',' {
			return 0, fmt.Errorf("token logprobs: unexpected %q after element %d", b[i], n)
		}
		i++
	}
	out := make(Logprobs, len(vals))
	for k := range vals {
		out[k] = &vals[k]
	}
	for _, k := range nulls {
		out[k] = nil
	}
	*l = out
	return i + 1, nil
}

// numberEnd is the end of the JSON number at b[i:] and whether one is
// there: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func numberEnd(b []byte, i int) (int, bool) {
	digits := func(i int) int {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(i)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return j, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

// TokenStrings is /v1/completions' logprobs.tokens ("token_id:N" with
// return_tokens_as_token_ids). Strings without escapes share one copy of
// the array's bytes (one allocation per response, not one per token).
type TokenStrings []string

// UnmarshalJSON parses an array of strings (or null).
func (t *TokenStrings) UnmarshalJSON(b []byte) error {
	return unmarshalWhole(b, "logprob tokens", t.scan)
}

// scan parses the array of strings (or null) at b[i:] and returns the
// offset just past it. A null element stands for "".
func (t *TokenStrings) scan(b []byte, i int) (int, error) {
	if isNull(b, i) {
		*t = nil
		return i + 4, nil
	}
	if i >= len(b) || b[i] != '[' {
		return 0, fmt.Errorf("logprob tokens: want an array of strings, got %s", snippet(b[i:]))
	}
	if out, end, ok := plainStrings(b, i); ok {
		*t = out
		return end, nil
	}
	return t.scanSlow(b, i)
}

// plainStrings decodes the array of strings at b[i:] (b[i] is its '[')
// in one pass when every element is a string with no escapes and no
// control characters, or null: what scanSlow gives it. The strings share
// one buffer. ok false: some element is not; scanSlow decides.
func plainStrings(b []byte, i int) (TokenStrings, int, bool) {
	n := arrayLen(b, i+1)
	var all strings.Builder // append-only: what String returned stays put
	all.Grow(n)
	out := make(TokenStrings, 0, n/12+1)
	i = jsonscan.SkipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return out, i + 1, true
	}
	for {
		if i < len(b) && b[i] == '"' {
			j := i + 1
			for j < len(b) && b[j] != '"' && b[j] != '\\' && b[j] >= 0x20 {
				j++
			}
			if j >= len(b) || b[j] != '"' {
				return nil, 0, false
			}
			k := all.Len()
			all.Write(b[i+1 : j])
			out = append(out, all.String()[k:])
			i = j + 1
		} else if isNull(b, i) {
			out = append(out, "")
			i += 4
		} else {
			return nil, 0, false
		}
		i = jsonscan.SkipWS(b, i)
		if i >= len(b) {
			return nil, 0, false
		}
		switch b[i] {
		case ']':
			return out, i + 1, true
		case ',':
			i = jsonscan.SkipWS(b, i+1)
		default:
			return nil, 0, false
		}
	}
}

// scanSlow is scan for any array: its errors are scan's.
func (t *TokenStrings) scanSlow(b []byte, i int) (int, error) {
	end, err := valueEnd(b, i)
	if err != nil {
		return 0, fmt.Errorf("logprob tokens: %w", err)
	}
	base, all := i, string(b[i:end]) // the one copy the plain strings point into
	out := make(TokenStrings, 0, (end-i)/12+1)
	i = jsonscan.SkipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		*t = out
		return i + 1, nil
	}
	for {
		i = jsonscan.SkipWS(b, i)
		if i >= len(b) || b[i] != '"' {
			if !isNull(b, i) {
				return 0, fmt.Errorf("logprob tokens: element %d is not a string", len(out))
			}
			out = append(out, "")
			i += 4
		} else {
			start := i
			escaped := false
			i++
			for i < len(b) && b[i] != '"' {
				switch {
				case b[i] == '\\':
					escaped = true
					i++
				case b[i] < 0x20:
					return 0, fmt.Errorf("logprob tokens: element %d has a control character", len(out))
				}
				i++
			}
			if i >= len(b) {
				return 0, fmt.Errorf("logprob tokens: unterminated string")
			}
			i++
			if escaped {
				var s string
				if err := json.Unmarshal(b[start:i], &s); err != nil {
					return 0, fmt.Errorf("logprob tokens: element %d: %w", len(out), err)
				}
				out = append(out, s)
			} else {
				out = append(out, all[start-base+1:i-base-1])
			}
		}
		i = jsonscan.SkipWS(b, i)
		if i >= len(b) {
			return 0, fmt.Errorf("logprob tokens: unterminated array")
		}
		if b[i] == ']' {
			*t = out
			return i + 1, nil
		}
		if b[i] != ',' {
			return 0, fmt.Errorf("logprob tokens: unexpected %q after element %d", b[i], len(out)-1)
		}
		i++
	}
}
