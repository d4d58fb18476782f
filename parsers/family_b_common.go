package parsers

// Scanning pieces shared by the non-Hermes vLLM families (family_*.go other
// than the Hermes thirteen): a call vlCollector that numbers good and bad
// calls together, a validating JSON value skipper that tells truncation from
// garbage, and readers for call objects and lists of them. Everything here
// is a hand-written forward scanner: no regexes, no backtracking, one pass.

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// vlCollector accumulates the calls of one output in order. Good calls and
// malformed ones share the index space, so CallError.Index says where the
// bad call sat among all the calls the model tried to make.
type vlCollector struct {
	calls []ToolCall
	errs  []CallError
}

func (c *vlCollector) next() int { return len(c.calls) + len(c.errs) }

func (c *vlCollector) add(name, args, raw string, repairs ...string) {
	if c.calls == nil {
		c.calls = make([]ToolCall, 0, 4) // most turns make 1–4 calls
	}
	c.calls = append(c.calls, ToolCall{ID: NewCallID(), Name: name, Arguments: args, Raw: raw, Repairs: repairs})
}

func (c *vlCollector) fail(name, reason, raw string) {
	shown := raw
	if strings.TrimSpace(raw) == "" {
		shown = "(empty call)"
	}
	c.errs = append(c.errs, CallError{Index: c.next(), Name: name, Reason: reason, Snippet: snippet(shown), Raw: raw})
}

func (c *vlCollector) result(content *string) Result {
	return Result{Content: content, ToolCalls: c.calls, Errors: c.errs}
}

// --- JSON scanning ---

type vlScan uint8

const (
	vlOK    vlScan = iota
	vlTrunc        // input ended inside the value
	vlBad          // not JSON
)

func vlSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func vlSkipWS(s string, i int) int {
	for i < len(s) && vlSpace(s[i]) {
		i++
	}
	return i
}

// vlSkipSpaceAny skips ASCII whitespace including vertical tab and form feed,
// as Python's str.strip does around tags.
func vlSkipSpaceAny(s string, i int) int {
	for i < len(s) && (vlSpace(s[i]) || s[i] == '\v' || s[i] == '\f') {
		i++
	}
	return i
}

// vlSkipString skips the JSON string starting at s[i] == '"'. Raw control
// characters are accepted only when lenient (models that rely on Python's
// json.loads(strict=False)).
func vlSkipString(s string, i int, lenient bool) (int, vlScan) {
	i++
	for i < len(s) {
		c := s[i]
		switch {
		case c == '"':
			return i + 1, vlOK
		case c == '\\':
			if i+1 >= len(s) {
				return len(s), vlTrunc
			}
			switch s[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for k := 2; k < 6; k++ {
					if i+k >= len(s) {
						return len(s), vlTrunc
					}
					if !vlHex(s[i+k]) {
						return i + k, vlBad
					}
				}
				i += 6
			default:
				return i + 1, vlBad
			}
		case c < 0x20 && !lenient:
			return i, vlBad
		default:
			i++
		}
	}
	return len(s), vlTrunc
}

func vlHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func vlDigit(c byte) bool { return c >= '0' && c <= '9' }

// vlSkipNumber skips a JSON number at s[i]; a number that runs into the
// end of input is complete (the caller decides whether more was expected).
func vlSkipNumber(s string, i int) (int, vlScan) {
	if s[i] == '-' {
		i++
		if i >= len(s) {
			return i, vlTrunc
		}
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && vlDigit(s[i]):
		for i < len(s) && vlDigit(s[i]) {
			i++
		}
	default:
		return i, vlBad
	}
	if i < len(s) && s[i] == '.' {
		var st vlScan
		if i, st = vlSkipDigits(s, i+1); st != vlOK {
			return i, st
		}
	}
	return vlSkipExponent(s, i)
}

// vlSkipExponent skips an optional exponent ("e", sign, digits) at s[i].
func vlSkipExponent(s string, i int) (int, vlScan) {
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		return vlSkipDigits(s, i)
	}
	return i, vlOK
}

