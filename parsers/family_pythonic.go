package parsers

// Pythonic families: pythonic (Llama 3.2, ToolACE), llama4_pythonic, olmo3
// and lfm2 write calls as Python source, `[get_weather(city='SF'), f()]`.
// Parsing is two-phase. A structural pass finds the call spans (name, then a
// bracket-balanced argument list, Python strings honoured) and decides
// whether the text is a call list at all; then each span is converted on
// its own, so one call with a non-literal value is an error while its
// siblings are kept. The literal converter is a hand-written scanner for
// Python literals (reference §4.2): keyword arguments only, constants,
// strings, lists, tuples, dicts and sets; anything else is not a literal.

import (
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

func init() {
	Register("pythonic", pythonicParser{})
	Register("llama4_pythonic", llama4PythonicParser{})
	Register("olmo3", olmo3Parser{})
	Register("lfm2", lfm2Parser{})
}

var (
	_ Parser = pythonicParser{}
	_ Parser = llama4PythonicParser{}
	_ Parser = olmo3Parser{}
	_ Parser = lfm2Parser{}
)

// --- structural pass ---

func pyIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80
}

func pyIdentByte(c byte) bool { return pyIdentStart(c) || vlDigit(c) }

// pySkipSpace skips whitespace, newlines, line continuations and comments,
// all of which Python allows inside brackets.
func pySkipSpace(s string, i int) int {
	for i < len(s) {
		switch c := s[i]; c {
		case ' ', '\t', '\n', '\r', '\f', '\v':
			i++
		case '\\':
			if i+1 < len(s) && (s[i+1] == '\n' || s[i+1] == '\r') {
				i += 2
				continue
			}
			return i
		case '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		default:
			return i
		}
	}
	return i
}

// pyScanName reads a dotted name at s[i]; it returns the end or -1.
func pyScanName(s string, i int) int {
	if i >= len(s) || !pyIdentStart(s[i]) {
		return -1
	}
	for {
		for i < len(s) && pyIdentByte(s[i]) {
			i++
		}
		if i+1 < len(s) && s[i] == '.' && pyIdentStart(s[i+1]) {
			i++
			continue
		}
		return i
	}
}

// pySkipString skips the Python string literal whose quote is at s[i].
func pySkipString(s string, i int) (int, vlScan) {
	q := s[i]
	triple := i+2 < len(s) && s[i+1] == q && s[i+2] == q
	if triple {
		i += 3
	} else {
		i++
	}
	// Jump between quote characters with IndexByte; only the segments in
	// between are checked for escapes and (single-quoted) newlines.
	for {
		k := strings.IndexByte(s[i:], q)
		seg := s[i:]
		if k >= 0 {
			seg = s[i : i+k]
		}
		if b := strings.IndexByte(seg, '\\'); b >= 0 {
			if !triple && strings.IndexByte(seg[:b], '\n') >= 0 {
				return i + strings.IndexByte(seg, '\n'), vlBad
			}
			i += b + 2
			if i > len(s) {
				return len(s), vlTrunc
			}
			continue
		}
		if !triple {
			if n := strings.IndexByte(seg, '\n'); n >= 0 {
				return i + n, vlBad
			}
		}
		if k < 0 {
			return len(s), vlTrunc
		}
		i += k
		if !triple {
			return i + 1, vlOK
		}
		if i+2 < len(s) && s[i+1] == q && s[i+2] == q {
			return i + 3, vlOK
		}
		i++
	}
}

// pySkipBalanced skips from the opening bracket at s[i] to just after its
// partner, honouring strings.
func pySkipBalanced(s string, i int) (int, vlScan) {
	depth := 0
	for i < len(s) {
		switch c := s[i]; c {
		case '(', '[', '{':
			depth++
			i++
		case ')', ']', '}':
			depth--
			i++
			if depth == 0 {
				return i, vlOK
			}
			if depth < 0 {
				return i, vlBad
			}
		case '\'', '"':
			var st vlScan
			if i, st = pySkipString(s, i); st != vlOK {
				return i, st
			}
		case '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		default:
			i++
		}
	}
	return len(s), vlTrunc
}

