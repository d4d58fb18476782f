package jsonscan

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// Unquote is the value of the JSON string literal raw (its quotes
// included) as encoding/json decodes it, for a literal of valid UTF-8:
// runs without escapes are copied whole and escapes decoded in place. ok
// is false for anything else — not a string literal, a control character
// or a bad escape (the decoder's errors), invalid UTF-8 or a lone
// surrogate (which the decoder turns into U+FFFD) — and the caller hands
// raw to a full decoder.
func Unquote(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	if !utf8.Valid(in) {
		return "", false
	}
	if bytes.IndexByte(in, '\\') < 0 {
		// No escape (most message text): the literal's bytes are its
		// value, if no quote or control character stands in them.
		for _, c := range in {
			if c == '"' || c < 0x20 {
				return "", false
			}
		}
		return string(in), true
	}
	out := make([]byte, 0, len(in))
	for i := 0; i < len(in); {
		j := bytes.IndexByte(in[i:], '\\')
		if j < 0 {
			j = len(in) - i
		}
		run := in[i : i+j]
		for _, c := range run {
			if c == '"' || c < 0x20 {
				return "", false
			}
		}
		out = append(out, run...)
		i += j
		if i == len(in) {
			break
		}
		// in[i] is a backslash.
		if i+1 >= len(in) {
			return "", false
		}
		switch e := in[i+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(in, i+2)
			if !ok {
				return "", false
			}
			i += 6
			if utf16.IsSurrogate(r) {
				r2, ok := hex4(in, i+2)
				if !ok || i+1 >= len(in) || in[i] != '\\' || in[i+1] != 'u' {
					return "", false
				}
				r = utf16.DecodeRune(r, r2)
				if r == utf8.RuneError {
					return "", false
				}
				i += 6
			}
			out = utf8.AppendRune(out, r)
			continue
		default:
			return "", false
		}
		i += 2
	}
	return string(out), true
}

// hex4 is the code unit of the four hex digits at in[i:i+4].
func hex4(in []byte, i int) (rune, bool) {
	if i+4 > len(in) {
		return 0, false
	}
	var r rune
	for _, c := range in[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
