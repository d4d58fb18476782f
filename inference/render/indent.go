package render

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// tojson(indent=N) (Llama 3.x templates print each tool with indent=4)
// prints like Python's json.dumps(x, ensure_ascii=False, indent=N): items
// separated by ",", keys by ": ", every member of a non-empty container on
// a line of its own, N spaces deeper than its container, keys in their
// order. ardanlabs/jinja's tojson prints indented JSON through Go's
// encoding/json instead (keys sorted, "<" escaped), and its filters
// cannot be replaced. So the call is compiled as its compact form with
// sentinel separators followed by a sentinel end mark that carries N:
//
//	x | tojson(indent=4)  →  x | tojson(separators=["⁽i⁾", "⁽k⁾"]) ~ "⁽o⁾4⁽c⁾"
//
// (a filter binds tighter than ~, so the mark lands right after the JSON
// text), and reindent rewrites each marked text into the indented form.
// Only a literal integer indent is rewritten; other tojson arguments are
// left to the library (and a render that differs from the engine's is
// caught by the checks against the server).
var indentCall = regexp.MustCompile(`tojson\(\s*indent\s*=\s*(\d{1,2})\s*\)`)

// rewriteIndent compiles tojson(indent=N) calls as described above; ok
// reports whether src had one.
func rewriteIndent(src string) (string, bool) {
	if !indentCall.MatchString(src) {
		return src, false
	}
	out := indentCall.ReplaceAllStringFunc(src, func(call string) string {
		n := indentCall.FindStringSubmatch(call)[1]
		return `tojson(separators=["` + string(indentItem) + `", "` + string(indentKey) + `"]) ~ "` +
			string(indentOpen) + n + string(indentClose) + `"`
	})
	return out, true
}

// reindent rewrites every JSON text followed by an indent mark (see
// rewriteIndent) into its indented form.
func reindent(s string) (string, error) {
	if !strings.ContainsRune(s, indentOpen) {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s) + len(s)/4)
	done := 0 // s[:done] is written to b
	for {
		i := strings.IndexRune(s[done:], indentOpen)
		if i < 0 {
			break
		}
		mark := done + i
		end := strings.IndexRune(s[mark:], indentClose)
		if end < 0 {
			return "", errors.New("render: template: tojson(indent) mark without its end")
		}
		n, err := strconv.Atoi(s[mark+utf8.RuneLen(indentOpen) : mark+end])
		if err != nil {
			return "", errors.New("render: template: tojson(indent) mark without its width")
		}
		start, err := jsonStart(s[done:mark])
		if err != nil {
			return "", err
		}
		b.WriteString(s[done : done+start])
		indentJSON(&b, s[done+start:mark], n)
		done = mark + end + utf8.RuneLen(indentClose)
	}
	b.WriteString(s[done:])
	return b.String(), nil
}

// jsonStart is where the JSON text that ends s begins: for a container,
// its opening bracket, found by walking back over strings and nested
// brackets; for a scalar, the end of s (a scalar prints the same indented
// or not, so it is left as it is).
func jsonStart(s string) (int, error) {
	if s == "" || (s[len(s)-1] != '}' && s[len(s)-1] != ']') {
		return len(s), nil
	}
	depth := 0
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case '"':
			// A string, walked back to its opening quote: a quote
			// preceded by an odd number of backslashes is escaped.
			j := i - 1
			for ; j >= 0; j-- {
				if s[j] == '"' && !escaped(s, j) {
					break
				}
			}
			if j < 0 {
				return 0, errors.New("render: template: tojson(indent) text with an unterminated string")
			}
			i = j
		case '}', ']':
			depth++
		case '{', '[':
			depth--
			if depth == 0 {
				return i, nil
			}
		}
	}
	return 0, errors.New("render: template: tojson(indent) text without its opening bracket")
}

// escaped reports whether the quote at s[i] is preceded by an odd number of
// backslashes.
func escaped(s string, i int) bool {
	n := 0
	for j := i - 1; j >= 0 && s[j] == '\\'; j-- {
		n++
	}
	return n%2 == 1
}

// indentJSON writes the compact JSON text js (sentinel separators) in
// Python's indented form with width n.
func indentJSON(b *strings.Builder, js string, n int) {
	depth := 0
	newline := func(d int) {
		b.WriteByte('\n')
		for range d * n {
			b.WriteByte(' ')
		}
	}
	for i := 0; i < len(js); {
		c := js[i]
		switch {
		case c == '"':
			j := i + 1
			for j < len(js) && (js[j] != '"' || escaped(js, j)) {
				j++
			}
			b.WriteString(js[i:min(j+1, len(js))])
			i = j + 1
			continue
		case c == '{' || c == '[':
			if i+1 < len(js) && (js[i+1] == '}' || js[i+1] == ']') {
				b.WriteString(js[i : i+2]) // empty: {} or []
				i += 2
				continue
			}
			b.WriteByte(c)
			depth++
			newline(depth)
		case c == '}' || c == ']':
			depth--
			newline(depth)
			b.WriteByte(c)
		case strings.HasPrefix(js[i:], string(indentItem)):
			b.WriteByte(',')
			newline(depth)
			i += utf8.RuneLen(indentItem)
			continue
		case strings.HasPrefix(js[i:], string(indentKey)):
			b.WriteString(": ")
			i += utf8.RuneLen(indentKey)
			continue
		default:
			b.WriteByte(c)
		}
		i++
	}
}
