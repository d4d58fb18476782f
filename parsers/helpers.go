package parsers

// Shared building blocks for every family: call ids, schema-driven value
// typing (reference §4.1), an order-preserving JSON object builder, argument
// validation and the small text helpers used to fill Result.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// NewCallID returns "call_" followed by 24 random lowercase hex digits. It is
// the id for every family that has no native id of its own. Ids must be
// unique, not secret: the runtime-seeded ChaCha8 generator behind
// math/rand/v2 gives 96 random bits without a system call per id.
func NewCallID() string {
	const hexDigits = "0123456789abcdef"
	var out [5 + 24]byte
	copy(out[:], "call_")
	a, b := rand.Uint64(), rand.Uint32()
	for k := 0; k < 16; k++ {
		out[5+k] = hexDigits[(a>>(60-4*k))&0xf]
	}
	for k := 0; k < 8; k++ {
		out[21+k] = hexDigits[(b>>(28-4*k))&0xf]
	}
	return string(out[:])
}

// NewMistralCallID returns 9 random characters from [a-zA-Z0-9]: the id
// shape Mistral's tokenizer (mistral_common) and the Mistral chat
// templates accept, and the one vLLM's mistral parser and the Hermes client
// generate. A `call_`+hex id in a conversation makes those templates refuse
// to render it (tokens mode re-renders every turn), so the mistral family
// generates these instead of NewCallID's. 9 of 62 symbols are 53 bits:
// unique enough within a conversation, which is where ids are matched.
func NewMistralCallID() string {
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	// 62^9 < 2^54: one uniform draw, written in base 62, is the whole id
	// (a draw per character made the generator most of mistral's cost).
	const ids = 62 * 62 * 62 * 62 * 62 * 62 * 62 * 62 * 62
	n := rand.Uint64N(ids)
	var out [9]byte
	for i := range out {
		out[i] = alnum[n%62]
		n /= 62
	}
	return string(out[:])
}

// CallIDMaker is a Parser whose family has an id shape of its own for the
// ids it makes up (mistral); the others use NewCallID.
type CallIDMaker interface {
	NewCallID() string
}

// NewCallIDFor returns a fresh call id in the shape p's family expects
// (NewCallID when p is nil or not a CallIDMaker). The agent loop uses it
// for the answers to calls it could not parse.
func NewCallIDFor(p Parser) string {
	if m, ok := p.(CallIDMaker); ok {
		return m.NewCallID()
	}
	return NewCallID()
}

// isMistralCallID reports whether id has the NewMistralCallID shape.
func isMistralCallID(id string) bool {
	if len(id) != 9 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') {
			return false
		}
	}
	return true
}