// pyScanCall finds the extent of one call `name(...)` at s[i].
// A bare name at the end of input is a truncated call only inList: on its
// own a single word is prose.
func pyScanCall(s string, i int, inList bool) (int, vlScan) {
	e := pyScanName(s, i)
	if e < 0 {
		if i >= len(s) {
			return i, vlTrunc
		}
		return i, vlBad
	}
	j := e
	for j < len(s) && (s[j] == ' ' || s[j] == '\t') {
		j++
	}
	if j >= len(s) {
		if !inList {
			return j, vlBad
		}
		return j, vlTrunc
	}
	if s[j] != '(' {
		return j, vlBad
	}
	return pySkipBalanced(s, j)
}

type pySpan struct{ start, end int }

// pyList scans a bracketed list of calls at s[i] == '['. It returns the
// complete call spans, the start of a truncated call (-1 if none), the index
// after ']' and whether the text is structurally a call list.
func pyList(s string, i int) (spans []pySpan, truncAt, end int, ok bool) {
	truncAt = -1
	i = pySkipSpace(s, i+1)
	if i < len(s) && s[i] == ']' {
		return nil, -1, i + 1, false // an empty list is not a call
	}
	spans = make([]pySpan, 0, 4) // most turns make 1-4 calls
	for {
		i = pySkipSpace(s, i)
		if i >= len(s) {
			return spans, i, len(s), true
		}
		e, st := pyScanCall(s, i, true)
		switch st {
		case vlTrunc:
			return spans, i, len(s), true
		case vlBad:
			return spans, -1, e, false
		}
		spans = append(spans, pySpan{i, e})
		i = pySkipSpace(s, e)
		if i >= len(s) {
			return spans, i, len(s), true
		}
		switch s[i] {
		case ',':
			i = pySkipSpace(s, i+1)
			if i < len(s) && s[i] == ']' {
				return spans, -1, i + 1, true
			}
		case ']':
			return spans, -1, i + 1, true
		default:
			return spans, -1, i, false
		}
	}
}

// pyCalls records the calls of spans, plus a truncation error.
func pyCalls(c *vlCollector, s string, spans []pySpan, truncAt int) {
	longest := 0
	for _, sp := range spans {
		longest = max(longest, sp.end-sp.start)
	}
	// One buffer serves every call: JSON is about as long as the Python.
	p := pyConv{out: make([]byte, 0, longest+16), keys: make([]string, 0, 8)}
	for _, sp := range spans {
		name, args, reason := p.call(s[sp.start:sp.end])
		if reason != "" {
			c.fail(name, reason, s[sp.start:sp.end])
		} else {
			c.add(name, args, s[sp.start:sp.end])
		}
	}
	if truncAt >= 0 {
		c.fail(pyNameAt(s, truncAt), "truncated: the output ends inside the call", s[truncAt:])
	}
}

func pyNameAt(s string, i int) string {
	if e := pyScanName(s, i); e > 0 {
		return s[i:e]
	}
	return ""
}

// llamaEndTokens end a Llama turn; with skip_special_tokens=False they
// follow the call list.
var llamaEndTokens = []string{"<|eom_id|>", "<|eot_id|>", "<|eom|>", "<|eot|>"}

// pyWholeList parses text that must be nothing but a call list (a
// trailing Llama end-of-turn token aside).
func pyWholeList(c *vlCollector, text string) bool {
	// Trailing whitespace never decides whether the output was cut off
	// inside a call: "[a(), b" and "[a(), b\n" parse alike.
	text = strings.TrimRightFunc(text, unicode.IsSpace)
	for trimmed := true; trimmed; {
		trimmed = false
		for _, e := range llamaEndTokens {
			if strings.HasSuffix(text, e) {
				text, trimmed = strings.TrimRightFunc(text[:len(text)-len(e)], unicode.IsSpace), true
			}
		}
	}
	i := pySkipSpace(text, 0)
	if i >= len(text) || text[i] != '[' {
		return false
	}
	spans, truncAt, end, ok := pyList(text, i)
	if !ok {
		return false
	}
	if truncAt < 0 && strings.TrimSpace(text[end:]) != "" {
		return false // a list followed by prose is prose quoting Python
	}
	if len(spans) == 0 && truncAt < 0 {
		return false
	}
	pyCalls(c, text, spans, truncAt)
	return true
}