// vlSkipDigits skips the run of digits a fraction or exponent must have:
// at least one, so running out of input first is a truncation.
func vlSkipDigits(s string, i int) (int, vlScan) {
	if i >= len(s) {
		return i, vlTrunc
	}
	if !vlDigit(s[i]) {
		return i, vlBad
	}
	for i < len(s) && vlDigit(s[i]) {
		i++
	}
	return i, vlOK
}

// vlSkipJSON skips one JSON value starting at s[i] (leading whitespace
// allowed) and returns the index just after it. It validates the grammar
// without building anything, iteratively, so deep nesting cannot blow the
// stack. On failure the index is where the problem was found.
func vlSkipJSON(s string, i int, lenient bool) (int, vlScan) {
	var stackBuf [32]byte
	stack := stackBuf[:0]
	var st vlScan
value:
	i = vlSkipWS(s, i)
	if i >= len(s) {
		return i, vlTrunc
	}
	if c := s[i]; c == '{' || c == '[' {
		var empty bool
		if i, empty, st = vlOpen(s, i); st != vlOK {
			return i, st
		}
		if empty {
			goto after
		}
		stack = append(stack, c)
		if c == '{' {
			goto key
		}
		goto value
	}
	if i, st = vlSkipScalar(s, i, lenient); st != vlOK {
		return i, st
	}
	goto after
key:
	if i, st = vlSkipKey(s, i, lenient); st != vlOK {
		return i, st
	}
	goto value
after:
	if len(stack) == 0 {
		return i, vlOK
	}
	i = vlSkipWS(s, i)
	if i >= len(s) {
		return i, vlTrunc
	}
	switch top := stack[len(stack)-1]; {
	case s[i] == ',':
		i++
		if top == '{' {
			goto key
		}
		goto value
	case (top == '{' && s[i] == '}') || (top == '[' && s[i] == ']'):
		stack = stack[:len(stack)-1]
		i++
		goto after
	}
	return i, vlBad
}

// vlOpen steps into the object or array opening at s[i]. An empty one
// ("{}", "[]") is skipped whole and reported as empty, so the caller only
// pushes containers that still have members to scan.
func vlOpen(s string, i int) (next int, empty bool, st vlScan) {
	closer := byte('}')
	if s[i] == '[' {
		closer = ']'
	}
	i = vlSkipWS(s, i+1)
	if i >= len(s) {
		return i, false, vlTrunc
	}
	if s[i] == closer {
		return i + 1, true, vlOK
	}
	return i, false, vlOK
}

// vlSkipScalar skips the string, number or literal starting at s[i]
// (i < len(s)); anything else cannot start a JSON value.
func vlSkipScalar(s string, i int, lenient bool) (int, vlScan) {
	switch c := s[i]; {
	case c == '"':
		return vlSkipString(s, i, lenient)
	case c == '-' || vlDigit(c):
		return vlSkipNumber(s, i)
	case c == 't':
		return vlSkipLiteral(s, i, "true")
	case c == 'f':
		return vlSkipLiteral(s, i, "false")
	case c == 'n':
		return vlSkipLiteral(s, i, "null")
	}
	return i, vlBad
}

// vlSkipKey skips an object member's key and its colon, leaving i where
// the member's value may start.
func vlSkipKey(s string, i int, lenient bool) (int, vlScan) {
	i = vlSkipWS(s, i)
	if i >= len(s) {
		return i, vlTrunc
	}
	if s[i] != '"' {
		return i, vlBad
	}
	i, st := vlSkipString(s, i, lenient)
	if st != vlOK {
		return i, st
	}
	i = vlSkipWS(s, i)
	if i >= len(s) {
		return i, vlTrunc
	}
	if s[i] != ':' {
		return i, vlBad
	}
	return i + 1, vlOK
}

func vlSkipLiteral(s string, i int, lit string) (int, vlScan) {
	for k := 0; k < len(lit); k++ {
		if i+k >= len(s) {
			return len(s), vlTrunc
		}
		if s[i+k] != lit[k] {
			return i + k, vlBad
		}
	}
	return i + len(lit), vlOK
}

