package parsers

// Pieces shared by the Hermes-registry families (hermes_*.go): a strict JSON
// scanner that finds where a value ends without decoding it, the decoding of
// {"name":…,"arguments":…} call objects, and the collector that numbers
// calls and errors in output order.

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// errJSONEOF marks JSON that is well-formed so far but ends too early: the
// signature of output cut off by max_tokens.
var errJSONEOF = errors.New("unexpected end of input")

// jsonError locates a syntax error in scanned JSON.
type jsonError struct {
	off int
	msg string
}

func (e *jsonError) Error() string { return fmt.Sprintf("invalid JSON at offset %d: %s", e.off, e.msg) }

const maxJSONDepth = 512

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(s string, i int) int {
	for i < len(s) && isJSONSpace(s[i]) {
		i++
	}
	return i
}

// scanValue checks the JSON value starting at s[i] and returns the index just
// past it. It validates strictly (RFC 8259) but allocates nothing, so a
// parser can find the extent of a call in model output before deciding what
// to decode.
func scanValue(s string, i int) (int, error) {
	return scanValueDepth(s, i, 0, nil)
}

// scanCompact is scanValue that also returns the value without the
// whitespace between its tokens, key order and string contents byte for
// byte. Arguments are validated and compacted in the same pass instead of
// one pass each. The value is a slice of s when there was nothing to drop.
func scanCompact(s string, i int) (end int, compact string, err error) {
	// The value is at most the rest of s. When that surely fits the room,
	// the value is gathered on the stack and copied out once, at its size.
	var room [512]byte
	// The Builder is held by pointer: its buffer escapes to the heap, and
	// escape analysis, which does not tell a struct's fields apart, would
	// move the room along with it.
	var big strings.Builder
	cp := compactor{kept: i, big: &big}
	if len(s)-i <= len(room) {
		cp.small = room[:0]
	}
	if end, err = scanValueDepth(s, i, 0, &cp); err != nil {
		return end, "", err
	}
	switch {
	case cp.kept == i:
		return end, s[i:end], nil
	case cp.small != nil:
		cp.keepSmall(s, end)
		return end, string(cp.small), nil
	}
	cp.keepBig(s, end)
	return end, cp.big.String(), nil
}

// compactor collects what scanValueDepth walks minus the whitespace it
// skips between tokens, in small when that is set, else in big (whose
// String does not copy). small is preferred because appending to it only
// stores a length: a Builder is written through a pointer at every piece,
// which costs a GC write barrier whenever the collector is marking.
type compactor struct {
	small []byte
	big   *strings.Builder
	kept  int // s[kept:] has not been kept yet
}

// skip is skipSpace that, when cp is not nil, drops what it skips. The
// common case, no whitespace at all, is one comparison (small enough to
// inline: the scanner calls this between every two tokens).
func (cp *compactor) skip(s string, i int) int {
	if i < len(s) && s[i] <= ' ' {
		return cp.drop(s, i)
	}
	return i
}

// drop skips the whitespace at s[i] and keeps the text before it.
func (cp *compactor) drop(s string, i int) int {
	j := skipSpace(s, i)
	if cp == nil || j == i {
		return j
	}
	if cp.small != nil {
		cp.keepSmall(s, i)
	} else {
		cp.keepBig(s, i)
	}
	cp.kept = j
	return j
}

// keepSmall adds s[kept:to] to small, which has room for it.
func (cp *compactor) keepSmall(s string, to int) {
	n := len(cp.small)
	cp.small = cp.small[:n+to-cp.kept] // a length store: no write barrier
	copy(cp.small[n:], s[cp.kept:to])
}

// keepBig adds s[kept:to] to big.
func (cp *compactor) keepBig(s string, to int) {
	if cp.big.Cap() == 0 {
		cp.big.Grow(len(s) - cp.kept) // at most the rest of s: one allocation
	}
	cp.big.WriteString(s[cp.kept:to])
}

// scanAfter reads what follows an object member or array element: a
// comma (more follows; next is past it and the blanks after it) or closer
// (done; next is past it). bad is the error for anything else.
func scanAfter(s string, i int, closer byte, bad string, cp *compactor) (next int, done bool, err error) {
	i = cp.skip(s, i)
	if i >= len(s) {
		return i, false, errJSONEOF
	}
	switch s[i] {
	case ',':
		return cp.skip(s, i+1), false, nil
	case closer:
		return i + 1, true, nil
	}
	return i, false, &jsonError{i, bad}
}

