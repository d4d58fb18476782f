package inference

import "github.com/rollout-rl/rollout/internal/util/jsonscan"

// The fast paths of the one-pass decoders (wiredecode.go, ids.go). Each
// accepts only what the slow path it stands in front of accepts, with the
// same result, and declines (ok false) everything else: a body the fast
// path declines goes through the slow path, which decides, so what is
// accepted and every error stays the slow path's own. What the fast paths
// accept is strict JSON (RFC 8259), a subset of what the codec accepts;
// wiredecode_test.go checks the pair against each other on fuzzed bodies.

// maxSkipDepth bounds the nesting skipValue follows; deeper values go
// through the slow path.
const maxSkipDepth = 64

// valueSpan is the end of the JSON value at b[i:] when it is valid, and
// ends where valueEnd says it does: for a value valueSpan accepts,
// b[i:end] is what valueEnd delimits and json.Valid accepts. A scalar
// must be followed by the end of b or a byte valueEnd stops at.
func valueSpan(b []byte, i int) (int, bool) {
	end, ok := skipValue(b, i, 0)
	if !ok {
		return 0, false
	}
	if c := b[i]; c != '"' && c != '[' && c != '{' && !atDelim(b, end) {
		return 0, false
	}
	return end, true
}

// atDelim reports whether b[i] ends a bare literal for valueEnd (or b
// ends there).
func atDelim(b []byte, i int) bool {
	if i >= len(b) {
		return true
	}
	switch b[i] {
	case ',', ':', ' ', '\t', '\n', '\r', ']', '}':
		return true
	}
	return false
}

// skipValue checks the strict JSON value at b[i:] and returns the offset
// just past it.
func skipValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	var ok bool
	switch c := b[i]; c {
	case '"':
		return skipString(b, i)
	case '{':
		if depth >= maxSkipDepth {
			return 0, false
		}
		i = jsonscan.SkipWS(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, true
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return 0, false
			}
			if i, ok = skipString(b, i); !ok {
				return 0, false
			}
			i = jsonscan.SkipWS(b, i)
			if i >= len(b) || b[i] != ':' {
				return 0, false
			}
			if i, ok = skipValue(b, jsonscan.SkipWS(b, i+1), depth+1); !ok {
				return 0, false
			}
			i = jsonscan.SkipWS(b, i)
			if i >= len(b) {
				return 0, false
			}
			switch b[i] {
			case '}':
				return i + 1, true
			case ',':
				i = jsonscan.SkipWS(b, i+1)
			default:
				return 0, false
			}
		}
	case '[':
		if depth >= maxSkipDepth {
			return 0, false
		}
		i = jsonscan.SkipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, true
		}
		for {
			if i, ok = skipValue(b, i, depth+1); !ok {
				return 0, false
			}
			i = jsonscan.SkipWS(b, i)
			if i >= len(b) {
				return 0, false
			}
			switch b[i] {
			case ']':
				return i + 1, true
			case ',':
				i = jsonscan.SkipWS(b, i+1)
			default:
				return 0, false
			}
		}
	case 't':
		return i + 4, i+4 <= len(b) && string(b[i:i+4]) == "true"
	case 'f':
		return i + 5, i+5 <= len(b) && string(b[i:i+5]) == "false"
	case 'n':
		return i + 4, isNull(b, i)
	default:
		if c == '-' || c >= '0' && c <= '9' {
			return numberEnd(b, i)
		}
	}
	return 0, false
}

// skipString checks the string at b[i:] (b[i] is its quote) and returns
// the offset just past it: no control characters, escapes as JSON has
// them.
func skipString(b []byte, i int) (int, bool) {
	for i++; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c == '\\':
			if i+1 >= len(b) {
				return 0, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return 0, false
				}
				i += 6
			default:
				return 0, false
			}
		case c < 0x20:
			return 0, false
		default:
			i++
		}
	}
	return 0, false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// plainString finds the string at b[i:] when it is plain — printable
// ASCII, no escapes — and returns its contents and the offset just past
// it: what the codec decodes it to, byte for byte.
func plainString(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20 || c > 0x7e:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// wireString decodes the string at b[i:] into s, as wireValue does.
func wireString(b []byte, i int, s *string) (int, error) {
	if v, end, ok := plainString(b, i); ok {
		*s = string(v)
		return end, nil
	}
	return wireValue(b, i, s)
}

// wireInt decodes the integer at b[i:] into n, as wireValue does: plain
// non-negative integers of up to 18 digits here, anything else there.
func wireInt(b []byte, i int, n *int) (int, error) {
	j, v := i, 0
	for j < len(b) && j-i < 19 && b[j] >= '0' && b[j] <= '9' {
		v = v*10 + int(b[j]-'0')
		j++
	}
	if d := j - i; d == 0 || d > 18 || (d > 1 && b[i] == '0') || !atDelim(b, j) {
		return wireValue(b, i, n)
	}
	*n = v
	return j, nil
}

// pow10 are the powers of ten a float64 holds exactly.
var pow10 = [...]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
	1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}

// exactFloat is the value of the JSON number b (whole, as numberEnd
// delimits it) when its digits fit 2^53 and its decimal exponent 10^±22:
// then both are exact float64s and one multiplication or division rounds
// correctly, to what strconv.ParseFloat gives. ok false: use ParseFloat.
func exactFloat(b []byte) (float64, bool) {
	i, neg := 0, false
	if i < len(b) && b[i] == '-' {
		neg = true
		i++
	}
	var m uint64
	digits, exp := 0, 0
	// Significant digits are counted from the first non-zero one; past
	// 15 m might not fit 2^53 (or, further on, uint64).
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if m = m*10 + uint64(b[i]-'0'); m != 0 {
			if digits++; digits > 15 {
				return 0, false
			}
		}
	}
	if i < len(b) && b[i] == '.' {
		for i++; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			if m = m*10 + uint64(b[i]-'0'); m != 0 {
				if digits++; digits > 15 {
					return 0, false
				}
			}
			exp--
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		eneg := false
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			eneg = b[i] == '-'
			i++
		}
		e := 0
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			if e = e*10 + int(b[i]-'0'); e > 1000 {
				return 0, false
			}
		}
		if eneg {
			e = -e
		}
		exp += e
	}
	if i != len(b) || m > 1<<53 {
		return 0, false
	}
	f := float64(m)
	switch {
	case m == 0 || exp == 0:
	case exp > 0 && exp < len(pow10):
		f *= pow10[exp]
	case exp < 0 && -exp < len(pow10):
		f /= pow10[-exp]
	default:
		return 0, false
	}
	if neg {
		f = -f
	}
	return f, true
}
