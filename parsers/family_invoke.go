package parsers

// Families whose calls are XML elements with attributes:
//
//	deepseek_v32  <｜DSML｜function_calls><｜DSML｜invoke name="F"><｜DSML｜parameter name="P" string="true">V</｜DSML｜parameter>…
//	deepseek_v4   the same inside <｜DSML｜tool_calls>
//	minimax_m2    <minimax:tool_call><invoke name="F"><parameter name="P">V</parameter></invoke></minimax:tool_call>
//	step3         <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="F"><steptml:parameter name="P">V</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>
//	minicpm5      <function name="F"><param name="P">V</param></function>
//
// One element scanner serves all five; the families differ in the block
// around the invocations, value typing and which text is content.

import (
	"encoding/json"
	"strings"
	"sync"
)

func init() {
	Register("deepseek_v32", dsmlParser{block: "function_calls"})
	Register("deepseek_v4", dsmlParser{block: "tool_calls"})
	Register("minimax_m2", minimaxM2Parser{})
	Register("step3", step3Parser{})
	Register("minicpm5", minicpm5Parser{})
}

var (
	_ Parser = dsmlParser{}
	_ Parser = minimaxM2Parser{}
	_ Parser = step3Parser{}
	_ Parser = minicpm5Parser{}
)

// invSpec names the tags of one invoke dialect.
type invSpec struct {
	invOpen, invClose     string // "<invoke", "</invoke>"
	paramOpen, paramClose string // "<parameter", "</parameter>"
	collapsed             bool   // accept "<invokename=" (minicpm5 tokenizer artefact)
	cdata                 bool   // values may be <![CDATA[…]]>
	// value types one parameter; attrs holds the parameter tag attributes.
	value func(tools []ToolSchema, fn, param, raw string, attrs []invAttr) json.RawMessage
}

type invAttr struct{ key, val string }

func attrVal(attrs []invAttr, key string) (string, bool) {
	for _, a := range attrs {
		if a.key == key {
			return a.val, true
		}
	}
	return "", false
}

// tagAt reports whether an element with the given open prefix starts at i:
// the prefix followed by whitespace, '>' or (collapsed) "name=".
func (sp *invSpec) tagAt(text string, i int, open string) bool {
	if !strings.HasPrefix(text[i:], open) {
		return false
	}
	j := i + len(open)
	if j >= len(text) {
		return true
	}
	switch text[j] {
	case ' ', '\t', '\n', '\r', '>':
		return true
	}
	return sp.collapsed && strings.HasPrefix(text[j:], "name=")
}

// closeAt reports whether the call end tag at p is markup rather than value
// text: followed by the end, a closing tag or the next call.
func (sp *invSpec) closeAt(t string, p int) bool {
	j := vlSkipSpaceAny(t, p+len(sp.invClose))
	return j >= len(t) || strings.HasPrefix(t[j:], "</") || sp.tagAt(t, j, sp.invOpen)
}

// parseAttrs reads attributes from i up to '>'. It returns the index after
// '>', or -1 when the tag is truncated, -2 when it is malformed.
func parseAttrs(text string, i int) ([]invAttr, int) {
	var attrs []invAttr
	for {
		i = vlSkipSpaceAny(text, i)
		if i >= len(text) {
			return attrs, -1
		}
		if text[i] == '>' {
			return attrs, i + 1
		}
		if text[i] == '/' && i+1 < len(text) && text[i+1] == '>' {
			return attrs, -2
		}
		ks := i
		for i < len(text) && text[i] != '=' && text[i] != '>' && !vlSpace(text[i]) && text[i] != '<' {
			i++
		}
		if i >= len(text) {
			return attrs, -1
		}
		key := text[ks:i]
		i = vlSkipSpaceAny(text, i)
		if i >= len(text) {
			return attrs, -1
		}
		if text[i] != '=' || key == "" {
			return attrs, -2
		}
		i = vlSkipSpaceAny(text, i+1)
		if i >= len(text) {
			return attrs, -1
		}
		q := text[i]
		if q != '"' && q != '\'' {
			// Unquoted value: up to whitespace or '>'.
			vs := i
			for i < len(text) && !vlSpace(text[i]) && text[i] != '>' && text[i] != '<' {
				i++
			}
			attrs = append(attrs, invAttr{key, text[vs:i]})
			continue
		}
		e := strings.IndexByte(text[i+1:], q)
		if e < 0 {
			return attrs, -1
		}
		val := text[i+1 : i+1+e]
		if strings.ContainsAny(val, "<>\n") {
			return attrs, -2
		}
		attrs = append(attrs, invAttr{key, val})
		i += e + 2
	}
}