// vlUnquote decodes a complete JSON string literal.
func vlUnquote(lit string) (string, bool) {
	if len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' {
		return "", false
	}
	body := lit[1 : len(lit)-1]
	if strings.IndexByte(body, '\\') < 0 && utf8.ValidString(body) {
		ok := true
		for i := 0; i < len(body); i++ {
			if body[i] < 0x20 {
				ok = false
				break
			}
		}
		if ok {
			return body, true
		}
	}
	var out string
	if err := json.Unmarshal([]byte(lit), &out); err != nil {
		return "", false
	}
	return out, true
}

// vlEachField walks the members of the JSON object at s[i] (leading
// whitespace allowed), calling fn with the decoded key and the raw value.
func vlEachField(s string, i int, lenient bool, fn func(key, val string)) (int, vlScan) {
	i = vlSkipWS(s, i)
	if i >= len(s) {
		return i, vlTrunc
	}
	if s[i] != '{' {
		return i, vlBad
	}
	i = vlSkipWS(s, i+1)
	if i < len(s) && s[i] == '}' {
		return i + 1, vlOK
	}
	for {
		i = vlSkipWS(s, i)
		if i >= len(s) {
			return i, vlTrunc
		}
		if s[i] != '"' {
			return i, vlBad
		}
		ks := i
		var st vlScan
		if i, st = vlSkipString(s, i, lenient); st != vlOK {
			return i, st
		}
		key, ok := vlUnquote(s[ks:i])
		if !ok {
			return ks, vlBad
		}
		i = vlSkipWS(s, i)
		if i >= len(s) {
			return i, vlTrunc
		}
		if s[i] != ':' {
			return i, vlBad
		}
		vs := vlSkipWS(s, i+1)
		if i, st = vlSkipJSON(s, vs, lenient); st != vlOK {
			return i, st
		}
		fn(key, s[vs:i])
		i = vlSkipWS(s, i)
		if i >= len(s) {
			return i, vlTrunc
		}
		switch s[i] {
		case ',':
			i++
		case '}':
			return i + 1, vlOK
		default:
			return i, vlBad
		}
	}
}

// vlScanProblem turns a failed scan into a CallError reason.
func vlScanProblem(s string, at int, st vlScan) string {
	if st == vlTrunc {
		return "truncated: the output ends inside the call"
	}
	near := s[at:]
	if len(near) > 20 {
		near = near[:20]
		for len(near) > 0 && !utf8.ValidString(near) {
			near = near[:len(near)-1]
		}
	}
	return fmt.Sprintf("invalid JSON at offset %d near %q", at, near)
}

// vlCallKeys names the members of a JSON call object.
type vlCallKeys struct {
	name []string // the first present wins
	args []string // the first present wins
	// single: the object maps the function name to its arguments,
	// {"get_weather": {...}} (apertus).
	single bool
}

func (k vlCallKeys) resyncKey() string {
	if k.single || len(k.name) == 0 {
		return ""
	}
	return k.name[0]
}

var vlStdKeys = vlCallKeys{name: []string{"name"}, args: []string{"arguments", "parameters"}}

// fieldIter walks the members of a JSON object without a callback, so
// nothing escapes to the heap on the hot path.
type fieldIter struct {
	s       string
	i       int
	lenient bool
	st      vlScan
	started bool
	done    bool
}