// isCallID reports whether id has the NewCallID shape.
func isCallID(id string) bool {
	if len(id) != 29 || !strings.HasPrefix(id, "call_") {
		return false
	}
	for i := 5; i < len(id); i++ {
		c := id[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ToolsFromOpenAI decodes an OpenAI-style `tools` array
// ([{"type":"function","function":{"name",...,"parameters"}}]). Bare function
// objects ({"name",...}) are accepted too, since hand-written tool files often
// omit the wrapper.
func ToolsFromOpenAI(data []byte) ([]ToolSchema, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("tools: want a JSON array of tools: %w", err)
	}
	out := make([]ToolSchema, 0, len(raw))
	for i, r := range raw {
		var entry struct {
			Type     string      `json:"type"`
			Function *ToolSchema `json:"function"`
			ToolSchema
		}
		if err := json.Unmarshal(r, &entry); err != nil {
			return nil, fmt.Errorf("tools[%d]: %w", i, err)
		}
		ts := entry.ToolSchema
		if entry.Function != nil {
			ts = *entry.Function
		}
		if ts.Name == "" {
			return nil, fmt.Errorf("tools[%d]: function has no name", i)
		}
		out = append(out, ts)
	}
	return out, nil
}

// --- schema-driven typing (reference §4.1) ---

// schemaCache maps a tool's raw parameters schema to its per-property type
// lists. Tools repeat on every turn of a rollout, so the schema is decoded
// once per distinct text instead of once per parameter. Bounded: cleared when
// full rather than tracking recency, which is enough for a working set of a
// few dozen tools.
var schemaCache = struct {
	sync.RWMutex
	m map[string]map[string][]string
}{m: map[string]map[string][]string{}}

const schemaCacheMax = 512

func propertyTypes(params json.RawMessage) map[string][]string {
	if len(params) == 0 {
		return nil
	}
	schemaCache.RLock()
	props, ok := schemaCache.m[string(params)]
	schemaCache.RUnlock()
	if ok {
		return props
	}
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	props = map[string][]string{}
	if json.Unmarshal(params, &schema) == nil {
		for name, sub := range schema.Properties {
			props[name] = schemaTypes(sub)
		}
	}
	schemaCache.Lock()
	if len(schemaCache.m) >= schemaCacheMax {
		schemaCache.m = map[string]map[string][]string{}
	}
	schemaCache.m[string(params)] = props
	schemaCache.Unlock()
	return props
}

// paramTypes returns the JSON types the schema of tool fn allows for param,
// normalised to null/integer/number/boolean/object/array/string. It reads
// "type" (string or list), "enum" values and anyOf/oneOf/allOf recursively,
// and maps vLLM's aliases (int64→integer, float→number, dict→object, ...).
// An unknown tool or parameter, or a schema saying nothing, gives
// ["string"]: like vLLM, a value we know nothing about is not guessed at.
func paramTypes(tools []ToolSchema, fn, param string) []string {
	for i := range tools {
		if tools[i].Name != fn {
			continue
		}
		if t, ok := propertyTypes(tools[i].Parameters)[param]; ok {
			return t
		}
		break
	}
	return stringOnly
}

// stringOnly is the type list of a value the schema says nothing about
// (len == cap, so an append by a caller copies).
var stringOnly = []string{"string"}

// schemaTypes extracts the type list of one property schema.
func schemaTypes(schema json.RawMessage) []string {
	var seen []string
	collectTypes(schema, &seen, 0)
	if len(seen) == 0 {
		return stringOnly
	}
	// The slice is shared through the schema cache: clip it so that a
	// caller's append copies instead of writing into the cached array.
	return seen[:len(seen):len(seen)]
}

func collectTypes(schema json.RawMessage, out *[]string, depth int) {
	if depth > 32 {
		return
	}
	var s struct {
		Type  json.RawMessage   `json:"type"`
		Enum  []json.RawMessage `json:"enum"`
		AnyOf []json.RawMessage `json:"anyOf"`
		OneOf []json.RawMessage `json:"oneOf"`
		AllOf []json.RawMessage `json:"allOf"`
	}
	if json.Unmarshal(schema, &s) != nil {
		return
	}
	add := func(t string) {
		t = normaliseTypeName(t)
		for _, have := range *out {
			if have == t {
				return
			}
		}
		*out = append(*out, t)
	}
	if len(s.Type) > 0 {
		var one string
		var many []string
		if json.Unmarshal(s.Type, &one) == nil {
			add(one)
		} else if json.Unmarshal(s.Type, &many) == nil {
			for _, t := range many {
				add(t)
			}
		}
	}
	for _, v := range s.Enum {
		add(jsonKind(v))
	}
	for _, group := range [][]json.RawMessage{s.AnyOf, s.OneOf, s.AllOf} {
		for _, sub := range group {
			collectTypes(sub, out, depth+1)
		}
	}
}

// jsonKind names the JSON type of an enum value the way vLLM maps Python
// types: a whole number is an integer, any other number a number.
func jsonKind(v json.RawMessage) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "string"
	}
	switch v[0] {
	case 'n':
		return "null"
	case 't', 'f':
		return "boolean"
	case '"':
		return "string"
	case '[':
		return "array"
	case '{':
		return "object"
	}
	if bytes.ContainsAny(v, ".eE") {
		return "number"
	}
	return "integer"
}