// invoke parses the element at k (which starts with sp.invOpen) and records
// the call; stop bounds the search (the end of the enclosing block). It
// returns where the element ends.
func (ts *tagScan) invoke(text string, k, stop int, sp *invSpec, tools []ToolSchema, post func(fn string, ab *argsBuilder, raw string) string) int {
	c := &invCall{ts: ts, sp: sp, text: text, t: text[:stop], k: k, stop: stop}
	i, done := c.head()
	if done {
		return i
	}
	t := c.t
	ab := newArgs()
	for {
		i = vlSkipSpaceAny(t, i)
		if strings.HasPrefix(t[i:], sp.invClose) {
			return c.finish(&ab, i+len(sp.invClose), post)
		}
		if i >= len(t) {
			// The end tag is missing. When the enclosing block closed, or
			// the output ends right after a complete parameter (a stop
			// sequence may have eaten the tag), the call is complete; a
			// bare opening tag at the very end is a truncation.
			if stop == len(text) && ab.len() == 0 {
				return c.fail("truncated: the output ends before "+sp.invClose, stop)
			}
			return c.finish(&ab, stop, post)
		}
		if !sp.tagAt(t, i, sp.paramOpen) {
			if i, done = c.skipStray(i); done {
				return i
			}
			continue
		}
		if i, done = c.param(i, tools, &ab); done {
			return i
		}
	}
}

// invCall is one call element being parsed. Every failure reports the
// element's text from k, so its steps share these bounds and the name.
type invCall struct {
	ts   *tagScan
	sp   *invSpec
	text string // the whole output
	t    string // text[:stop]: the search never leaves the enclosing block
	k    int    // where the element starts
	stop int
	name string
}

// fail records the call as failed with the element's text up to end, and
// returns end so that a step can hand it straight back as "done".
func (c *invCall) fail(reason string, end int) int {
	c.ts.c.fail(c.name, reason, c.text[c.k:end])
	return end
}

// finish records the call that ends at end, unless post rejects it.
func (c *invCall) finish(ab *argsBuilder, end int, post func(fn string, ab *argsBuilder, raw string) string) int {
	raw := c.text[c.k:end]
	if post != nil {
		if reason := post(c.name, ab, raw); reason != "" {
			return c.fail(reason, end)
		}
	}
	c.ts.c.add(c.name, ab.String(), raw, ab.repairs...)
	return end
}

// head parses the opening tag and its name. It returns where the body
// starts, or, when done, where the failed element ends.
func (c *invCall) head() (int, bool) {
	attrs, i := parseAttrs(c.t, c.k+len(c.sp.invOpen))
	if i == -1 {
		return c.fail("truncated: the output ends inside the call tag", c.stop), true
	}
	name, _ := attrVal(attrs, "name")
	c.name = strings.TrimSpace(name)
	if i == -2 || !vlValidName(c.name) {
		reason := "call tag has no valid name attribute"
		if i == -2 {
			reason = "malformed call tag"
		}
		return c.fail(reason, invBlockEnd(c.t, c.k+1, c.sp)), true
	}
	return i, false
}

// skipStray steps over text at i that is not a parameter tag, to the next
// parameter or the end tag. A new call or the end of the output first
// means this call was never closed: then it is done.
func (c *invCall) skipStray(i int) (int, bool) {
	t, sp := c.t, c.sp
	p := strings.Index(t[i:], sp.paramOpen)
	cl := strings.Index(t[i:], sp.invClose)
	n := strings.Index(t[i:], sp.invOpen)
	next := -1
	for _, x := range []int{p, cl} {
		if x >= 0 && (next < 0 || x < next) {
			next = x
		}
	}
	if next < 0 {
		if n >= 0 {
			return c.fail("call is not closed by "+sp.invClose, i+n), true
		}
		return c.fail("truncated: the output ends before "+sp.invClose, c.stop), true
	}
	if n >= 0 && n < next {
		return c.fail("call is not closed by "+sp.invClose, i+n), true
	}
	if next == 0 {
		// "<parameterX": not our tag, step over it.
		next = len(sp.paramOpen)
	}
	return i + next, false
}

