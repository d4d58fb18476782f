package parsers

// minimax (MiniMax-M1, Text-01): <tool_calls> holding one JSON call object
// per line, closed by </tool_calls> or by the end of the output.

import "strings"

func init() { Register("minimax", minimaxParser{}) }

var _ Parser = minimaxParser{}

type minimaxParser struct{}

const (
	mmOpen  = "<tool_calls>"
	mmClose = "</tool_calls>"
)

// Parse reads the call objects of every <tool_calls> block outside
// <think>…</think>; content is the text before the first block. Objects may
// span lines (upstream needs one per line); a malformed object is an error
// and the scan resumes at the next object.
func (minimaxParser) Parse(text string, _ []ToolSchema) Result {
	if !strings.Contains(text, mmOpen) {
		return Result{Content: textPtr(text)}
	}
	spans := thinkSpans(text, "<think>", "</think>")
	ts := tagScan{first: -1}
	from := 0
	for {
		k := strings.Index(text[from:], mmOpen)
		if k < 0 {
			break
		}
		k += from
		body := k + len(mmOpen)
		j := vlSkipWS(text, body)
		if inSpans(spans, k) || (j < len(text) && text[j] != '{' && !strings.HasPrefix(text[j:], mmClose)) {
			from = body
			continue
		}
		if ts.first < 0 {
			ts.first = k
		}
		// Objects are read in sequence on the whole text, so a string that
		// mentions </tool_calls> does not end the block.
		n0 := ts.c.next()
		i, next, closed := j, len(text), false
	scan:
		for {
			i = vlSkipWS(text, i)
			switch {
			case i >= len(text):
				break scan
			case strings.HasPrefix(text[i:], mmClose):
				next, closed = i+len(mmClose), true
				break scan
			case text[i] == ',':
				i++
				continue
			}
			start := i
			if text[i] == '{' {
				end, st := ts.c.takeJSONCall(text, i, vlStdKeys, false)
				if st == vlTrunc {
					break scan
				}
				if st == vlOK {
					i = end
					continue
				}
			}
			// A line that does not start an object is noise (as upstream).
			// Resynchronise at the next line holding an object, unless the
			// block closes first.
			nxt := nextLineObject(text, start+1)
			cl := strings.Index(text[start:], mmClose)
			if cl >= 0 && (nxt < 0 || start+cl < nxt) {
				next, closed = start+cl+len(mmClose), true
				break scan
			}
			if nxt < 0 {
				break scan
			}
			i = nxt
		}
		if ts.c.next() == n0 {
			if !closed {
				ts.c.fail("", "truncated: the output ends after <tool_calls>", text[k:])
			} else {
				ts.c.fail("", "empty <tool_calls> block", text[k:next])
			}
		}
		from = next
	}
	if ts.first < 0 {
		return Result{Content: textPtr(text)}
	}
	return ts.c.result(ts.before(text))
}

// nextLineObject finds the next line that starts with '{' (after blanks):
// the format puts one call per line, so that is where the next call is.
func nextLineObject(s string, i int) int {
	for {
		nl := strings.IndexByte(s[i:], '\n')
		if nl < 0 {
			return -1
		}
		i += nl + 1
		j := i
		for j < len(s) && (s[j] == ' ' || s[j] == '\t' || s[j] == '\r') {
			j++
		}
		if j < len(s) && s[j] == '{' {
			return j
		}
	}
}
