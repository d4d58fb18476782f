package parsers

// Gemma families: functiongemma and gemma4 write calls as
// call:NAME{key:value,…} between markers, with unquoted keys and strings
// delimited by a special token (<escape> for functiongemma, <|"|> for
// gemma4). One scanner reads both: nested objects and arrays, bare
// true/false/null (gemma4 also none/nil) and numbers; other bare text is a
// string.

import (
	"encoding/json"
	"strings"
)

func init() {
	Register("functiongemma", gemmaParser{open: "<start_function_call>", close: "<end_function_call>", quote: "<escape>", fg: true})
	Register("gemma4", gemmaParser{open: "<|tool_call>", close: "<tool_call|>", quote: `<|"|>`})
}

var _ Parser = gemmaParser{}

type gemmaParser struct {
	open, close, quote string
	fg                 bool // functiongemma value rules
}

type gemmaConv struct {
	s, q  string
	i     int
	depth int
	fg    bool
}

type gemmaErr struct {
	msg   string
	trunc bool
}

func (e *gemmaErr) Error() string { return e.msg }

var errGemmaTrunc = &gemmaErr{msg: "truncated: the output ends inside the arguments", trunc: true}

// value appends the JSON form of the value at g.i. isStr reports a
// delimited string (schema coercion applies to those).
func (g *gemmaConv) value(dst []byte) (out []byte, isStr bool, raw string, err error) {
	g.i = vlSkipSpaceAny(g.s, g.i)
	if g.i >= len(g.s) {
		return nil, false, "", errGemmaTrunc
	}
	switch {
	case strings.HasPrefix(g.s[g.i:], g.q):
		vs := g.i + len(g.q)
		e := strings.Index(g.s[vs:], g.q)
		if e < 0 {
			return nil, false, "", errGemmaTrunc
		}
		g.i = vs + e + len(g.q)
		return appendJSONString(dst, g.s[vs:vs+e]), true, g.s[vs : vs+e], nil
	case g.s[g.i] == '{':
		out, err = g.object(dst)
		return out, false, "", err
	case g.s[g.i] == '[':
		out, err = g.array(dst)
		return out, false, "", err
	}
	// Bare value up to a separator.
	vs := g.i
	for g.i < len(g.s) && g.s[g.i] != ',' && g.s[g.i] != '}' && g.s[g.i] != ']' && !strings.HasPrefix(g.s[g.i:], g.q) {
		g.i++
	}
	if g.i >= len(g.s) {
		return nil, false, "", errGemmaTrunc
	}
	tok := strings.TrimSpace(g.s[vs:g.i])
	switch strings.ToLower(tok) {
	case "true", "false":
		return append(dst, strings.ToLower(tok)...), false, tok, nil
	case "null":
		return append(dst, "null"...), false, tok, nil
	case "none", "nil":
		if !g.fg {
			return append(dst, "null"...), false, tok, nil
		}
	case "":
		return nil, false, "", &gemmaErr{msg: "missing value"}
	}
	if tok[0] == '-' || vlDigit(tok[0]) {
		if e, st := vlSkipNumber(tok, 0); st == vlOK && e == len(tok) {
			return append(dst, tok...), false, tok, nil
		}
	}
	return appendJSONString(dst, tok), true, tok, nil
}

func (g *gemmaConv) object(dst []byte) ([]byte, error) {
	if g.depth++; g.depth > 500 {
		return nil, &gemmaErr{msg: "nested too deeply"}
	}
	defer func() { g.depth-- }()
	g.i++
	dst = append(dst, '{')
	n := 0
	for {
		g.i = vlSkipSpaceAny(g.s, g.i)
		if g.i >= len(g.s) {
			return nil, errGemmaTrunc
		}
		if g.s[g.i] == '}' {
			g.i++
			return append(dst, '}'), nil
		}
		key, err := g.key()
		if err != nil {
			return nil, err
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, key)
		dst = append(dst, ':')
		if dst, _, _, err = g.value(dst); err != nil {
			return nil, err
		}
		n++
		if err := g.sep('}'); err != nil {
			return nil, err
		}
	}
}

// key reads an unquoted (or delimited, or "quoted") key and its colon.
func (g *gemmaConv) key() (string, error) {
	var key string
	switch {
	case strings.HasPrefix(g.s[g.i:], g.q):
		vs := g.i + len(g.q)
		e := strings.Index(g.s[vs:], g.q)
		if e < 0 {
			return "", errGemmaTrunc
		}
		key, g.i = g.s[vs:vs+e], vs+e+len(g.q)
	case g.s[g.i] == '"':
		e, st := vlSkipString(g.s, g.i, false)
		if st == vlTrunc {
			return "", errGemmaTrunc
		}
		k, ok := vlUnquote(g.s[g.i:e])
		if st != vlOK || !ok {
			return "", &gemmaErr{msg: "malformed quoted key"}
		}
		key, g.i = k, e
	default:
		ks := g.i
		for g.i < len(g.s) && g.s[g.i] != ':' && g.s[g.i] != ',' && g.s[g.i] != '}' && g.s[g.i] != '{' {
			g.i++
		}
		key = strings.TrimSpace(g.s[ks:g.i])
	}
	g.i = vlSkipSpaceAny(g.s, g.i)
	if g.i >= len(g.s) {
		return "", errGemmaTrunc
	}
	if g.s[g.i] != ':' || key == "" {
		return "", &gemmaErr{msg: "expected key:value, found " + snippet(g.s[g.i:min(len(g.s), g.i+16)])}
	}
	g.i++
	return key, nil
}

