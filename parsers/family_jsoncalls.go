package parsers

// Families whose calls are JSON objects {"name", "arguments"} behind a
// marker: granite, granite-20b-fc, granite4, internlm, jamba, hunyuan_a13b,
// phi4_mini_json, ernie45, gigachat3, apertus, cohere_command3/4. They share
// the scanners of family_b_common.go; what differs is the marker, whether
// the calls sit in a list, and which text is content.

import "strings"

func init() {
	Register("granite", graniteParser{})
	Register("granite-20b-fc", granite20bParser{})
	Register("granite4", granite4Parser{})
	Register("internlm", internlmParser{})
	Register("jamba", jambaParser{})
	Register("hunyuan_a13b", hunyuanA13BParser{})
	Register("phi4_mini_json", phi4MiniParser{})
	Register("ernie45", ernie45Parser{})
	Register("gigachat3", gigachat3Parser{})
	Register("apertus", apertusParser{})
	Register("cohere_command3", cohereParser{})
	Register("cohere_command4", cohereParser{})
}

var (
	_ Parser = graniteParser{}
	_ Parser = granite20bParser{}
	_ Parser = granite4Parser{}
	_ Parser = internlmParser{}
	_ Parser = jambaParser{}
	_ Parser = hunyuanA13BParser{}
	_ Parser = phi4MiniParser{}
	_ Parser = ernie45Parser{}
	_ Parser = gigachat3Parser{}
	_ Parser = apertusParser{}
	_ Parser = cohereParser{}
)

// --- granite (3.0/3.1) ---

type graniteParser struct{}

// Parse takes the JSON list after <|tool_call|> (or <tool_call>), or an
// output that is itself a list of call objects. Unlike upstream, text
// before the marker is content instead of hiding the calls.
func (graniteParser) Parse(text string, tools []ToolSchema) Result {
	return settle(graniteOnce, text, tools)
}

func graniteOnce(text string, _ []ToolSchema) Result {
	for _, marker := range []string{"<|tool_call|>", "<tool_call>"} {
		if !strings.Contains(text, marker) {
			continue
		}
		ts := listTagCalls(text, marker, "", vlStdKeys, nil)
		if ts.first >= 0 {
			return ts.c.result(vlJoin(ts.parts))
		}
	}
	i := vlSkipWS(text, 0)
	if i < len(text) && text[i] == '[' {
		if j := vlSkipWS(text, i+1); j < len(text) && text[j] == '{' {
			var c vlCollector
			end, _ := c.callList(text, i, vlStdKeys, false)
			return c.result(textPtr(text[end:]))
		}
	}
	return Result{Content: textPtr(text)}
}

// --- granite-20b-fc ---

type granite20bParser struct{}

// Parse reads one JSON object after each <function_call>; content is the
// text before the first call.
func (granite20bParser) Parse(text string, _ []ToolSchema) Result {
	if !strings.Contains(text, "<function_call>") {
		return Result{Content: textPtr(text)}
	}
	ts := jsonTagCalls(text, "<function_call>", "", vlStdKeys, false)
	return ts.c.result(ts.before(text))
}

// --- granite4 ---

type granite4Parser struct{}

// Parse reads <tool_call> {json} </tool_call> blocks. Content is all the
// text outside them (segments joined by a newline). Upstream drops every
// call when one block is malformed or unterminated; here only that block
// is an error.
func (granite4Parser) Parse(text string, _ []ToolSchema) Result {
	if !strings.Contains(text, "<tool_call>") {
		return Result{Content: textPtr(text)}
	}
	ts := jsonTagCalls(text, "<tool_call>", "</tool_call>", vlStdKeys, false)
	return ts.c.result(vlJoin(ts.parts))
}

// --- internlm ---

type internlmParser struct{}

const internlmStart = "<|action_start|><|plugin|>"

// Parse reads <|action_start|><|plugin|>{json}<|action_end|>; content is the
// text before the first call. Several calls are accepted (upstream takes one
// and raises on bad JSON).
func (internlmParser) Parse(text string, _ []ToolSchema) Result {
	if !strings.Contains(text, internlmStart) {
		return Result{Content: textPtr(text)}
	}
	ts := jsonTagCalls(text, internlmStart, "<|action_end|>", vlStdKeys, false)
	return ts.c.result(ts.before(text))
}

// --- jamba ---

type jambaParser struct{}

// Parse reads <tool_calls>[…]</tool_calls> blocks; content is the text
// before the first.
func (jambaParser) Parse(text string, _ []ToolSchema) Result {
	if !strings.Contains(text, "<tool_calls>") {
		return Result{Content: textPtr(text)}
	}
	ts := listTagCalls(text, "<tool_calls>", "</tool_calls>", vlStdKeys, nil)
	return ts.c.result(ts.before(text))
}

// --- hunyuan_a13b ---

type hunyuanA13BParser struct{}

const hunyuanAssistant = "助手："

// Parse reads <tool_calls>[…]</tool_calls> blocks that are not inside
// <think>…</think>; content is the text before the first, text after is
// dropped (as upstream). Without calls a leading "助手：" role prefix is
// removed (upstream removes it anywhere, which could fuse the text around
// it into a marker).
func (hunyuanA13BParser) Parse(text string, _ []ToolSchema) Result {
	if !strings.Contains(text, "<tool_calls>") {
		return Result{Content: textPtr(strings.TrimPrefix(strings.TrimSpace(text), hunyuanAssistant))}
	}
	spans := thinkSpans(text, "<think>", "</think>")
	ts := listTagCalls(text, "<tool_calls>", "</tool_calls>", vlStdKeys, func(k int) bool { return inSpans(spans, k) })
	if ts.first < 0 {
		return Result{Content: textPtr(strings.TrimPrefix(strings.TrimSpace(text), hunyuanAssistant))}
	}
	return ts.c.result(ts.before(text))
}