func normaliseTypeName(t string) string {
	t = strings.ToLower(strings.TrimSpace(t))
	switch t {
	case "str", "text", "varchar", "char", "enum", "string":
		return "string"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64",
		"long", "short", "unsigned", "integer":
		return "integer"
	case "float", "float32", "float64", "double", "number":
		return "number"
	case "bool", "boolean":
		return "boolean"
	case "dict", "object":
		return "object"
	case "arr", "list", "sequence", "array":
		return "array"
	case "null":
		return "null"
	}
	if strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint") {
		return "integer"
	}
	return t
}

func hasType(types []string, t string) bool {
	for _, have := range types {
		if have == t {
			return true
		}
	}
	return false
}

// coerceValue turns the raw text of a string-encoded parameter (XML families)
// into a JSON value, trying the allowed types in vLLM's priority order
// null > integer > number > boolean > object > array > string. So a
// ["string","integer"] parameter with "123" becomes 123, while a pure string
// parameter keeps "123" a string. When no allowed type fits (say "abc" for an
// integer) the raw text is kept if it is JSON, otherwise as a string: the
// value is never lost. Surrounding whitespace is ignored for non-string types
// and kept for strings.
func coerceValue(raw string, types []string) json.RawMessage {
	return coerceAppend(nil, raw, types)
}

// coerceAppend is coerceValue appending to dst, so a builder can type a
// value straight into its buffer.
func coerceAppend(dst []byte, raw string, types []string) []byte {
	v := strings.TrimSpace(raw)
	if hasType(types, "null") && strings.EqualFold(v, "null") {
		return append(dst, "null"...)
	}
	if hasType(types, "integer") {
		if n, ok := canonicalInt(v); ok {
			return append(dst, n...)
		}
	}
	if hasType(types, "number") {
		if n, ok := canonicalNumber(v); ok {
			return append(dst, n...)
		}
	}
	if hasType(types, "boolean") {
		switch strings.ToLower(v) {
		case "true", "1":
			return append(dst, "true"...)
		case "false", "0":
			return append(dst, "false"...)
		}
	}
	if hasType(types, "object") && strings.HasPrefix(v, "{") {
		if c, err := compactJSON(v); err == nil {
			return append(dst, c...)
		}
	}
	if hasType(types, "array") && strings.HasPrefix(v, "[") {
		if c, err := compactJSON(v); err == nil {
			return append(dst, c...)
		}
	}
	if hasType(types, "string") {
		return appendJSONString(dst, raw)
	}
	if c, err := compactJSON(v); err == nil && v != "" {
		return append(dst, c...)
	}
	return appendJSONString(dst, raw)
}

// canonicalInt accepts what Python's int() accepts for plain decimals
// (sign, digits, underscores between digits) and returns JSON text.
func canonicalInt(v string) (string, bool) {
	if v == "" {
		return "", false
	}
	if plainDecimal(v) {
		return v, true
	}
	neg := false
	switch v[0] {
	case '+':
		v = v[1:]
	case '-':
		neg = true
		v = v[1:]
	}
	if v == "" || v[0] == '_' || v[len(v)-1] == '_' {
		return "", false
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	lead := true
	prevUnderscore := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '_' {
			if prevUnderscore {
				return "", false
			}
			prevUnderscore = true
			continue
		}
		prevUnderscore = false
		if c < '0' || c > '9' {
			return "", false
		}
		if lead && c == '0' {
			continue
		}
		lead = false
		b.WriteByte(c)
	}
	if lead { // all zeros
		return "0", true
	}
	return b.String(), true
}

// plainDecimal reports a JSON-ready integer: digits, no sign or leading
// zero, the common case that needs no rewriting.
func plainDecimal(v string) bool {
	if v == "" || (v[0] == '0' && len(v) > 1) {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return false
		}
	}
	return true
}