// --- literal conversion ---

type pyConv struct {
	s     string
	i     int
	depth int
	// out and keys are call's buffers, reused from one call to the next.
	out  []byte
	keys []string
}

type pyError struct{ msg string }

func (e *pyError) Error() string { return e.msg }

func pyErrf(format string, a ...any) error { return &pyError{fmt.Sprintf(format, a...)} }

// call converts one complete call span to name and JSON arguments. The
// object is written straight into p.out, which the calls of a list share,
// so a call allocates only its arguments string.
func (p *pyConv) call(span string) (name, args, reason string) {
	e := pyScanName(span, 0)
	name = span[:e]
	p.s, p.depth = span, 0
	p.i = pySkipSpace(span, e) + 1 // past '('
	out := append(p.out[:0], '{')
	keys := p.keys[:0]
	for {
		p.i = pySkipSpace(span, p.i)
		if p.i >= len(span) {
			return name, "", "unbalanced call"
		}
		if span[p.i] == ')' {
			break
		}
		if span[p.i] == '*' {
			return name, "", "star arguments are not literals"
		}
		ke := pyScanName(span, p.i)
		isKw := false
		if ke > 0 && strings.IndexByte(span[p.i:ke], '.') < 0 {
			j := pySkipSpace(span, ke)
			if j < len(span) && span[j] == '=' && (j+1 >= len(span) || span[j+1] != '=') {
				isKw = true
				key := span[p.i:ke]
				p.i = j + 1
				if len(keys) > 0 {
					out = append(out, ',')
				}
				out = append(appendJSONString(out, key), ':')
				var err error
				if out, err = p.value(out); err != nil {
					return name, "", fmt.Sprintf("argument %s: %v", key, err)
				}
				if slices.Contains(keys, key) {
					return name, "", fmt.Sprintf("keyword argument %s repeated", key)
				}
				keys = append(keys, key)
			}
		}
		if !isKw {
			return name, "", "positional arguments are not supported: every argument needs a name (key=value)"
		}
		p.i = pySkipSpace(span, p.i)
		if p.i < len(span) && span[p.i] == ',' {
			p.i++
			continue
		}
		if p.i < len(span) && span[p.i] == ')' {
			break
		}
		return name, "", fmt.Sprintf("unexpected %q after argument", pyNear(span, p.i))
	}
	out = append(out, '}')
	p.out, p.keys = out, keys
	return name, string(out), ""
}

func pyNear(s string, i int) string {
	if i >= len(s) {
		return "end of call"
	}
	e := min(len(s), i+12)
	return s[i:e]
}

const pyMaxDepth = 500

// value appends the JSON form of the literal at p.i to dst.
func (p *pyConv) value(dst []byte) ([]byte, error) {
	p.i = pySkipSpace(p.s, p.i)
	if p.i >= len(p.s) {
		return nil, pyErrf("missing value")
	}
	c := p.s[p.i]
	switch {
	case c == '\'' || c == '"':
		str, err := p.strings()
		if err != nil {
			return nil, err
		}
		if cap(dst)-len(dst) < len(str)+2 {
			dst = append(make([]byte, 0, len(dst)+len(str)+16), dst...)
		}
		return appendJSONString(dst, str), nil
	case c == '[' || c == '(':
		return p.sequence(dst, c)
	case c == '{':
		return p.dict(dst)
	case c == '-' || c == '+' || c == '.' || vlDigit(c):
		return p.number(dst)
	case pyIdentStart(c):
		e := pyScanName(p.s, p.i)
		word := p.s[p.i:e]
		// A string prefix: r'..', b"..", u'..'; f-strings are expressions.
		if e < len(p.s) && (p.s[e] == '\'' || p.s[e] == '"') && len(word) <= 2 {
			lw := strings.ToLower(word)
			switch lw {
			case "r", "u", "b", "br", "rb":
				str, err := p.strings()
				if err != nil {
					return nil, err
				}
				return appendJSONString(dst, str), nil
			}
			return nil, pyErrf("%s-string is not a literal", word)
		}
		p.i = e
		switch word {
		case "None", "null":
			return append(dst, "null"...), nil
		case "True", "true":
			return append(dst, "true"...), nil
		case "False", "false":
			return append(dst, "false"...), nil
		}
		return nil, pyErrf("%s is not a literal value", word)
	}
	return nil, pyErrf("%q is not a literal value", pyNear(p.s, p.i))
}