// param parses the parameter element at i into ab and returns where it
// ends, or, when done, where the failed call ends.
func (c *invCall) param(i int, tools []ToolSchema, ab *argsBuilder) (int, bool) {
	t, sp := c.t, c.sp
	pattrs, v0 := parseAttrs(t, i+len(sp.paramOpen))
	if v0 == -1 {
		return c.fail("truncated: the output ends inside a parameter tag", c.stop), true
	}
	pname, ok := attrVal(pattrs, "name")
	if v0 == -2 || !ok || strings.TrimSpace(pname) == "" {
		return c.fail("parameter without a name", invBlockEnd(t, i, sp)), true
	}
	pname = strings.TrimSpace(pname)
	// Value: CDATA, then up to the parameter close tag.
	vs, ve := v0, -1
	search := v0
	if sp.cdata {
		if w := vlSkipSpaceAny(t, v0); strings.HasPrefix(t[w:], "<![CDATA[") {
			if e := strings.Index(t[w+9:], "]]>"); e >= 0 {
				vs, ve = w+9, w+9+e
				search = ve + 3
			}
		}
	}
	pc := strings.Index(t[search:], sp.paramClose)
	if pc < 0 {
		return c.fail("truncated: the output ends inside parameter "+pname, c.stop), true
	}
	// A parameter that runs into the next one or the end tag lost its
	// close tag: the call is malformed, not silently merged.
	if x := qxFirst(t, search, search+pc, sp.invClose, func(p int) bool { return sp.closeAt(t, p) }); x >= 0 {
		return c.fail("parameter "+pname+" is not closed by "+sp.paramClose, x+len(sp.invClose)), true
	}
	if ve < 0 {
		ve = search + pc
	}
	for _, seen := range ab.keys {
		if seen == pname {
			return c.fail("parameter "+pname+" given twice", invBlockEnd(t, i, sp)), true
		}
	}
	ab.add(pname, sp.value(tools, c.name, pname, t[vs:ve], pattrs))
	return search + pc + len(sp.paramClose), false
}

// invBlockEnd is where a broken element ends: after its close tag, else at
// the next element, else at the end.
func invBlockEnd(t string, i int, sp *invSpec) int {
	c := strings.Index(t[i:], sp.invClose)
	n := strings.Index(t[i:], sp.invOpen)
	if c >= 0 && (n < 0 || c < n) {
		return i + c + len(sp.invClose)
	}
	if n >= 0 {
		return i + n
	}
	return len(t)
}

// invokeList parses the invocations of a block body t[i:stop].
func (ts *tagScan) invokeList(text string, i, stop int, sp *invSpec, tools []ToolSchema, post func(string, *argsBuilder, string) string) {
	for {
		k := strings.Index(text[i:stop], sp.invOpen)
		if k < 0 {
			return
		}
		k += i
		if !sp.tagAt(text[:stop], k, sp.invOpen) {
			i = k + len(sp.invOpen)
			continue
		}
		i = ts.invoke(text, k, stop, sp, tools, post)
	}
}

// unwrapArgs repairs a call whose only parameter is a wrapper (arguments,
// input, properties) not in the schema, holding an object whose keys are
// all schema parameters.
func unwrapArgs(tools []ToolSchema, fn string, ab *argsBuilder, wrappers ...string) {
	if ab.len() != 1 {
		return
	}
	key := ab.keys[0]
	isWrapper := false
	for _, w := range wrappers {
		if key == w {
			isWrapper = true
		}
	}
	if !isWrapper || vlDeclared(tools, fn, key) {
		return
	}
	raw := string(ab.vals[0])
	if raw[0] == '"' {
		s, ok := vlUnquote(raw)
		if !ok {
			return
		}
		raw = strings.TrimSpace(s)
	}
	if raw == "" || raw[0] != '{' {
		return
	}
	var inner argsBuilder
	_, st := vlEachField(raw, 0, false, func(k, v string) { inner.add(k, json.RawMessage(v)) })
	if st != vlOK || inner.len() == 0 {
		return
	}
	for _, k := range inner.keys {
		if !vlDeclared(tools, fn, k) {
			return
		}
	}
	inner.repairs = append(ab.repairs, RepairUnwrapped)
	*ab = inner
}