// next returns the next member's decoded key and raw value; ok is false at
// the end of the object (st == vlOK, i after '}') or on a problem (st says
// which, i where).
func (it *fieldIter) next() (key, val string, ok bool) {
	if it.done {
		return "", "", false
	}
	s := it.s
	fail := func(i int, st vlScan) (string, string, bool) {
		it.i, it.st, it.done = i, st, true
		return "", "", false
	}
	i := vlSkipWS(s, it.i)
	if !it.started {
		it.started = true
		if i >= len(s) {
			return fail(i, vlTrunc)
		}
		if s[i] != '{' {
			return fail(i, vlBad)
		}
		i = vlSkipWS(s, i+1)
		if i < len(s) && s[i] == '}' {
			it.i, it.st, it.done = i+1, vlOK, true
			return "", "", false
		}
	}
	if i >= len(s) {
		return fail(i, vlTrunc)
	}
	if s[i] != '"' {
		return fail(i, vlBad)
	}
	ks := i
	var st vlScan
	if i, st = vlSkipString(s, i, it.lenient); st != vlOK {
		return fail(i, st)
	}
	key, kok := vlUnquote(s[ks:i])
	if !kok {
		return fail(ks, vlBad)
	}
	i = vlSkipWS(s, i)
	if i >= len(s) {
		return fail(i, vlTrunc)
	}
	if s[i] != ':' {
		return fail(i, vlBad)
	}
	vs := vlSkipWS(s, i+1)
	if i, st = vlSkipJSON(s, vs, it.lenient); st != vlOK {
		return fail(i, st)
	}
	val = s[vs:i]
	i = vlSkipWS(s, i)
	if i >= len(s) {
		return fail(i, vlTrunc)
	}
	switch s[i] {
	case ',':
		it.i = i + 1
	case '}':
		it.i, it.st, it.done = i+1, vlOK, true
	default:
		return fail(i, vlBad)
	}
	return key, val, true
}

// vlReadCall reads the call object at s[i] in one pass: its extent (end,
// st) and, when it is complete, its name and normalised arguments or the
// reason it is not a valid call.
func vlReadCall(s string, i int, keys vlCallKeys, lenient bool) (end int, st vlScan, name, args, reason string, repairs []string) {
	i = vlSkipWS(s, i)
	if i < len(s) && s[i] != '{' {
		end, st = vlSkipJSON(s, i, lenient)
		return end, st, "", "", "call is not a JSON object", nil
	}
	it := fieldIter{s: s, i: i, lenient: lenient}
	if keys.single {
		n := 0
		var k0, v0 string
		for k, v, ok := it.next(); ok; k, v, ok = it.next() {
			n, k0, v0 = n+1, k, v
		}
		switch {
		case it.st != vlOK:
			return it.i, it.st, "", "", "", nil
		case n != 1:
			return it.i, vlOK, "", "", "call object must map exactly one function name to its arguments", nil
		case strings.TrimSpace(k0) == "":
			return it.i, vlOK, "", "", "empty function name", nil
		}
		args, reason, repairs = vlArgsFromJSON(v0, lenient)
		return it.i, vlOK, k0, args, reason, repairs
	}
	var nameRaw, argsRaw string
	nameRank, argsRank := len(keys.name), len(keys.args)
	for k, v, ok := it.next(); ok; k, v, ok = it.next() {
		for r, want := range keys.name {
			if r < nameRank && k == want {
				nameRank, nameRaw = r, v
			}
		}
		for r, want := range keys.args {
			if r < argsRank && k == want {
				argsRank, argsRaw = r, v
			}
		}
	}
	if it.st != vlOK {
		return it.i, it.st, "", "", "", nil
	}
	end = it.i
	if nameRaw == "" {
		return end, vlOK, "", "", fmt.Sprintf("call object has no %q", keys.name[0]), nil
	}
	name, ok := vlUnquote(nameRaw)
	if !ok {
		return end, vlOK, "", "", fmt.Sprintf("%q is not a string", keys.name[0]), nil
	}
	if strings.TrimSpace(name) == "" {
		return end, vlOK, "", "", "empty function name", nil
	}
	args, reason, repairs = vlArgsFromJSON(argsRaw, lenient)
	return end, vlOK, name, args, reason, repairs
}