// strings reads one or more adjacent string literals (Python concatenates
// them) and returns the decoded text.
func (p *pyConv) strings() (string, error) {
	var b strings.Builder
	first := true
	for {
		j := p.i
		raw := false
		for j < len(p.s) && pyIdentStart(p.s[j]) && j-p.i < 2 {
			if p.s[j] == 'r' || p.s[j] == 'R' {
				raw = true
			}
			j++
		}
		if j >= len(p.s) || (p.s[j] != '\'' && p.s[j] != '"') {
			if first {
				return "", pyErrf("expected a string")
			}
			return b.String(), nil
		}
		if j > p.i {
			switch strings.ToLower(p.s[p.i:j]) {
			case "r", "u", "b", "br", "rb":
			default:
				if first {
					return "", pyErrf("%s-string is not a literal", p.s[p.i:j])
				}
				return b.String(), nil
			}
		}
		end, st := pySkipString(p.s, j)
		if st != vlOK {
			return "", pyErrf("unterminated string")
		}
		q := 1
		if end-j >= 6 && p.s[j+1] == p.s[j] && p.s[j+2] == p.s[j] {
			q = 3
		}
		body := p.s[j+q : end-q]
		p.i = end
		k := pySkipSpace(p.s, p.i)
		more := k < len(p.s) && (p.s[k] == '\'' || p.s[k] == '"' || pyIdentStart(p.s[k]))
		if first && !more && (raw || strings.IndexByte(body, '\\') < 0) {
			return body, nil // one plain literal: no copy
		}
		if b.Cap() == 0 {
			b.Grow(len(body)) // decoding escapes never lengthens the text
		}
		if raw {
			b.WriteString(body)
		} else if err := pyUnescape(&b, body); err != nil {
			return "", err
		}
		first = false
		if more {
			p.i = k
			continue
		}
		return b.String(), nil
	}
}

// pyUnescape decodes Python string escapes into b.
func pyUnescape(b *strings.Builder, s string) error {
	for i := 0; i < len(s); i++ {
		k := strings.IndexByte(s[i:], '\\')
		if k < 0 {
			b.WriteString(s[i:])
			return nil
		}
		b.WriteString(s[i : i+k])
		i += k + 1
		if i >= len(s) {
			return pyErrf("dangling backslash in string")
		}
		switch c := s[i]; c {
		case '\n':
		case '\\', '\'', '"':
			b.WriteByte(c)
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case 'x', 'u', 'U':
			n := 8
			switch c {
			case 'x':
				n = 2
			case 'u':
				n = 4
			}
			if i+1+n > len(s) {
				return pyErrf("truncated \\%c escape", c)
			}
			v, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32)
			if err != nil || v > 0x10FFFF {
				return pyErrf("bad \\%c escape", c)
			}
			b.WriteRune(rune(v))
			i += n
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := 0
			k := 0
			for k < 3 && i+k < len(s) && s[i+k] >= '0' && s[i+k] <= '7' {
				v = v*8 + int(s[i+k]-'0')
				k++
			}
			b.WriteRune(rune(v))
			i += k - 1
		default:
			// Python keeps unknown escapes verbatim.
			b.WriteByte('\\')
			b.WriteByte(c)
		}
	}
	return nil
}

