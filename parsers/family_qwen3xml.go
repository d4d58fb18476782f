package parsers

// Qwen3-Coder-style XML families: qwen3_xml and mimo (vLLM's expat-based
// Qwen3XMLToolParser), step3p5 and seed_oss. Calls look like
//
//	<tool_call>
//	<function=NAME>
//	<parameter=K>
//	V
//	</parameter>
//	</function>
//	</tool_call>
//
// with the wrapper optional (seed_oss spells it <seed:tool_call>). Values are
// typed from the tool schema (§4.1; object/array values may be Python
// literals, §4.3). A missing </parameter> is tolerated as upstream; a
// missing </function> at the end of the output is a truncated call.

import (
	"encoding/json"
	"slices"
	"strings"
)

func init() {
	Register("qwen3_xml", qwenXMLParser{wrapOpen: "<tool_call>", wrapClose: "</tool_call>"})
	Register("mimo", qwenXMLParser{wrapOpen: "<tool_call>", wrapClose: "</tool_call>"})
	Register("step3p5", qwenXMLParser{wrapOpen: "<tool_call>", wrapClose: "</tool_call>"})
	Register("seed_oss", seedOSSParser{})
}

var (
	_ Parser = qwenXMLParser{}
	_ Parser = seedOSSParser{}
)

const (
	qxFunc       = "<function="
	qxFuncEnd    = "</function>"
	qxParam      = "<parameter="
	qxParamClose = "</parameter>"
)

type qwenXMLParser struct{ wrapOpen, wrapClose string }

// Parse returns the calls and, as content, all text outside them.
func (p qwenXMLParser) Parse(text string, tools []ToolSchema) Result {
	if !strings.Contains(text, qxFunc) && !strings.Contains(text, p.wrapOpen) {
		return Result{Content: textPtr(text)}
	}
	ts := qwenXMLScan(text, p.wrapOpen, p.wrapClose, tools)
	return ts.c.result(vlJoin(ts.parts))
}

// qwenXMLScan finds wrapped and bare function blocks in order.
func qwenXMLScan(text, wrapOpen, wrapClose string, tools []ToolSchema) tagScan {
	ts := tagScan{first: -1}
	last, from := 0, 0
	for from < len(text) {
		kw := strings.Index(text[from:], wrapOpen)
		kf := strings.Index(text[from:], qxFunc)
		if kw < 0 && kf < 0 {
			break
		}
		var k, end int
		var isCall bool
		if kw >= 0 && (kf < 0 || kw < kf) {
			k = from + kw
			end, isCall = ts.qxWrapped(text, k, wrapOpen, wrapClose, tools)
		} else {
			k = from + kf
			end, isCall = ts.qxBare(text, k, wrapOpen, wrapClose, tools)
		}
		if !isCall {
			from = end
			continue
		}
		ts.parts = append(ts.parts, text[last:k])
		if ts.first < 0 {
			ts.first = k
		}
		last, from = end, end
	}
	ts.parts = append(ts.parts, text[last:])
	return ts
}

// qxWrapped handles the wrapper marker at k. It returns where to continue
// and whether a call (good or bad) was recorded.
func (ts *tagScan) qxWrapped(text string, k int, wrapOpen, wrapClose string, tools []ToolSchema) (int, bool) {
	j := vlSkipSpaceAny(text, k+len(wrapOpen))
	switch {
	case j >= len(text):
		ts.c.fail("", "truncated: the output ends after the call marker", text[k:])
		return len(text), true
	case strings.HasPrefix(text[j:], wrapClose):
		ts.c.fail("", "empty call", text[k:j+len(wrapClose)])
		return j + len(wrapClose), true
	case strings.HasPrefix(text[j:], wrapOpen):
		ts.c.fail("", "empty call: a call marker directly follows another", text[k:j])
		return j, true
	case !strings.HasPrefix(text[j:], qxFunc):
		return k + len(wrapOpen), false // prose mentioning the marker
	}
	// One or more functions inside one wrapper.
	for {
		end := ts.qxFunction(text, k, j, wrapOpen, wrapClose, tools)
		j = vlSkipSpaceAny(text, end)
		if strings.HasPrefix(text[j:], wrapClose) {
			return j + len(wrapClose), true
		}
		if !strings.HasPrefix(text[j:], qxFunc) {
			return end, true
		}
		k = j
	}
}

// qxBare handles a <function= outside any wrapper. It is a call only when
// it looks like one: a clean name, '>', then a parameter or the end tag.
func (ts *tagScan) qxBare(text string, k int, wrapOpen, wrapClose string, tools []ToolSchema) (int, bool) {
	ns := k + len(qxFunc)
	gt := strings.IndexByte(text[ns:], '>')
	if gt < 0 || !vlValidName(strings.TrimSpace(text[ns:ns+gt])) {
		return ns, false
	}
	j := vlSkipSpaceAny(text, ns+gt+1)
	switch {
	case strings.HasPrefix(text[j:], qxParam), strings.HasPrefix(text[j:], qxFuncEnd),
		j >= len(text), strings.HasPrefix(text[j:], qxFunc), strings.HasPrefix(text[j:], wrapOpen):
		return ts.qxFunction(text, k, k, wrapOpen, wrapClose, tools), true
	}
	return ns, false
}