// --- deepseek_v32 / deepseek_v4 (DSML) ---

const dsmlBar = "｜DSML｜"

var dsmlSpec = invSpec{
	invOpen: "<" + dsmlBar + "invoke", invClose: "</" + dsmlBar + "invoke>",
	paramOpen: "<" + dsmlBar + "parameter", paramClose: "</" + dsmlBar + "parameter>",
	value: dsmlValue,
}

// dsmlValue: string="true" keeps the literal text even against the schema;
// otherwise the schema types it (§4.1). Without schema information a
// string="false" value that is valid JSON is taken as JSON, since the model
// declared it non-string.
func dsmlValue(tools []ToolSchema, fn, param, raw string, attrs []invAttr) json.RawMessage {
	if s, _ := attrVal(attrs, "string"); s == "true" {
		return json.RawMessage(appendJSONString(nil, raw))
	}
	if !vlDeclared(tools, fn, param) {
		t := strings.TrimSpace(raw)
		if _, hasStr := attrVal(attrs, "string"); hasStr && t != "" {
			if c, err := compactJSON(t); err == nil {
				return json.RawMessage(c)
			}
		}
		return json.RawMessage(appendJSONString(nil, raw))
	}
	return qxValue(tools, fn, param, raw)
}

type dsmlParser struct{ block string }

// Parse reads the DSML block(s); content is the text before the first.
// deepseek_v4 accepts only the tool_calls wrapper, v3.2 only function_calls.
func (p dsmlParser) Parse(text string, tools []ToolSchema) Result {
	open := "<" + dsmlBar + p.block + ">"
	closeTag := "</" + dsmlBar + p.block + ">"
	if !strings.Contains(text, open) {
		return Result{Content: textPtr(text)}
	}
	ts := tagScan{first: -1}
	from := 0
	post := func(fn string, ab *argsBuilder, _ string) string {
		unwrapArgs(tools, fn, ab, "arguments", "input")
		return ""
	}
	for {
		k := strings.Index(text[from:], open)
		if k < 0 {
			break
		}
		k += from
		if ts.first < 0 {
			ts.first = k
		}
		body := k + len(open)
		stop, next := len(text), len(text)
		if e := strings.Index(text[body:], closeTag); e >= 0 {
			stop, next = body+e, body+e+len(closeTag)
		}
		n0 := ts.c.next()
		ts.invokeList(text, body, stop, &dsmlSpec, tools, post)
		if ts.c.next() == n0 {
			if stop == len(text) {
				ts.c.fail("", "truncated: the output ends inside the tool call block", text[k:])
			} else {
				ts.c.fail("", "tool call block holds no invoke", text[k:next])
			}
		}
		from = next
	}
	return ts.c.result(ts.before(text))
}

// --- minimax_m2 ---

var minimaxM2Spec = invSpec{
	invOpen: "<invoke", invClose: "</invoke>",
	paramOpen: "<parameter", paramClose: "</parameter>",
	value: strippedValue,
}

// strippedValue strips the value, then types it with the schema (§4.1):
// "none" and "nil" stay strings, "null" is null only where allowed.
func strippedValue(tools []ToolSchema, fn, param, raw string, _ []invAttr) json.RawMessage {
	return qxValue(tools, fn, param, strings.TrimSpace(raw))
}

type minimaxM2Parser struct{}

const (
	mm2Open  = "<minimax:tool_call>"
	mm2Close = "</minimax:tool_call>"
)

// Parse reads <minimax:tool_call> blocks; content is the text before the
// first. An unclosed block keeps its complete invokes.
func (minimaxM2Parser) Parse(text string, tools []ToolSchema) Result {
	if !strings.Contains(text, mm2Open) {
		return Result{Content: textPtr(text)}
	}
	ts := blockInvokes(text, mm2Open, mm2Close, &minimaxM2Spec, tools, nil)
	return ts.c.result(ts.before(text))
}