func (p *pyConv) sequence(dst []byte, open byte) ([]byte, error) {
	if p.depth++; p.depth > pyMaxDepth {
		return nil, pyErrf("nested too deeply")
	}
	defer func() { p.depth-- }()
	closeB := byte(']')
	if open == '(' {
		closeB = ')'
	}
	p.i++
	dst = append(dst, '[')
	n := 0
	for {
		p.i = pySkipSpace(p.s, p.i)
		if p.i >= len(p.s) {
			return nil, pyErrf("unclosed %c", open)
		}
		if p.s[p.i] == closeB {
			p.i++
			break
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = p.value(dst); err != nil {
			return nil, err
		}
		n++
		p.i = pySkipSpace(p.s, p.i)
		if p.i < len(p.s) && p.s[p.i] == ',' {
			p.i++
			continue
		}
		if p.i < len(p.s) && p.s[p.i] == closeB {
			p.i++
			break
		}
		return nil, pyErrf("unexpected %q in %c…%c", pyNear(p.s, p.i), open, closeB)
	}
	return append(dst, ']'), nil
}

// dict converts a dict literal (or a set, which becomes an array). Keys
// that are not strings are rendered the way json.dumps renders them.
func (p *pyConv) dict(dst []byte) ([]byte, error) {
	if p.depth++; p.depth > pyMaxDepth {
		return nil, pyErrf("nested too deeply")
	}
	defer func() { p.depth-- }()
	p.i++
	start := len(dst)
	dst = append(dst, '{')
	n := 0
	isSet := false
	for {
		p.i = pySkipSpace(p.s, p.i)
		if p.i >= len(p.s) {
			return nil, pyErrf("unclosed {")
		}
		if p.s[p.i] == '}' {
			p.i++
			break
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		ks := len(dst)
		var err error
		if dst, err = p.value(dst); err != nil {
			return nil, err
		}
		p.i = pySkipSpace(p.s, p.i)
		if n == 0 && p.i < len(p.s) && p.s[p.i] != ':' {
			isSet = true
		}
		if !isSet {
			if p.i >= len(p.s) || p.s[p.i] != ':' {
				return nil, pyErrf("expected : in dict")
			}
			p.i++
			key := string(dst[ks:])
			if key[0] != '"' {
				dst = appendJSONString(dst[:ks], key)
			}
			dst = append(dst, ':')
			if dst, err = p.value(dst); err != nil {
				return nil, err
			}
		}
		n++
		p.i = pySkipSpace(p.s, p.i)
		if p.i < len(p.s) && p.s[p.i] == ',' {
			p.i++
			continue
		}
		if p.i < len(p.s) && p.s[p.i] == '}' {
			p.i++
			break
		}
		return nil, pyErrf("unexpected %q in dict", pyNear(p.s, p.i))
	}
	if isSet {
		dst[start] = '['
		return append(dst, ']'), nil
	}
	return append(dst, '}'), nil
}

// number converts a Python numeric literal (with optional unary signs) to
// a JSON number.
func (p *pyConv) number(dst []byte) ([]byte, error) {
	neg := false
	for p.i < len(p.s) && (p.s[p.i] == '-' || p.s[p.i] == '+') {
		if p.s[p.i] == '-' {
			neg = !neg
		}
		p.i = pySkipSpace(p.s, p.i+1)
	}
	start := p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		if vlDigit(c) || c == '_' || c == '.' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') {
			p.i++
			continue
		}
		if (c == '+' || c == '-') && p.i > start && (p.s[p.i-1] == 'e' || p.s[p.i-1] == 'E') && !pyIsPrefixed(p.s[start:p.i]) {
			p.i++
			continue
		}
		break
	}
	lit := strings.ReplaceAll(p.s[start:p.i], "_", "")
	if lit == "" {
		return nil, pyErrf("%q is not a literal value", pyNear(p.s, start))
	}
	if neg {
		dst = append(dst, '-')
	}
	if pyIsPrefixed(lit) {
		base := map[byte]int{'x': 16, 'o': 8, 'b': 2}[lit[1]|0x20]
		v, ok := new(big.Int).SetString(lit[2:], base)
		if !ok {
			return nil, pyErrf("bad number %s", lit)
		}
		return v.Append(dst, 10), nil
	}
	isInt := true
	for k := 0; k < len(lit); k++ {
		if !vlDigit(lit[k]) {
			isInt = false
			break
		}
	}
	if isInt {
		t := strings.TrimLeft(lit, "0")
		if t == "" {
			t = "0"
		} else if len(t) != len(lit) {
			return nil, pyErrf("leading zeros in %s", lit)
		}
		return append(dst, t...), nil
	}
	if lit[len(lit)-1] == 'j' || lit[len(lit)-1] == 'J' {
		return nil, pyErrf("complex number %s is not JSON", lit)
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, pyErrf("bad number %s", lit)
	}
	return strconv.AppendFloat(dst, f, 'g', -1, 64), nil
}