func scanValueDepth(s string, i, depth int, cp *compactor) (int, error) {
	if i >= len(s) {
		return i, errJSONEOF
	}
	switch c := s[i]; {
	case c == '{':
		if depth >= maxJSONDepth {
			return i, &jsonError{i, "nesting too deep"}
		}
		i = cp.skip(s, i+1)
		if i < len(s) && s[i] == '}' {
			return i + 1, nil
		}
		for {
			if i >= len(s) {
				return i, errJSONEOF
			}
			if s[i] != '"' {
				return i, &jsonError{i, "expected a string key"}
			}
			end, err := scanString(s, i)
			if err != nil {
				return end, err
			}
			i = cp.skip(s, end)
			if i >= len(s) {
				return i, errJSONEOF
			}
			if s[i] != ':' {
				return i, &jsonError{i, "expected ':' after key"}
			}
			i = cp.skip(s, i+1)
			if i, err = scanValueDepth(s, i, depth+1, cp); err != nil {
				return i, err
			}
			var done bool
			if i, done, err = scanAfter(s, i, '}', "expected ',' or '}' in object", cp); err != nil || done {
				return i, err
			}
		}
	case c == '[':
		if depth >= maxJSONDepth {
			return i, &jsonError{i, "nesting too deep"}
		}
		i = cp.skip(s, i+1)
		if i < len(s) && s[i] == ']' {
			return i + 1, nil
		}
		for {
			var err error
			if i, err = scanValueDepth(s, i, depth+1, cp); err != nil {
				return i, err
			}
			var done bool
			if i, done, err = scanAfter(s, i, ']', "expected ',' or ']' in array", cp); err != nil || done {
				return i, err
			}
		}
	case c == '"':
		return scanString(s, i)
	case c == 't':
		return scanLiteral(s, i, "true")
	case c == 'f':
		return scanLiteral(s, i, "false")
	case c == 'n':
		return scanLiteral(s, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return scanNumber(s, i)
	default:
		return i, &jsonError{i, fmt.Sprintf("unexpected character %q", c)}
	}
}

func scanLiteral(s string, i int, lit string) (int, error) {
	for k := 0; k < len(lit); k++ {
		if i+k >= len(s) {
			return i + k, errJSONEOF
		}
		if s[i+k] != lit[k] {
			return i + k, &jsonError{i + k, "invalid literal"}
		}
	}
	return i + len(lit), nil
}

// strPlain marks the bytes that need no attention inside a JSON string
// (skipStrPlain tests eight at a time).
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func scanString(s string, i int) (int, error) {
	j := i + 1
	for {
		j = skipStrPlain(s, j)
		if j >= len(s) {
			return len(s), errJSONEOF
		}
		switch c := s[j]; {
		case c == '"':
			return j + 1, nil
		case c == '\\':
			j++
			if j >= len(s) {
				return j, errJSONEOF
			}
			switch s[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for k := 1; k <= 4; k++ {
					if j+k >= len(s) {
						return j + k, errJSONEOF
					}
					if !isHex(s[j+k]) {
						return j + k, &jsonError{j + k, "invalid \\u escape"}
					}
				}
				j += 4
			default:
				return j, &jsonError{j, fmt.Sprintf("invalid escape \\%c", s[j])}
			}
			j++
		default:
			return j, &jsonError{j, "control character in string"}
		}
	}
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func scanNumber(s string, i int) (int, error) {
	j := i
	if s[j] == '-' {
		j++
	}
	digits := func() int {
		k := j
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		return j - k
	}
	if j >= len(s) {
		return j, errJSONEOF
	}
	if s[j] == '0' {
		j++
	} else if digits() == 0 {
		return j, &jsonError{j, "invalid number"}
	}
	if j < len(s) && s[j] == '.' {
		j++
		if j >= len(s) {
			return j, errJSONEOF
		}
		if digits() == 0 {
			return j, &jsonError{j, "invalid number"}
		}
	}
	if j < len(s) && (s[j] == 'e' || s[j] == 'E') {
		j++
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j >= len(s) {
			return j, errJSONEOF
		}
		if digits() == 0 {
			return j, &jsonError{j, "invalid number"}
		}
	}
	return j, nil
}

// unquoteJSON decodes a scanned JSON string literal; the common case of no
// escapes is a slice, not a copy.
func unquoteJSON(lit string) (string, bool) {
	if len(lit) < 2 || lit[0] != '"' {
		return "", false
	}
	if !strings.ContainsRune(lit, '\\') {
		return lit[1 : len(lit)-1], true
	}
	var out string
	if json.Unmarshal([]byte(lit), &out) != nil {
		return "", false
	}
	return out, true
}

// describeScanErr turns a scanner error into a CallError reason.
func describeScanErr(err error, what string) string {
	if errors.Is(err, errJSONEOF) {
		return what + " is truncated (output ended inside the JSON)"
	}
	return what + ": " + err.Error()
}

// callObject is a decoded {"name":…,"arguments"|"parameters":…} object.
type callObject struct {
	name    string
	hasName bool
	hasArgs bool   // an "arguments" or "parameters" key was present
	args    string // normalised JSON object text
	argsErr error
	repairs []string // what was fixed to read it (ToolCall.Repairs)
}

// scanCallObject validates the JSON object at s[i] and reads its "name" and
// "arguments" (or "parameters") members in the same pass. Arguments given
// as a JSON string holding an object are unwrapped (Hermes would
// double-encode them; vLLM fails): models trained on OpenAI transcripts do
// emit that form.
func scanCallObject(s string, i int) (end int, co callObject, err error) {
	if i >= len(s) || s[i] != '{' {
		return i, co, &jsonError{i, "expected an object"}
	}
	argsSpan, paramsSpan := "", ""
	j := skipSpace(s, i+1)
	if j < len(s) && s[j] == '}' {
		end = j + 1
	} else {
		for {
			if j >= len(s) {
				return j, co, errJSONEOF
			}
			if s[j] != '"' {
				return j, co, &jsonError{j, "expected a string key"}
			}
			kEnd, err := scanString(s, j)
			if err != nil {
				return kEnd, co, err
			}
			key := s[j:kEnd]
			j = skipSpace(s, kEnd)
			if j >= len(s) {
				return j, co, errJSONEOF
			}
			if s[j] != ':' {
				return j, co, &jsonError{j, "expected ':' after key"}
			}
			j = skipSpace(s, j+1)
			vStart := j
			if j, err = scanValue(s, j); err != nil {
				return j, co, err
			}
			switch key {
			case `"name"`:
				if n, ok := unquoteJSON(s[vStart:j]); ok {
					co.name, co.hasName = n, true
				} else {
					co.argsErr = errors.New(`"name" is not a string`)
				}
			case `"arguments"`:
				argsSpan = s[vStart:j]
			case `"parameters"`:
				paramsSpan = s[vStart:j]
			}
			j = skipSpace(s, j)
			if j >= len(s) {
				return j, co, errJSONEOF
			}
			if s[j] == '}' {
				end = j + 1
				break
			}
			if s[j] != ',' {
				return j, co, &jsonError{j, "expected ',' or '}' in object"}
			}
			j = skipSpace(s, j+1)
		}
	}
	if co.argsErr != nil {
		return end, co, nil
	}
	span := argsSpan
	if span == "" {
		span = paramsSpan
	}
	co.hasArgs = span != ""
	co.args, co.argsErr = argsFromJSONValue(span)
	if co.argsErr == nil && span != "" && span[0] == '"' {
		co.repairs = append(co.repairs, RepairArgsString)
	}
	return end, co, nil
}

// decodeCallObject reads a call object that scanValue already accepted.
func decodeCallObject(s string) callObject {
	_, co, _ := scanCallObject(s, 0)
	return co
}

// argsFromJSONValue turns the JSON value given for "arguments" into a
// compact object: absent or null means no arguments.
func argsFromJSONValue(span string) (string, error) {
	switch {
	case span == "" || span == "null":
		return "{}", nil
	case span[0] == '"':
		inner, ok := unquoteJSON(span)
		if !ok {
			return "", errors.New("arguments string cannot be decoded")
		}
		if strings.TrimSpace(inner) == "" {
			return "{}", nil
		}
		out, err := normalizeArgs(inner)
		if err != nil {
			return "", fmt.Errorf("arguments given as a string: %w", err)
		}
		return out, nil
	}
	return normalizeScanned(span)
}

// normalizeScanned is normalizeArgs for a value scanValue already accepted.
func normalizeScanned(span string) (string, error) {
	if span[0] != '{' {
		return "", fmt.Errorf("arguments are a JSON %s, not an object", jsonKind(json.RawMessage(span)))
	}
	_, out, _ := scanCompact(span, 0)
	return validUTF8(out), nil
}

// collector accumulates calls and errors, numbering them together in output
// order so that CallError.Index points at the call's position.
type collector struct {
	r Result
	// newID makes the ids of calls without a native one (nil: NewCallID).
	newID func() string
}

func (c *collector) freshID() string {
	if c.newID != nil {
		return c.newID()
	}
	return NewCallID()
}

func (c *collector) next() int { return len(c.r.ToolCalls) + len(c.r.Errors) }

func (c *collector) ok(name, args, raw string, repairs ...string) {
	c.add(ToolCall{ID: c.freshID(), Name: name, Arguments: args, Raw: raw, Repairs: repairs})
}

// Repairs the parsers report (ToolCall.Repairs).
const (
	RepairArgsString   = "arguments given as a JSON string, decoded"
	RepairCloseMissing = "close marker missing"
	// RepairControlChars: raw control characters inside JSON strings,
	// escaped (Python's json.loads(strict=False) reads them).
	RepairControlChars = "control characters in JSON strings, escaped"
	// RepairParamCloseMissing: an XML parameter value not closed by its
	// </parameter>, ended at the next tag.
	RepairParamCloseMissing = "parameter close tag missing"
	// RepairPyLiteral: an object or array value written as a Python
	// literal ({'a': True}), converted to JSON.
	RepairPyLiteral = "Python literal converted to JSON"
	// RepairUnwrapped: the arguments came wrapped in one undeclared key
	// ("arguments", "input", "properties") and were unwrapped.
	RepairUnwrapped = "arguments unwrapped from a wrapper key"
	// RepairArtefacts: byte-level BPE markers (Ġ, Ċ) in the text were
	// read as the space and newline they stand for.
	RepairArtefacts = "tokenizer artefacts (Ġ, Ċ) replaced"
)

func (c *collector) add(tc ToolCall) {
	if c.r.ToolCalls == nil {
		c.r.ToolCalls = make([]ToolCall, 0, 4) // most turns make 1-4 calls
	}
	c.r.ToolCalls = append(c.r.ToolCalls, tc)
}

// okNative records a call under the model's own id; a repeated id (the model
// reused an index) falls back to a fresh one so ids stay unique.
func (c *collector) okNative(id, name, args, raw string) {
	if id == "" {
		id = c.freshID()
	}
	for _, prev := range c.r.ToolCalls {
		if prev.ID == id {
			id = c.freshID()
			break
		}
	}
	c.add(ToolCall{ID: id, Name: name, Arguments: args, Raw: raw})
}

func (c *collector) fail(name, reason, raw string) {
	c.r.Errors = append(c.r.Errors, CallError{Index: c.next(), Name: name, Reason: reason, Snippet: snippet(raw), Raw: raw})
}

// result finishes with the content rule shared by these families: the
// trimmed text before the first recognised call, or the whole text when
// there was none.
func (c *collector) result(text string, firstCall int) Result {
	if firstCall < 0 {
		firstCall = len(text)
	}
	c.r.Content = textPtr(text[:firstCall])
	return c.r
}

// isFuncName reports whether s can be a function name: non-empty, no
// whitespace or markup. It is what separates "<tool_call>get_time" from
// prose such as "<tool_call> tags are used for ...".
func isFuncName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !funcNameByte[s[i]] {
			return false
		}
	}
	return true
}

// funcNameByte marks the bytes isFuncName accepts: one lookup per byte
// instead of a chain of comparisons.
var funcNameByte = func() (t [256]bool) {
	for c := ' ' + 1; c < 256; c++ {
		t[c] = !strings.ContainsRune("<>{}\"'(),`[]=", rune(c))
	}
	return t
}()
