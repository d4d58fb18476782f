// Package jsonscan finds the bounds of JSON values in a body by their
// structure alone — white space, strings, nesting, the end of a bare
// literal — without checking or decoding them: for one-pass decoders that
// decode only what they need and leave the rest to a full decoder's check;
// and Unquote decodes a string literal where it needs no repair.
package jsonscan

import (
	"bytes"
	"errors"
)

// Errors of ValueEnd.
var (
	ErrUnterminatedString = errors.New("unterminated string")
	ErrUnterminatedValue  = errors.New("unterminated value")
)

// SkipWS is the offset of the first byte at or after i that is not JSON
// white space (len(b) when there is none).
func SkipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd is the offset just past the string that opens at b[i]: its
// next quote not escaped (after an even run of backslashes), found with
// IndexByte rather than byte by byte.
func stringEnd(b []byte, i int) (int, bool) {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, false
		}
		q := j + k
		n := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, true
		}
		j = q + 1
	}
}

// ValueEnd is the offset just past the JSON value that starts at b[i]: a
// string or an array or object at its closing byte, a bare literal
// (number, true, false, null) at the first delimiter after it, or at the
// end of b. It checks nothing but the structure; an unterminated string or
// nesting is an error.
func ValueEnd(b []byte, i int) (int, error) {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			end, ok := stringEnd(b, i)
			if !ok {
				return 0, ErrUnterminatedString
			}
			i = end
		case '[', '{':
			depth++
			i++
			continue
		case ']', '}':
			if depth == 0 {
				return i, nil
			}
			depth--
			i++
		case ',', ':', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i, nil
			}
			i++
			continue
		default:
			i++
			continue
		}
		if depth == 0 {
			return i, nil
		}
	}
	if depth != 0 {
		return 0, ErrUnterminatedValue
	}
	return i, nil
}