func pyIsPrefixed(lit string) bool {
	return len(lit) > 2 && lit[0] == '0' && strings.IndexByte("xXoObB", lit[1]) >= 0
}

// --- families ---

type pythonicParser struct{}

// Parse accepts only an output that is entirely a call list: a sentence
// quoting `[f(x=1)]` is prose, as upstream.
func (pythonicParser) Parse(text string, _ []ToolSchema) Result {
	return pyWholeOutput(text)
}

// pyWholeOutput takes the calls of an output that is entirely a call
// list; any other output is all content.
func pyWholeOutput(text string) Result {
	var c vlCollector
	if !pyWholeList(&c, text) {
		return Result{Content: textPtr(text)}
	}
	return c.result(nil)
}

const (
	llama4PyStart = "<|python_start|>"
	llama4PyEnd   = "<|python_end|>"
)

type llama4PythonicParser struct{}

// Parse takes the list from <|python_start|>…<|python_end|> blocks (text
// around a block is content) or, without markers, the whole output. A block
// that is not a call list (the model running code) stays content.
func (llama4PythonicParser) Parse(text string, _ []ToolSchema) Result {
	if !strings.Contains(text, llama4PyStart) {
		return pyWholeOutput(text)
	}
	var c vlCollector
	var parts []string
	rest := text
	for {
		k := strings.Index(rest, llama4PyStart)
		if k < 0 {
			parts = append(parts, rest)
			break
		}
		parts = append(parts, rest[:k])
		body := rest[k+len(llama4PyStart):]
		after := ""
		if e := strings.Index(body, llama4PyStart); e >= 0 {
			if f := strings.Index(body[:e], llama4PyEnd); f >= 0 {
				body, after = body[:f], body[f+len(llama4PyEnd):]
			} else {
				body, after = body[:e], body[e:]
			}
		} else if f := strings.Index(body, llama4PyEnd); f >= 0 {
			body, after = body[:f], body[f+len(llama4PyEnd):]
		}
		if !pyWholeList(&c, body) {
			parts = append(parts, rest[k:len(rest)-len(after)])
		}
		rest = after
	}
	content := vlJoin(parts)
	if content != nil && c.next() > 0 {
		// Calls written outside the markers as well: take them too rather
		// than leave a call in the content.
		var extra vlCollector
		if pyWholeList(&extra, *content) {
			for _, e := range extra.errs {
				e.Index += c.next()
				c.errs = append(c.errs, e)
			}
			c.calls = append(c.calls, extra.calls...)
			content = nil
		}
	}
	return c.result(content)
}

const (
	olmoStart = "<function_calls>"
	olmoEnd   = "</function_calls>"
)

type olmo3Parser struct{}

// Parse reads newline-separated calls, optionally in <function_calls>
// tags (text before the tag is content). A bracketed list is accepted too,
// and a call may span lines (triple-quoted strings), unlike upstream which
// splits on newlines.
func (olmo3Parser) Parse(text string, tools []ToolSchema) Result {
	return settle(olmo3Once, text, tools)
}