// canonicalNumber parses like Python's float() and renders whole values as
// integers ("5.0" → 5), as vLLM does. NaN and infinities are not JSON.
func canonicalNumber(v string) (string, bool) {
	if v == "" {
		return "", false
	}
	f, err := strconv.ParseFloat(strings.ReplaceAll(v, "_", ""), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return "", false
	}
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return strconv.FormatInt(int64(f), 10), true
	}
	b, err := json.Marshal(f)
	if err != nil {
		return "", false
	}
	return string(b), true
}

// --- JSON output ---

// argsBuilder assembles an arguments object key by key in the order the
// model wrote them. A repeated key keeps its first position and its last
// value, matching what a Python dict assignment does upstream. keys and vals
// are read directly by some families (wrapper detection), so they stay
// plain parallel slices.
type argsBuilder struct {
	keys []string
	vals []json.RawMessage
	// repairs are what was fixed while reading the arguments
	// (ToolCall.Repairs), for families that record them here.
	repairs []string
}

// add sets key to the JSON value v (which must be valid JSON).
func (a *argsBuilder) add(key string, v json.RawMessage) {
	for i, k := range a.keys {
		if k == key {
			a.vals[i] = v
			return
		}
	}
	a.keys = append(a.keys, key)
	a.vals = append(a.vals, v)
}

// addString sets key to the JSON string s.
func (a *argsBuilder) addString(key, s string) {
	a.add(key, appendJSONString(nil, s))
}

// addCoerced sets key to raw typed by coerceValue's rules.
func (a *argsBuilder) addCoerced(key, raw string, types []string) {
	a.add(key, coerceValue(raw, types))
}

// len reports how many keys were added.
func (a *argsBuilder) len() int { return len(a.keys) }

// String renders the compact JSON object ("{}" when empty).
func (a *argsBuilder) String() string {
	n := 2
	for i := range a.keys {
		n += len(a.keys[i]) + len(a.vals[i]) + 4
	}
	buf := make([]byte, 0, n)
	buf = append(buf, '{')
	for i := range a.keys {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendJSONString(buf, a.keys[i])
		buf = append(buf, ':')
		buf = append(buf, a.vals[i]...)
	}
	buf = append(buf, '}')
	return string(buf)
}

// asciiPlain marks the bytes a JSON string holds as they are: printable
// ASCII but '"' and '\\'.
var asciiPlain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// Strings in model output run to kilobytes (files, shell scripts), so the
// plain runs inside them are skipped eight bytes at a time: a word is loaded
// and tested for the bytes that need attention with the usual bit tricks
// (in x-n*ones &^ x, a byte below n sets its high bit; with n = 1 that finds
// a zero byte). A borrow can only flag bytes above a real hit, so the lowest
// flagged byte is always a real one, which is all a skip needs.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// load64 reads the first eight bytes of s as a little-endian word (one load
// once compiled).
func load64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// strSpecial flags, in their high bits, the bytes of x that strPlain
// rejects. x^0x02 maps the control characters and '"' (0x22) to exactly the
// bytes below 0x21, so two tests cover the three cases.
func strSpecial(x uint64) uint64 {
	c, b := x^(0x02*ones), x^('\\'*ones)
	return ((c-0x21*ones)&^c | (b-ones)&^b) & highs
}

// skipStrPlain returns the first index at or after i whose byte is not
// strPlain, or len(s).
func skipStrPlain(s string, i int) int {
	t := s[i:]
	for len(t) >= 8 {
		if m := strSpecial(load64(t)); m != 0 {
			return len(s) - len(t) + bits.TrailingZeros64(m)/8
		}
		t = t[8:]
	}
	for i = len(s) - len(t); i < len(s) && strPlain[s[i]]; i++ {
	}
	return i
}