// vlArgsFromJSON normalises a raw JSON arguments value; repairs are what
// it fixed to read it (ToolCall.Repairs).
func vlArgsFromJSON(raw string, lenient bool) (args, reason string, repairs []string) {
	if raw == "" || raw == "null" {
		return "{}", "", nil
	}
	if raw[0] == '"' {
		inner, ok := vlUnquote(raw)
		if !ok {
			return "", "arguments string is not valid JSON text", nil
		}
		if strings.TrimSpace(inner) == "" {
			return "{}", "", []string{RepairArgsString}
		}
		if t := strings.TrimSpace(inner); t[0] != '{' {
			return "", "arguments are a string that does not hold a JSON object", nil
		}
		raw = inner
		repairs = append(repairs, RepairArgsString)
	}
	if lenient {
		if esc := vlEscapeControls(raw); esc != raw {
			raw = esc
			repairs = append(repairs, RepairControlChars)
		}
	}
	args, err := normalizeArgs(raw)
	if err != nil {
		return "", err.Error(), nil
	}
	return args, "", repairs
}

// vlEscapeControls escapes raw control characters inside JSON strings, so
// text that Python's json.loads(strict=False) accepts validates here too.
func vlEscapeControls(s string) string {
	need := false
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 {
			need = true
			break
		}
	}
	if !need {
		return s
	}
	var b []byte
	in := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if in {
			switch {
			case c == '\\' && i+1 < len(s):
				b = append(b, c, s[i+1])
				i++
				continue
			case c == '"':
				in = false
			case c < 0x20:
				esc := appendJSONString(nil, string(c))
				b = append(b, esc[1:len(esc)-1]...)
				continue
			}
		} else if c == '"' {
			in = true
		}
		b = append(b, c)
	}
	return string(b)
}

// takeJSONCall reads one call object at s[i] and records it, good or bad.
// It returns where the object ended and the scan status, so that after
// vlBad the caller can decide how to resynchronise.
func (c *vlCollector) takeJSONCall(s string, i int, keys vlCallKeys, lenient bool) (int, vlScan) {
	i = vlSkipWS(s, i)
	end, st, name, args, reason, repairs := vlReadCall(s, i, keys, lenient)
	switch st {
	case vlTrunc:
		c.fail(vlPeekName(s[i:]), "truncated: the output ends inside the call", s[i:])
		return len(s), st
	case vlBad:
		c.fail(vlPeekName(s[i:]), vlScanProblem(s, end, st), s[i:min(len(s), max(end+1, i+1))])
		return end, st
	}
	if reason != "" {
		c.fail(name, reason, s[i:end])
	} else {
		c.add(name, args, s[i:end], repairs...)
	}
	return end, vlOK
}

// vlPeekName finds a "name" string early in a malformed call, for the error.
func vlPeekName(s string) string {
	k := strings.Index(s, `"name"`)
	if k < 0 || k > 200 {
		return ""
	}
	i := vlSkipWS(s, k+6)
	if i >= len(s) || s[i] != ':' {
		return ""
	}
	i = vlSkipWS(s, i+1)
	if i >= len(s) || s[i] != '"' {
		return ""
	}
	e, st := vlSkipString(s, i, false)
	if st != vlOK {
		return ""
	}
	n, _ := vlUnquote(s[i:e])
	return n
}

// callList reads a JSON array of call objects starting at s[i] == '['. A
// malformed element is reported and the scan resumes at the next element
// that starts like a call object, so siblings survive. It returns the index
// after the closing ']' and whether the array was closed.
func (c *vlCollector) callList(s string, i int, keys vlCallKeys, lenient bool) (int, bool) {
	n0 := c.next()
	i++
	for {
		i = vlSkipWS(s, i)
		if i >= len(s) {
			if c.next() == n0 {
				c.fail("", "truncated: the call list ends before its first call", s)
			}
			return len(s), false
		}
		if s[i] == ']' {
			return i + 1, true
		}
		start := i
		end, st := c.takeJSONCall(s, i, keys, lenient)
		switch st {
		case vlTrunc:
			return len(s), false
		case vlBad:
			next := vlNextCallObject(s, start+1, keys.resyncKey())
			if next < 0 {
				return len(s), false
			}
			i = next
			continue
		}
		i = vlSkipWS(s, end)
		if i >= len(s) {
			return len(s), false
		}
		switch s[i] {
		case ',':
			i++
		case ']':
			return i + 1, true
		default:
			// Junk between elements: treat like a missing comma when another
			// call object follows, otherwise the list ends here.
			next := vlNextCallObject(s, i, keys.resyncKey())
			if next < 0 {
				return i, false
			}
			i = next
		}
	}
}