// blockInvokes reads every open…close block (close optional at the end)
// and the invokes inside; parts get the text outside the blocks.
func blockInvokes(text, open, closeTag string, sp *invSpec, tools []ToolSchema, post func(string, *argsBuilder, string) string) tagScan {
	ts := tagScan{first: -1}
	last, from := 0, 0
	for {
		k := strings.Index(text[from:], open)
		if k < 0 {
			break
		}
		k += from
		ts.parts = append(ts.parts, text[last:k])
		if ts.first < 0 {
			ts.first = k
		}
		body := k + len(open)
		stop, next := len(text), len(text)
		if e := strings.Index(text[body:], closeTag); e >= 0 {
			stop, next = body+e, body+e+len(closeTag)
		}
		if n := strings.Index(text[body:stop], open); n >= 0 {
			stop, next = body+n, body+n // a new block starts before this one closed
		}
		n0 := ts.c.next()
		ts.invokeList(text, body, stop, sp, tools, post)
		if ts.c.next() == n0 {
			if stop == len(text) {
				ts.c.fail("", "truncated: the output ends inside the tool call block", text[k:])
			} else {
				ts.c.fail("", "tool call block holds no call", text[k:next])
			}
		}
		last, from = next, next
	}
	ts.parts = append(ts.parts, text[last:])
	return ts
}

// --- step3 ---

const (
	step3Begin     = "<｜tool_calls_begin｜>"
	step3End       = "<｜tool_calls_end｜>"
	step3CallBegin = "<｜tool_call_begin｜>"
	step3CallEnd   = "<｜tool_call_end｜>"
	step3Sep       = "<｜tool_sep｜>"
)

var step3Spec = invSpec{
	invOpen: "<steptml:invoke", invClose: "</steptml:invoke>",
	paramOpen: "<steptml:parameter", paramClose: "</steptml:parameter>",
	value: strippedValue,
}

type step3Parser struct{}

// Parse reads the <｜tool_calls_begin｜> block; content is the text before and
// after it. The `function<｜tool_sep｜>` prefix of a call is optional (vLLM's
// own test fixtures omit it); a call whose declared type is not "function"
// is an error. A missing block end keeps the complete calls.
func (step3Parser) Parse(text string, tools []ToolSchema) Result {
	return settle(step3Once, text, tools)
}

func step3Once(text string, tools []ToolSchema) Result {
	k := strings.Index(text, step3Begin)
	if k < 0 {
		return Result{Content: textPtr(text)}
	}
	ts := tagScan{first: k}
	body := k + len(step3Begin)
	stop, after := len(text), len(text)
	if e := strings.Index(text[body:], step3End); e >= 0 {
		stop, after = body+e, body+e+len(step3End)
	}
	i := body
	for {
		c := strings.Index(text[i:stop], step3CallBegin)
		inv := strings.Index(text[i:stop], step3Spec.invOpen)
		if c < 0 && inv < 0 {
			break
		}
		if c >= 0 && (inv < 0 || c < inv) {
			cs := i + c
			cb := cs + len(step3CallBegin)
			ce := stop
			if e := strings.Index(text[cb:stop], step3CallEnd); e >= 0 {
				ce = cb + e
			}
			if s := strings.Index(text[cb:ce], step3Sep); s >= 0 {
				if typ := strings.TrimSpace(text[cb : cb+s]); typ != "function" {
					ts.c.fail("", "call type "+snippet(typ)+" is not function", text[cs:min(ce+len(step3CallEnd), stop)])
					i = min(ce+len(step3CallEnd), stop)
					continue
				}
			}
			n0 := ts.c.next()
			ts.invokeList(text, cb, ce, &step3Spec, tools, nil)
			if ts.c.next() == n0 {
				if ce == len(text) {
					ts.c.fail("", "truncated: the output ends inside the call", text[cs:])
				} else {
					ts.c.fail("", "call holds no invoke", text[cs:ce])
				}
			}
			i = min(ce+len(step3CallEnd), stop)
			continue
		}
		// Bare invoke without the call wrapper.
		i = ts.invoke(text, i+inv, stop, &step3Spec, tools, nil)
	}
	if ts.c.next() == 0 {
		ts.c.fail("", "tool call block holds no call", text[k:after])
	}
	return ts.c.result(vlJoin([]string{text[:k], text[after:]}))
}

// --- minicpm5 ---

var minicpmSpec = invSpec{
	invOpen: "<function", invClose: "</function>",
	paramOpen: "<param", paramClose: "</param>",
	collapsed: true, cdata: true,
	value: func(tools []ToolSchema, fn, param, raw string, _ []invAttr) json.RawMessage {
		return qxValue(tools, fn, param, raw)
	},
}

type minicpm5Parser struct{}

