// Package jsonscan finds the bounds of JSON values in a body by their
// structure alone — white space, strings, nesting, the end of a bare
// literal — without checking or decoding them: for one-pass decoders that
// decode only what they need and leave the rest to a full decoder's check.
package jsonscan

import "errors"

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
			i++
			for i < len(b) && b[i] != '"' {
				if b[i] == '\\' {
					i++
				}
				i++
			}
			if i >= len(b) {
				return 0, ErrUnterminatedString
			}
			i++
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