// skipASCIIPlain is skipStrPlain for asciiPlain: non-ASCII bytes stop it too.
func skipASCIIPlain(s string, i int) int {
	t := s[i:]
	for len(t) >= 8 {
		x := load64(t)
		if m := strSpecial(x) | x&highs; m != 0 {
			return len(s) - len(t) + bits.TrailingZeros64(m)/8
		}
		t = t[8:]
	}
	for i = len(s) - len(t); i < len(s) && asciiPlain[s[i]]; i++ {
	}
	return i
}

// appendJSONString appends s as a JSON string literal. Unlike encoding/json
// it leaves non-ASCII text and <>& alone (ensure_ascii=False in vLLM terms);
// invalid UTF-8 becomes U+FFFD so the output is always valid JSON.
func appendJSONString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		i = skipASCIIPlain(s, i) // runs of ASCII that need no escape
		if i >= len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, "\ufffd"...)
			i++
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// compactJSON validates raw as one JSON value and removes insignificant
// whitespace, keeping key order and string contents byte for byte.
func compactJSON(raw string) (string, error) {
	t := strings.TrimSpace(raw)
	end, out, err := scanCompact(t, 0)
	if err != nil {
		return "", err
	}
	if end != len(t) {
		return "", &jsonError{end, "unexpected text after the value"}
	}
	return validUTF8(out), nil
}

// validUTF8 replaces each run of invalid UTF-8 in compacted JSON with
// U+FFFD. Such bytes can only sit inside strings (the scanner refuses them
// elsewhere), so cleaning before or after compaction gives the same text.
func validUTF8(s string) string {
	if isASCII(s) || utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\ufffd")
}

// isASCII reports whether s is all ASCII, eight bytes at a time: cheaper
// than utf8.ValidString for the common case, whose byte loop handles the
// last few bytes of every string.
func isASCII(s string) bool {
	var acc uint64
	for ; len(s) >= 8; s = s[8:] {
		acc |= load64(s)
	}
	for i := 0; i < len(s); i++ {
		acc |= uint64(s[i])
	}
	return acc&highs == 0
}

// normalizeArgs validates that raw is a JSON object and returns it compact,
// with key order and unicode preserved (no \u escaping added, no HTML
// escaping). The error says why it is not acceptable, for CallError.Reason.
func normalizeArgs(raw string) (string, error) {
	return normalizeTrimmed(strings.TrimSpace(raw))
}

// normalizeTrimmed is normalizeArgs for text already trimmed.
func normalizeTrimmed(t string) (string, error) {
	if t == "" {
		return "", errors.New("arguments are empty")
	}
	end, out, err := scanCompact(t, 0)
	if err != nil {
		if errors.Is(err, errJSONEOF) {
			return "", fmt.Errorf("arguments are truncated JSON (input ends at offset %d before the value is complete)", len(t))
		}
		return "", err
	}
	if end != len(t) {
		return "", &jsonError{end, "unexpected text after the JSON value"}
	}
	if t[0] != '{' {
		return "", fmt.Errorf("arguments are a JSON %s, not an object", jsonKind(json.RawMessage(t)))
	}
	return validUTF8(out), nil
}

// --- text helpers ---

// textPtr returns s trimmed of surrounding whitespace, or nil when nothing
// is left: Result.Content is nil rather than "" for an output without text.
func textPtr(s string) *string {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	return &s
}

// snippetMax bounds CallError.Snippet: enough to recognise the call in a
// log, short enough not to bloat an error message fed back to the model.
const snippetMax = 240

// snippet shortens raw call text for CallError.Snippet, keeping its head
// and tail (where truncation and stray markers show) and valid UTF-8.
func snippet(s string) string {
	if len(s) <= snippetMax {
		return s
	}
	head := s[:snippetMax*2/3]
	tail := s[len(s)-snippetMax/3+8:]
	for len(head) > 0 && !utf8.ValidString(head) {
		head = head[:len(head)-1]
	}
	for len(tail) > 0 && !utf8.ValidString(tail) {
		tail = tail[1:]
	}
	return head + " … " + tail
}