// minicpmArtefacts undoes byte-level BPE markers that leak into the text.
var minicpmArtefacts = strings.NewReplacer("Ġ", " ", "Ċ", "\n")

// Parse reads <function name="F"><param name="K">V</param></function>
// elements anywhere in the text; content is the text outside them (upstream
// returns null content whenever a tool is called). With tools given, a
// parameter whose name differs from a schema property only by case, or a
// missing required parameter, makes the call an error.
func (minicpm5Parser) Parse(text string, tools []ToolSchema) Result {
	if !strings.Contains(text, "<function") {
		return Result{Content: textPtr(text)}
	}
	artefacts := strings.Contains(text, "Ġ") || strings.Contains(text, "Ċ")
	if artefacts {
		// The calls' Raw is then of the cleaned text, not the output's.
		text = minicpmArtefacts.Replace(text)
	}
	post := func(fn string, ab *argsBuilder, _ string) string {
		if artefacts {
			ab.repairs = append(ab.repairs, RepairArtefacts)
		}
		unwrapArgs(tools, fn, ab, "properties", "arguments")
		return minicpmValidate(tools, fn, ab)
	}
	ts := tagScan{first: -1}
	last, from := 0, 0
	for {
		k := strings.Index(text[from:], "<function")
		if k < 0 {
			break
		}
		k += from
		if !minicpmSpec.tagAt(text, k, minicpmSpec.invOpen) || !minicpmLooksLikeCall(text, k) {
			from = k + len("<function")
			continue
		}
		ts.parts = append(ts.parts, text[last:k])
		if ts.first < 0 {
			ts.first = k
		}
		end := ts.invoke(text, k, len(text), &minicpmSpec, tools, post)
		last, from = end, end
	}
	ts.parts = append(ts.parts, text[last:])
	return ts.c.result(vlJoin(ts.parts))
}

// minicpmLooksLikeCall: a complete opening tag with a name, followed by a
// parameter, the end tag or the end of the output. Prose quoting
// `<function name="x">` followed by words is not a call.
func minicpmLooksLikeCall(text string, k int) bool {
	attrs, i := parseAttrs(text, k+len("<function"))
	if i == -1 { // the output ends inside the tag: truncated if it began like one
		rest := strings.TrimSpace(text[k+len("<function"):])
		_, ok := attrVal(attrs, "name")
		return ok || rest == "" || strings.HasPrefix(rest, "name")
	}
	if i < 0 {
		return false
	}
	if _, ok := attrVal(attrs, "name"); !ok {
		return false
	}
	j := vlSkipSpaceAny(text, i)
	return j >= len(text) || minicpmSpec.tagAt(text, j, "<param") || strings.HasPrefix(text[j:], "</function>") ||
		strings.HasPrefix(text[j:], "<function")
}

// minicpmSchema is the part of a tool schema minicpm5 validates against.
type minicpmSchema struct {
	props    map[string]bool
	required []string
}

var minicpmCache sync.Map // raw parameters → minicpmSchema

func minicpmSchemaOf(tools []ToolSchema, fn string) (minicpmSchema, bool) {
	for i := range tools {
		if tools[i].Name != fn {
			continue
		}
		key := string(tools[i].Parameters)
		if v, ok := minicpmCache.Load(key); ok {
			return v.(minicpmSchema), true
		}
		var s struct {
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
		}
		_ = json.Unmarshal(tools[i].Parameters, &s)
		out := minicpmSchema{props: map[string]bool{}, required: s.Required}
		for p := range s.Properties {
			out.props[p] = true
		}
		minicpmCache.Store(key, out)
		return out, true
	}
	return minicpmSchema{}, false
}

func minicpmValidate(tools []ToolSchema, fn string, ab *argsBuilder) string {
	sc, ok := minicpmSchemaOf(tools, fn)
	if !ok {
		return ""
	}
	for _, k := range ab.keys {
		if sc.props[k] {
			continue
		}
		for p := range sc.props {
			if strings.EqualFold(p, k) {
				return "parameter " + k + " differs from the schema's " + p + " only by case"
			}
		}
	}
	for _, r := range sc.required {
		found := false
		for _, k := range ab.keys {
			if k == r {
				found = true
				break
			}
		}
		if !found {
			return "required parameter " + r + " is missing"
		}
	}
	return ""
}