// qxFunction parses the function block at f (the call's raw text starts at
// k) and records it; it returns the end of the block.
func (ts *tagScan) qxFunction(text string, k, f int, wrapOpen, wrapClose string, tools []ToolSchema) int {
	ns := f + len(qxFunc)
	gt := strings.IndexByte(text[ns:], '>')
	nl := strings.IndexAny(text[ns:], "\n<")
	if gt < 0 || (nl >= 0 && nl < gt) {
		end := qxBlockEnd(text, ns, wrapOpen)
		if gt < 0 && end == len(text) {
			ts.c.fail("", "truncated: the output ends inside the function name", text[k:])
		} else {
			ts.c.fail("", "function name is not closed by '>'", text[k:end])
		}
		return end
	}
	name := strings.TrimSpace(text[ns : ns+gt])
	if !vlValidName(name) {
		end := qxBlockEnd(text, ns, wrapOpen)
		ts.c.fail("", "invalid function name "+snippet(name), text[k:end])
		return end
	}
	ab := newArgs()
	var repairs []string // what was fixed to read the call (ToolCall.Repairs)
	repair := func(r string) {
		if !slices.Contains(repairs, r) {
			repairs = append(repairs, r)
		}
	}
	i := ns + gt + 1
	for {
		i = vlSkipSpaceAny(text, i)
		if strings.HasPrefix(text[i:], qxFuncEnd) {
			end := i + len(qxFuncEnd)
			ts.c.add(name, ab.String(), text[k:end], repairs...)
			return end
		}
		if strings.HasPrefix(text[i:], wrapClose) {
			// The wrapper closes the function implicitly (tolerated upstream).
			repair(RepairCloseMissing)
			ts.c.add(name, ab.String(), text[k:i], repairs...)
			return i
		}
		if !strings.HasPrefix(text[i:], qxParam) {
			// Stray text inside the function: skip to the next tag we know.
			nxt := qxNextTag(text, i, wrapOpen, wrapClose)
			if nxt < 0 {
				ts.c.fail(name, "truncated: the output ends before </function>", text[k:])
				return len(text)
			}
			if !strings.HasPrefix(text[nxt:], qxParam) && !strings.HasPrefix(text[nxt:], qxFuncEnd) && !strings.HasPrefix(text[nxt:], wrapClose) {
				ts.c.fail(name, "function block is not closed by </function>", text[k:nxt])
				return nxt
			}
			i = nxt
			continue
		}
		ps := i + len(qxParam)
		pg := strings.IndexByte(text[ps:], '>')
		pn := strings.IndexAny(text[ps:], "\n<")
		if pg < 0 || (pn >= 0 && pn < pg) {
			if pg < 0 && pn < 0 {
				ts.c.fail(name, "truncated: the output ends inside a parameter name", text[k:])
				return len(text)
			}
			end := qxBlockEnd(text, ps, wrapOpen)
			ts.c.fail(name, "parameter name is not closed by '>'", text[k:end])
			return end
		}
		pname := strings.TrimSpace(text[ps : ps+pg])
		v0 := ps + pg + 1
		// The value ends at </parameter>, or (tolerated) at the next
		// parameter or the function end.
		limit := len(text)
		closeLen := 0
		if cp := strings.Index(text[v0:], qxParamClose); cp >= 0 {
			limit, closeLen = v0+cp, len(qxParamClose)
		}
		vEnd, next := limit, limit+closeLen
		// Only markup ends a value early: a <parameter=NAME> tag, or a
		// </function> followed by the end, a wrapper or another function.
		// Code that merely mentions </function> stays in the value.
		if np := qxFirst(text, v0, limit, qxParam, func(p int) bool { return qxParamTagAt(text, p) }); np >= 0 {
			vEnd, next, limit = np, np, np
		}
		if nf := qxFirst(text, v0, limit, qxFuncEnd, func(p int) bool { return qxFuncEndAt(text, p, wrapOpen, wrapClose) }); nf >= 0 {
			vEnd, next = nf, nf
		}
		if next == vEnd {
			// Ended by the next tag, not by </parameter> (tolerated
			// upstream); at the end of the text it is a truncation below.
			repair(RepairParamCloseMissing)
		}
		if vEnd == len(text) && closeLen == 0 {
			ts.c.fail(name, "truncated: the output ends inside parameter "+pname, text[k:])
			return len(text)
		}
		if pname == "" {
			end := qxBlockEnd(text, v0, wrapOpen)
			ts.c.fail(name, "parameter without a name", text[k:end])
			return end
		}
		v, lit := qxValueLit(tools, name, pname, text[v0:vEnd])
		if lit {
			repair(RepairPyLiteral)
		}
		ab.add(pname, v)
		i = next
	}
}