func (g *gemmaConv) sep(closeB byte) error {
	g.i = vlSkipSpaceAny(g.s, g.i)
	if g.i >= len(g.s) {
		return errGemmaTrunc
	}
	switch g.s[g.i] {
	case ',':
		g.i++
		return nil
	case closeB:
		return nil
	}
	return &gemmaErr{msg: "unexpected " + snippet(g.s[g.i:min(len(g.s), g.i+16)]) + " between values"}
}

func (g *gemmaConv) array(dst []byte) ([]byte, error) {
	if g.depth++; g.depth > 500 {
		return nil, &gemmaErr{msg: "nested too deeply"}
	}
	defer func() { g.depth-- }()
	g.i++
	dst = append(dst, '[')
	n := 0
	for {
		g.i = vlSkipSpaceAny(g.s, g.i)
		if g.i >= len(g.s) {
			return nil, errGemmaTrunc
		}
		if g.s[g.i] == ']' {
			g.i++
			return append(dst, ']'), nil
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, _, _, err = g.value(dst); err != nil {
			return nil, err
		}
		n++
		if err := g.sep(']'); err != nil {
			return nil, err
		}
	}
}

// args reads the top-level argument object at g.i == '{', typing
// delimited strings with the schema where it declares a non-string type.
func (g *gemmaConv) args(tools []ToolSchema, fn string) (string, error) {
	g.i++
	ab := newArgs()
	for {
		g.i = vlSkipSpaceAny(g.s, g.i)
		if g.i >= len(g.s) {
			return "", errGemmaTrunc
		}
		if g.s[g.i] == '}' {
			g.i++
			return ab.String(), nil
		}
		key, err := g.key()
		if err != nil {
			return "", err
		}
		v, isStr, raw, err := g.value(nil)
		if err != nil {
			return "", err
		}
		if isStr {
			switch {
			case vlDeclared(tools, fn, key):
				if types := paramTypes(tools, fn, key); !hasType(types, "string") {
					v = coerceValue(raw, types)
				}
			case g.fg:
				// functiongemma upstream json.loads every value.
				if t := strings.TrimSpace(raw); t != "" {
					if c, err := compactJSON(t); err == nil {
						v = json.RawMessage(c)
					}
				}
			}
		}
		ab.add(key, v)
		if err := g.sep('}'); err != nil {
			return "", err
		}
	}
}

// Parse reads every open…close call; content is the text before the first.
// A call whose end marker is missing is accepted when its argument object
// is complete; an incomplete one is a truncation error (upstream: gemma4
// drops all calls, functiongemma parses the fragment).
func (p gemmaParser) Parse(text string, tools []ToolSchema) Result {
	if !strings.Contains(text, p.open) {
		return Result{Content: textPtr(text)}
	}
	ts := tagScan{first: -1}
	from := 0
	for {
		k := strings.Index(text[from:], p.open)
		if k < 0 {
			break
		}
		k += from
		j := vlSkipSpaceAny(text, k+len(p.open))
		if j < len(text) && !strings.HasPrefix(text[j:], "call:") && !strings.HasPrefix(text[j:], p.close) &&
			!strings.HasPrefix(text[j:], p.open) && !strings.HasPrefix("call:", text[j:]) {
			from = k + len(p.open) // prose mentioning the marker
			continue
		}
		if ts.first < 0 {
			ts.first = k
		}
		from = p.call(&ts, text, k, j, tools)
	}
	return ts.c.result(ts.before(text))
}

// call parses the call whose marker is at k (body at j); returns its end.
func (p gemmaParser) call(ts *tagScan, text string, k, j int, tools []ToolSchema) int {
	// blockEnd: after the next close marker, else at the next open, else end.
	blockEnd := func(from int) int {
		c := strings.Index(text[from:], p.close)
		o := strings.Index(text[from:], p.open)
		if c >= 0 && (o < 0 || c < o) {
			return from + c + len(p.close)
		}
		if o >= 0 {
			return from + o
		}
		return len(text)
	}
	if !strings.HasPrefix(text[j:], "call:") {
		if j >= len(text) || strings.HasPrefix("call:", text[j:]) {
			ts.c.fail("", "truncated: the output ends after the call marker", text[k:])
			return len(text)
		}
		end := blockEnd(j)
		ts.c.fail("", "empty call", text[k:end])
		return end
	}
	ns := j + len("call:")
	ne := ns
	for ne < len(text) && (vlNameByte(text[ne]) && text[ne] != ':' && text[ne] != '/') {
		ne++
	}
	name := text[ns:ne]
	if ne >= len(text) {
		ts.c.fail(name, "truncated: the output ends inside the call", text[k:])
		return len(text)
	}
	if name == "" || text[ne] != '{' {
		end := blockEnd(ne)
		ts.c.fail(name, "call name must be followed by {arguments}", text[k:end])
		return end
	}
	g := &gemmaConv{s: text, q: p.quote, i: ne, fg: p.fg}
	args, err := g.args(tools, name)
	if err != nil {
		if ge, ok := err.(*gemmaErr); ok && ge.trunc {
			ts.c.fail(name, ge.msg, text[k:])
			return len(text)
		}
		end := blockEnd(ne)
		ts.c.fail(name, "arguments: "+err.Error(), text[k:end])
		return end
	}
	end := vlSkipSpaceAny(text, g.i)
	switch {
	case strings.HasPrefix(text[end:], p.close):
		end += len(p.close)
	case end >= len(text), strings.HasPrefix(text[end:], p.open):
		// End marker eaten by a stop sequence, or calls back to back.
	default:
		be := blockEnd(end)
		ts.c.fail(name, "unexpected text after the arguments", text[k:be])
		return be
	}
	ts.c.add(name, args, text[k:end])
	return end
}