// vlNextCallObject finds the next `{ "key"` at or after i (whitespace allowed
// after the brace), the resynchronisation point after a malformed element.
func vlNextCallObject(s string, i int, key string) int {
	for i < len(s) {
		k := strings.IndexByte(s[i:], '{')
		if k < 0 {
			return -1
		}
		j := vlSkipWS(s, i+k+1)
		if key == "" && j < len(s) && s[j] == '"' {
			return i + k
		}
		if key != "" && j+len(key)+2 <= len(s) && s[j] == '"' && s[j+1:j+1+len(key)] == key && s[j+1+len(key)] == '"' {
			return i + k
		}
		i += k + 1
	}
	return -1
}

// --- text helpers ---

// vlNameByte reports bytes allowed in tool names of the XML-ish formats.
func vlNameByte(c byte) bool {
	return c == '_' || c == '-' || c == '.' || c == ':' || c == '/' || vlDigit(c) ||
		(c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80
}

// vlValidName reports whether s is a plausible function name: non-empty, no
// spaces or markup.
func vlValidName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !vlNameByte(s[i]) {
			return false
		}
	}
	return true
}

// vlJoin concatenates outside-the-call text segments. A newline goes
// between non-empty segments so that two fragments can never fuse into a
// marker that was not in the output.
func vlJoin(parts []string) *string {
	n, only := 0, ""
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" {
			n, only = n+1, p
		}
	}
	switch n {
	case 0:
		return nil
	case 1:
		return &only // no copy for the common single segment
	}
	var b strings.Builder
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p)
	}
	out := b.String()
	return &out
}

// vlDeclared reports whether tool fn's schema lists param.
func vlDeclared(tools []ToolSchema, fn, param string) bool {
	for i := range tools {
		if tools[i].Name == fn {
			_, ok := propertyTypes(tools[i].Parameters)[param]
			return ok
		}
	}
	return false
}

// vlTrimNL removes one leading and one trailing newline (with an
// optional carriage return), the padding the XML templates put around
// values.
func vlTrimNL(v string) string {
	if strings.HasPrefix(v, "\r\n") {
		v = v[2:]
	} else if strings.HasPrefix(v, "\n") {
		v = v[1:]
	}
	if strings.HasSuffix(v, "\r\n") {
		v = v[:len(v)-2]
	} else if strings.HasSuffix(v, "\n") {
		v = v[:len(v)-1]
	}
	return v
}

// vlXMLValue types a string-encoded parameter value with the schema (§4.1).
// A string-only or undeclared parameter keeps its text minus the template's
// newline padding; other types ignore surrounding whitespace. An undeclared
// parameter whose text is a JSON object or array keeps that structure, as
// the model plainly meant it.
func vlXMLValue(tools []ToolSchema, fn, param, raw string) json.RawMessage {
	types := paramTypes(tools, fn, param)
	if len(types) == 1 && types[0] == "string" {
		v := vlTrimNL(raw)
		if !vlDeclared(tools, fn, param) {
			t := strings.TrimSpace(v)
			if t != "" && (t[0] == '{' || t[0] == '[') {
				if c, err := compactJSON(t); err == nil {
					return json.RawMessage(c)
				}
			}
		}
		return json.RawMessage(appendJSONString(nil, v))
	}
	if hasType(types, "string") {
		// Non-string types see the trimmed text; a string result keeps only
		// the template padding off.
		out := coerceValue(strings.TrimSpace(raw), types)
		if len(out) > 0 && out[0] == '"' {
			return json.RawMessage(appendJSONString(nil, vlTrimNL(raw)))
		}
		return out
	}
	return coerceValue(raw, types)
}