// qxValue types a value: the schema coercion, plus Python-literal objects
// and arrays ({'a': 1}) that vLLM's XML parsers accept.
func qxValue(tools []ToolSchema, fn, param, raw string) json.RawMessage {
	v, _ := qxValueLit(tools, fn, param, raw)
	return v
}

// qxValueLit is qxValue; lit reports a value read as a Python literal
// (not JSON), which the XML families count as a repair.
func qxValueLit(tools []ToolSchema, fn, param, raw string) (v json.RawMessage, lit bool) {
	v = vlXMLValue(tools, fn, param, raw)
	if len(v) == 0 || v[0] != '"' {
		return v, false
	}
	types := paramTypes(tools, fn, param)
	if !hasType(types, "object") && !hasType(types, "array") {
		return v, false
	}
	t := strings.TrimSpace(raw)
	if t == "" || (t[0] != '{' && t[0] != '[') {
		return v, false
	}
	if out, ok := pyLiteralJSON(t); ok {
		return out, !json.Valid([]byte(t))
	}
	return v, false
}

// pyLiteralJSON converts a whole Python literal to JSON.
func pyLiteralJSON(s string) (json.RawMessage, bool) {
	p := &pyConv{s: s}
	out, err := p.value(nil)
	if err != nil || pySkipSpace(s, p.i) != len(s) {
		return nil, false
	}
	return out, true
}

// qxNextTag finds the next structural tag at or after i.
func qxNextTag(text string, i int, wrapOpen, wrapClose string) int {
	best := -1
	for _, t := range []string{qxParam, qxFuncEnd, qxFunc, wrapOpen, wrapClose} {
		if k := strings.Index(text[i:], t); k >= 0 && (best < 0 || i+k < best) {
			best = i + k
		}
	}
	return best
}

// qxBlockEnd is where a broken function block ends: after its </function>,
// else at the next function or wrapper, else the end of the text.
func qxBlockEnd(text string, i int, wrapOpen string) int {
	fe := strings.Index(text[i:], qxFuncEnd)
	nf := strings.Index(text[i:], qxFunc)
	nw := strings.Index(text[i:], wrapOpen)
	next := -1
	for _, n := range []int{nf, nw} {
		if n >= 0 && (next < 0 || n < next) {
			next = n
		}
	}
	if fe >= 0 && (next < 0 || fe < next) {
		return i + fe + len(qxFuncEnd)
	}
	if next >= 0 {
		return i + next
	}
	return len(text)
}

// --- seed_oss ---

type seedOSSParser struct{}

const (
	seedThink    = "<seed:think>"
	seedThinkEnd = "</seed:think>"
)

// Parse reads <seed:tool_call> blocks (or bare <function= blocks). When the
// output holds a complete <seed:think>…</seed:think>, only the text after it
// is searched, so call examples inside the thinking are not calls; the
// thinking is then part of the content, as upstream.
func (seedOSSParser) Parse(text string, tools []ToolSchema) Result {
	offset := 0
	if t := strings.Index(text, seedThink); t >= 0 {
		e := strings.Index(text[t:], seedThinkEnd)
		if e < 0 {
			return Result{Content: textPtr(text)} // still thinking
		}
		offset = t + e + len(seedThinkEnd)
	}
	body := text[offset:]
	if !strings.Contains(body, qxFunc) && !strings.Contains(body, "<seed:tool_call>") {
		return Result{Content: textPtr(text)}
	}
	ts := qwenXMLScan(body, "<seed:tool_call>", "</seed:tool_call>", tools)
	if ts.first < 0 {
		return ts.c.result(textPtr(text))
	}
	return ts.c.result(textPtr(text[:offset+ts.first]))
}

// qxFirst finds the first occurrence of tag in text[from:limit] that ok
// accepts.
func qxFirst(text string, from, limit int, tag string, ok func(int) bool) int {
	for i := from; i < limit; {
		k := strings.Index(text[i:limit], tag)
		if k < 0 {
			return -1
		}
		if ok(i + k) {
			return i + k
		}
		i += k + len(tag)
	}
	return -1
}

// qxParamTagAt: a <parameter= at p with a clean name closed by '>'.
func qxParamTagAt(text string, p int) bool {
	ns := p + len(qxParam)
	gt := strings.IndexByte(text[ns:], '>')
	return gt >= 0 && vlValidName(strings.TrimSpace(text[ns:ns+gt]))
}

// qxFuncEndAt: a </function> at p followed by the end of the output, a
// wrapper tag or another function.
func qxFuncEndAt(text string, p int, wrapOpen, wrapClose string) bool {
	j := vlSkipSpaceAny(text, p+len(qxFuncEnd))
	return j >= len(text) || strings.HasPrefix(text[j:], wrapClose) || strings.HasPrefix(text[j:], wrapOpen) ||
		strings.HasPrefix(text[j:], qxFunc)
}
