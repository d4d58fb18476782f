package inference

import (
	"errors"
	"fmt"
	"strconv"
	"sync"

	json "github.com/segmentio/encoding/json"
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
	ids, err := parseIDs(b, nil)
	if err != nil {
		return err
	}
	*t = ids
	return nil
}

// parseIDs parses a JSON array of int32 values into dst. encoding/json
// has already checked that b is one valid JSON value; this checks that it
// is null or an array of integers.
func parseIDs(b []byte, dst []int32) ([]int32, error) {
	i := skipWS(b, 0)
	if string(trimWS(b[i:])) == "null" {
		return nil, nil
	}
	if i >= len(b) || b[i] != '[' {
		return nil, fmt.Errorf("token ids: %w, got %s", errIDs, snippet(b))
	}
	i++
	if dst == nil {
		// A rough guess from the length (≥ 2 bytes per id) keeps the
		// slice from growing more than once or twice.
		dst = make([]int32, 0, min(len(b)/4+1, 1<<16))
	}
	i = skipWS(b, i)
	if i < len(b) && b[i] == ']' {
		return dst, nil
	}
	for {
		i = skipWS(b, i)
		start := i
		neg := false
		if i < len(b) && b[i] == '-' {
			neg = true
			i++
		}
		var v int64
		digits := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			v = v*10 + int64(b[i]-'0')
			digits++
			i++
			if v > 1<<31 {
				return nil, fmt.Errorf("token ids: element %d is out of int32 range", len(dst))
			}
		}
		if digits == 0 || (i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E')) {
			end := i
			for end < len(b) && b[end] != ',' && b[end] != ']' {
				end++
			}
			return nil, fmt.Errorf("token ids: element %d is %q, %w", len(dst), b[start:end], errIDs)
		}
		if neg {
			v = -v
		}
		if v > 1<<31-1 || v < -1<<31 {
			return nil, fmt.Errorf("token ids: element %d is out of int32 range", len(dst))
		}
		dst = append(dst, int32(v))
		i = skipWS(b, i)
		if i >= len(b) {
			return nil, fmt.Errorf("token ids: unterminated array")
		}
		switch b[i] {
		case ',':
			i++
		case ']':
			if j := skipWS(b, i+1); j != len(b) {
				return nil, fmt.Errorf("token ids: data after the array")
			}
			return dst, nil
		default:
			return nil, fmt.Errorf("token ids: unexpected %q after element %d", b[i], len(dst)-1)
		}
	}
}

// PromptEcho is a server's echo of the prompt ids (vLLM's
// prompt_token_ids), decoded only to be compared with the prompt sent:
// the ids go into a buffer reused across responses instead of a new
// slice the size of the whole context every turn (docs/inference.md,
// "Client cost"). Release gives the buffer back; a PromptEcho never
// released just leaves its buffer to the collector.
type PromptEcho struct {
	buf *[]int32 // nil: absent or null
}

var echoPool = sync.Pool{New: func() any { return new([]int32) }}

// UnmarshalJSON parses an array of integers (or null) as TokenIDs does.
func (p *PromptEcho) UnmarshalJSON(b []byte) error {
	p.Release()
	buf := echoPool.Get().(*[]int32)
	ids, err := parseIDs(b, (*buf)[:0])
	if err != nil || ids == nil {
		echoPool.Put(buf)
		return err
	}
	*buf = ids
	p.buf = buf
	return nil
}

// IDs are the echoed ids (nil when the server sent none), valid until
// Release.
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

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

func trimWS(b []byte) []byte {
	j := len(b)
	for j > 0 && (b[j-1] == ' ' || b[j-1] == '\n' || b[j-1] == '\t' || b[j-1] == '\r') {
		j--
	}
	return b[:j]
}

// Logprobs is /v1/completions' token_logprobs: a number, or null where
// the server has none, per position. The values share one backing array
// (one allocation per response, not one per token).
type Logprobs []*float64

// UnmarshalJSON parses an array of numbers and nulls (or null).
func (l *Logprobs) UnmarshalJSON(b []byte) error {
	i := skipWS(b, 0)
	if string(trimWS(b[i:])) == "null" {
		*l = nil
		return nil
	}
	if i >= len(b) || b[i] != '[' {
		return fmt.Errorf("token logprobs: want an array of numbers, got %s", snippet(b))
	}
	i++
	vals := make([]float64, 0, len(b)/8+1)
	var nulls []int // positions of null entries
	i = skipWS(b, i)
	if i < len(b) && b[i] == ']' {
		*l = Logprobs{}
		return nil
	}
	for n := 0; ; n++ {
		i = skipWS(b, i)
		start := i
		for i < len(b) && b[i] != ',' && b[i] != ']' && b[i] != ' ' && b[i] != '\n' && b[i] != '\t' && b[i] != '\r' {
			i++
		}
		lit := b[start:i]
		if string(lit) == "null" {
			nulls = append(nulls, n)
			vals = append(vals, 0)
		} else {
			v, err := strconv.ParseFloat(string(lit), 64)
			if err != nil || len(lit) == 0 || lit[0] == '"' {
				return fmt.Errorf("token logprobs: element %d is %q, not a number", n, lit)
			}
			vals = append(vals, v)
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return fmt.Errorf("token logprobs: unterminated array")
		}
		if b[i] == ']' {
			break
		}
		if b[i] != ',' {
			return fmt.Errorf("token logprobs: unexpected %q after element %d", b[i], n)
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
	return nil
}

// TokenStrings is /v1/completions' logprobs.tokens ("token_id:N" with
// return_tokens_as_token_ids). Strings without escapes share one copy of
// the array's bytes (one allocation per response, not one per token).
type TokenStrings []string

// UnmarshalJSON parses an array of strings (or null).
func (t *TokenStrings) UnmarshalJSON(b []byte) error {
	i := skipWS(b, 0)
	if string(trimWS(b[i:])) == "null" {
		*t = nil
		return nil
	}
	if i >= len(b) || b[i] != '[' {
		return fmt.Errorf("logprob tokens: want an array of strings, got %s", snippet(b))
	}
	all := string(b) // the one copy the plain strings point into
	out := make(TokenStrings, 0, len(b)/12+1)
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		*t = out
		return nil
	}
	for {
		i = skipWS(b, i)
		if i >= len(b) || b[i] != '"' {
			if i+4 <= len(b) && string(b[i:i+4]) == "null" {
				out = append(out, "")
				i += 4
			} else {
				return fmt.Errorf("logprob tokens: element %d is not a string", len(out))
			}
		} else {
			start := i
			escaped := false
			i++
			for i < len(b) && b[i] != '"' {
				if b[i] == '\\' {
					escaped = true
					i++
				}
				i++
			}
			if i >= len(b) {
				return fmt.Errorf("logprob tokens: unterminated string")
			}
			i++
			if escaped {
				var s string
				if err := json.Unmarshal(b[start:i], &s); err != nil {
					return fmt.Errorf("logprob tokens: element %d: %w", len(out), err)
				}
				out = append(out, s)
			} else {
				out = append(out, all[start+1:i-1])
			}
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return fmt.Errorf("logprob tokens: unterminated array")
		}
		if b[i] == ']' {
			*t = out
			return nil
		}
		if b[i] != ',' {
			return fmt.Errorf("logprob tokens: unexpected %q after element %d", b[i], len(out)-1)
		}
		i++
	}
}