// --- phi4_mini_json ---

type phi4MiniParser struct{}

// Parse reads functools[…] with a real JSON scan, so arrays inside the
// arguments no longer end the list early. Content is the text around the
// list (upstream always returns null content).
func (phi4MiniParser) Parse(text string, _ []ToolSchema) Result {
	const open = "functools"
	if !strings.Contains(text, open+"[") {
		return Result{Content: textPtr(text)}
	}
	ts := listTagCalls(text, open, "", vlStdKeys, nil)
	return ts.c.result(vlJoin(ts.parts))
}

// --- ernie45 ---

type ernie45Parser struct{}

// Parse reads <tool_call>{json}</tool_call> blocks; content is the text
// before the first (a </think> there stays, as upstream).
func (ernie45Parser) Parse(text string, _ []ToolSchema) Result {
	if !strings.Contains(text, "<tool_call>") {
		return Result{Content: textPtr(text)}
	}
	ts := jsonTagCalls(text, "<tool_call>", "</tool_call>", vlStdKeys, false)
	return ts.c.result(ts.before(text))
}

// --- gigachat3 ---

type gigachat3Parser struct{}

var gigachatHeaders = []string{"<|message_sep|>\n\nfunction call<|role_sep|>\n", "<|function_call|>"}

// Parse reads the single call after the function-call header (GigaChat 3 or
// 3.1 spelling). JSON strings may hold raw newlines, as with upstream's
// json.loads(strict=False); a trailing </s> is ignored.
func (gigachat3Parser) Parse(text string, _ []ToolSchema) Result {
	k, hdr := -1, ""
	for _, h := range gigachatHeaders {
		if i := strings.Index(text, h); i >= 0 && (k < 0 || i < k) {
			k, hdr = i, h
		}
	}
	if k < 0 {
		return Result{Content: textPtr(text)}
	}
	var c vlCollector
	body := strings.TrimSuffix(strings.TrimRight(text[k+len(hdr):], " \t\r\n"), "</s>")
	j := vlSkipWS(body, 0)
	switch {
	case j >= len(body):
		c.fail("", "truncated: the output ends after the function call header", text[k:])
	case body[j] != '{':
		c.fail("", "function call header is not followed by a JSON object", text[k:])
	default:
		// The format holds one call; anything after it (a second call
		// object, prose) is reported rather than dropped silently
		// (upstream's json.loads rejects the whole message).
		if end, st := c.takeJSONCall(body, j, vlStdKeys, true); st == vlOK {
			if e := vlSkipWS(body, end); e < len(body) {
				c.fail(vlPeekName(body[e:]), "text after the call: gigachat3 allows one call per message", body[e:])
			}
		}
	}
	return c.result(textPtr(text[:k]))
}

// --- apertus ---

type apertusParser struct{}

var apertusKeys = vlCallKeys{single: true}

// Parse reads <|tools_prefix|>[{"name": {args}}, …]<|tools_suffix|>; the
// suffix is optional. Content is the text around the block. Upstream
// completes truncated JSON and returns the partial call; here a truncated
// call is an error, since its arguments are not what the model meant.
func (apertusParser) Parse(text string, _ []ToolSchema) Result {
	if !strings.Contains(text, "<|tools_prefix|>") {
		return Result{Content: textPtr(text)}
	}
	ts := listTagCalls(text, "<|tools_prefix|>", "<|tools_suffix|>", apertusKeys, nil)
	return ts.c.result(vlJoin(ts.parts))
}

// --- cohere_command3 / cohere_command4 ---

type cohereParser struct{}

var cohereKeys = vlCallKeys{name: []string{"tool_name", "name"}, args: []string{"parameters", "arguments"}}

// Parse reads <|START_ACTION|>[{"tool_call_id","tool_name","parameters"}]
// <|END_ACTION|> (the Command A format). Content is the
// <|START_RESPONSE|>…<|END_RESPONSE|> text when present, else the text
// outside actions; thinking blocks are never content.
func (cohereParser) Parse(text string, _ []ToolSchema) Result {
	vis := text
	if strings.Contains(vis, "<|START_THINKING|>") {
		var b strings.Builder
		last := 0
		for _, sp := range thinkSpans(vis, "<|START_THINKING|>", "<|END_THINKING|>") {
			b.WriteString(vis[last:sp[0]])
			last = sp[1]
		}
		b.WriteString(vis[last:])
		vis = b.String()
	}
	var ts tagScan
	ts.first = -1
	if strings.Contains(vis, "<|START_ACTION|>") {
		ts = listTagCalls(vis, "<|START_ACTION|>", "<|END_ACTION|>", cohereKeys, nil)
	} else {
		ts.parts = []string{vis}
	}
	outside := strings.Join(ts.parts, "\n")
	if k := strings.Index(outside, "<|START_RESPONSE|>"); k >= 0 {
		resp := outside[k+len("<|START_RESPONSE|>"):]
		if e := strings.Index(resp, "<|END_RESPONSE|>"); e >= 0 {
			resp = resp[:e]
		}
		return ts.c.result(textPtr(resp))
	}
	return ts.c.result(vlJoin(ts.parts))
}