func olmo3Once(text string, _ []ToolSchema) Result {
	var c vlCollector
	if k := strings.Index(text, olmoStart); k >= 0 {
		body := text[k+len(olmoStart):]
		after := ""
		if e := strings.Index(body, olmoEnd); e >= 0 {
			body, after = body[:e], body[e+len(olmoEnd):]
		}
		if olmoCalls(&c, body) {
			return c.result(vlJoin([]string{text[:k], after}))
		}
		return Result{Content: textPtr(text)}
	}
	if !olmoCalls(&c, text) {
		return Result{Content: textPtr(text)}
	}
	return c.result(nil)
}

// olmoCalls parses body when it is entirely calls (a list, or calls
// separated by newlines or commas).
func olmoCalls(c *vlCollector, body string) bool {
	// As in pyWholeList, trailing whitespace never decides whether the
	// output was cut off inside a call: `a("x` and `a("x\n` parse alike.
	body = strings.TrimRightFunc(body, unicode.IsSpace)
	i := pySkipSpace(body, 0)
	if i < len(body) && body[i] == '[' {
		return pyWholeList(c, body)
	}
	var spans []pySpan
	truncAt := -1
	for {
		i = pySkipSpace(body, i)
		if i >= len(body) {
			break
		}
		e, st := pyScanCall(body, i, false)
		if st == vlBad {
			return false
		}
		if st == vlTrunc {
			truncAt = i
			break
		}
		spans = append(spans, pySpan{i, e})
		i = pySkipSpace(body, e)
		if i < len(body) && (body[i] == ',' || body[i] == ';') {
			i++
		}
	}
	if len(spans) == 0 && (truncAt < 0 || pyScanName(body, truncAt) < 0) {
		return false
	}
	pyCalls(c, body, spans, truncAt)
	return true
}

const (
	lfmStart = "<|tool_call_start|>"
	lfmEnd   = "<|tool_call_end|>"
)

type lfm2Parser struct{}

// Parse reads <|tool_call_start|>[calls]<|tool_call_end|> blocks; content is
// the text around them. A body may be a pythonic list (LFM2's default) or a
// JSON list of {"name","arguments"} objects (its JSON mode). An echoed call
// body after a block, ending in an orphan end marker, is not content.
func (lfm2Parser) Parse(text string, _ []ToolSchema) Result {
	if !strings.Contains(text, lfmStart) {
		return Result{Content: textPtr(text)}
	}
	var c vlCollector
	var parts []string
	rest := text
	for {
		k := strings.Index(rest, lfmStart)
		if k < 0 {
			parts = append(parts, rest)
			break
		}
		parts = append(parts, rest[:k])
		body := rest[k+len(lfmStart):]
		after := ""
		if e := strings.Index(body, lfmEnd); e >= 0 {
			if s := strings.Index(body[:e], lfmStart); s >= 0 {
				body, after = body[:s], body[s:]
			} else {
				body, after = body[:e], body[e+len(lfmEnd):]
				// Drop an echo of the call: text up to the last orphan end
				// marker before the next block.
				nextStart := strings.Index(after, lfmStart)
				seg := after
				if nextStart >= 0 {
					seg = after[:nextStart]
				}
				if o := lastIndex(seg, lfmEnd); o >= 0 {
					after = after[o+len(lfmEnd):]
				}
			}
		} else if s := strings.Index(body, lfmStart); s >= 0 {
			body, after = body[:s], body[s:]
		}
		lfmBody(&c, body, rest[k:len(rest)-len(after)])
		rest = after
	}
	return c.result(vlJoin(parts))
}

func lfmBody(c *vlCollector, body, raw string) {
	i := vlSkipWS(body, 0)
	if i < len(body) && body[i] == '[' {
		j := vlSkipWS(body, i+1)
		if j < len(body) && body[j] == '{' {
			c.callList(body, i, vlStdKeys, false)
			return
		}
		if pyWholeList(c, body) {
			return
		}
	} else if olmoCalls(c, body) {
		return
	}
	if strings.TrimSpace(body) == "" {
		c.fail("", "empty tool call block", raw)
		return
	}
	c.fail("", "tool call block is not a list of calls", raw)
}