// --- generic tagged formats ---

// tagScan is the outcome of scanning an output for marker-delimited calls:
// the calls, the text outside them (in order) and where the first call
// started (-1 when none was recognised).
type tagScan struct {
	c     vlCollector
	parts []string
	first int
}

// content returns the text before the first call, or the whole text.
func (t *tagScan) before(text string) *string {
	if t.first < 0 {
		return textPtr(text)
	}
	return textPtr(text[:t.first])
}

// jsonTagCalls finds open…close blocks each holding one JSON call object
// (granite4, ernie45, internlm, granite-20b-fc). A marker followed by
// something other than '{' is prose and stays in the text. A block whose
// close marker is missing is still a call when its JSON is complete (a stop
// sequence may have eaten the marker); incomplete JSON is a truncation.
func jsonTagCalls(text, open, close string, keys vlCallKeys, lenient bool) tagScan {
	ts := tagScan{first: -1, parts: make([]string, 0, 6)}
	last := 0 // start of the current outside segment
	from := 0
	for {
		k := strings.Index(text[from:], open)
		if k < 0 {
			break
		}
		k += from
		j := vlSkipWS(text, k+len(open))
		if j < len(text) && text[j] != '{' && !strings.HasPrefix(text[j:], open) &&
			(close == "" || !strings.HasPrefix(text[j:], close)) {
			from = k + len(open) // prose mentioning the marker
			continue
		}
		ts.parts = append(ts.parts, text[last:k])
		if ts.first < 0 {
			ts.first = k
		}
		end := ts.jsonBlock(text, k, j, open, close, keys, lenient)
		last, from = end, end
	}
	ts.parts = append(ts.parts, text[last:])
	return ts
}

// jsonBlock records the call of the block whose marker is at k and whose
// body starts at j; it returns where the block ends.
func (ts *tagScan) jsonBlock(text string, k, j int, open, close string, keys vlCallKeys, lenient bool) int {
	if j >= len(text) {
		ts.c.fail("", "truncated: the output ends after the call marker", text[k:])
		return len(text)
	}
	if strings.HasPrefix(text[j:], open) {
		ts.c.fail("", "empty call: a call marker directly follows another", text[k:j])
		return j
	}
	if close != "" && strings.HasPrefix(text[j:], close) {
		ts.c.fail("", "empty call", text[k:j+len(close)])
		return j + len(close)
	}
	// blockEnd finds the end of a broken block: its close marker, else the
	// next open marker, else the end of the text.
	blockEnd := func(from int) int {
		nextOpen := strings.Index(text[from:], open)
		cl := -1
		if close != "" {
			cl = strings.Index(text[from:], close)
		}
		switch {
		case cl >= 0 && (nextOpen < 0 || cl < nextOpen):
			return from + cl + len(close)
		case nextOpen >= 0:
			return from + nextOpen
		}
		return len(text)
	}
	end, st, name, args, reason, repairs := vlReadCall(text, j, keys, lenient)
	switch st {
	case vlTrunc:
		ts.c.fail(vlPeekName(text[j:]), "truncated: the output ends inside the call", text[k:])
		return len(text)
	case vlBad:
		be := blockEnd(j + 1)
		ts.c.fail(vlPeekName(text[j:]), vlScanProblem(text, end, st), text[k:be])
		return be
	}
	after := vlSkipWS(text, end)
	blockStop := after
	switch {
	case after >= len(text):
	case close != "" && strings.HasPrefix(text[after:], close):
		blockStop = after + len(close)
	case strings.HasPrefix(text[after:], open):
	case close == "":
		blockStop = end
	default:
		be := blockEnd(after)
		ts.c.fail(name, "unexpected text after the call object", text[k:be])
		return be
	}
	if reason != "" {
		ts.c.fail(name, reason, text[k:blockStop])
	} else {
		ts.c.add(name, args, text[k:blockStop], repairs...)
	}
	return blockStop
}

// listTagCalls finds open[ … ]close blocks holding a JSON array of call
// objects (jamba, hunyuan_a13b, granite, phi4_mini_json, apertus, cohere).
// A marker not followed by '[' is prose. close may be empty (no closing
// marker in the format) and is optional in the output. skip, when set,
// reports marker positions to ignore (inside reasoning).
func listTagCalls(text, open, close string, keys vlCallKeys, skip func(int) bool) tagScan {
	ts := tagScan{first: -1, parts: make([]string, 0, 4)}
	last, from := 0, 0
	for {
		k := strings.Index(text[from:], open)
		if k < 0 {
			break
		}
		k += from
		j := vlSkipWS(text, k+len(open))
		if (j < len(text) && text[j] != '[') || (skip != nil && skip(k)) {
			from = k + len(open)
			continue
		}
		ts.parts = append(ts.parts, text[last:k])
		if ts.first < 0 {
			ts.first = k
		}
		if j >= len(text) {
			ts.c.fail("", "truncated: the output ends after the call marker", text[k:])
			last, from = len(text), len(text)
			break
		}
		n0 := ts.c.next()
		end, closed := ts.c.callList(text, j, keys, false)
		if closed {
			e := vlSkipWS(text, end)
			if close != "" && strings.HasPrefix(text[e:], close) {
				end = e + len(close)
			}
		} else if close != "" {
			// Skip the rest of a broken block.
			if cl := strings.Index(text[end:], close); cl >= 0 {
				end += cl + len(close)
			} else {
				end = len(text)
			}
		}
		if ts.c.next() == n0 {
			ts.c.fail("", "empty call list", text[k:end])
		}
		last, from = end, end
	}
	ts.parts = append(ts.parts, text[last:])
	return ts
}

// thinkSpans returns the [start,end) ranges of <think>…</think> blocks; an
// unclosed block runs to the end.
func thinkSpans(text, open, close string) [][2]int {
	var out [][2]int
	from := 0
	for {
		k := strings.Index(text[from:], open)
		if k < 0 {
			return out
		}
		k += from
		e := strings.Index(text[k:], close)
		if e < 0 {
			return append(out, [2]int{k, len(text)})
		}
		out = append(out, [2]int{k, k + e + len(close)})
		from = k + e + len(close)
	}
}

func inSpans(spans [][2]int, pos int) bool {
	for _, s := range spans {
		if pos >= s[0] && pos < s[1] {
			return true
		}
	}
	return false
}

// onceParser is a family's single pass; settle wraps it.
type onceParser func(text string, tools []ToolSchema) Result

// settle re-parses the content of a single pass while it still yields
// calls, for formats whose pass takes one payload (xlam, bare granite
// lists, olmo3 blocks): a second payload must become calls, never content.
// Each round removes at least one payload, so it ends; the cap is a guard.
func settle(once onceParser, text string, tools []ToolSchema) Result {
	r := once(text, tools)
	for round := 0; round < 16 && r.Content != nil && len(r.ToolCalls)+len(r.Errors) > 0; round++ {
		sub := once(*r.Content, tools)
		if len(sub.ToolCalls)+len(sub.Errors) == 0 {
			break
		}
		base := len(r.ToolCalls) + len(r.Errors)
		for _, e := range sub.Errors {
			e.Index += base
			r.Errors = append(r.Errors, e)
		}
		r.ToolCalls = append(r.ToolCalls, sub.ToolCalls...)
		r.Content = sub.Content
	}
	return r
}

// lastIndex is strings.LastIndex built on forward strings.Index, which is
// vectorised; LastIndex scans byte by byte from the end.
func lastIndex(s, sub string) int {
	last := -1
	for from := 0; from <= len(s); {
		k := strings.Index(s[from:], sub)
		if k < 0 {
			break
		}
		last = from + k
		from = last + max(1, len(sub))
	}
	return last
}

// newArgs returns an argsBuilder sized for a typical call, saving the
// slice regrowth of the first few parameters.
func newArgs() argsBuilder {
	return argsBuilder{keys: make([]string, 0, 4), vals: make([]json.RawMessage, 0, 4)}
}
