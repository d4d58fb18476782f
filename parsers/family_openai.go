package parsers

// openai: gpt-oss Harmony messages, read from text. vLLM parses Harmony
// from token ids and refuses text; here the rendered special tokens are
// parsed directly, e.g.
//
//	<|channel|>commentary<|message|>We'll call get_weather.<|end|>
//	<|start|>assistant to=functions.get_weather<|channel|>commentary<|constrain|>json<|message|>{"location": "Paris"}<|call|>
//
// A message whose header names a recipient (to=functions.NAME, or a bare
// name) is a call; the final channel is content, else commentary without a
// recipient (the preamble); analysis is reasoning and never content.

import "strings"

func init() { Register("openai", harmonyToolParser{}) }

var _ Parser = harmonyToolParser{}

type harmonyToolParser struct{}

const (
	hmMessage   = "<|message|>"
	hmChannel   = "<|channel|>"
	hmConstrain = "<|constrain|>"
	hmStart     = "<|start|>"
)

// hmTerminators end a message body. <|channel|>, <|message|> and
// <|constrain|> cannot occur in a body either: they start a new header.
var hmTerminators = []string{"<|end|>", "<|call|>", "<|return|>", hmStart, hmChannel, hmMessage, hmConstrain}

type hmHeader struct {
	recipient, channel, ctype string
}

// parseHeader reads role, channel, recipient and content type.
func parseHeader(h string) hmHeader {
	var out hmHeader
	if k := strings.Index(h, hmChannel); k >= 0 {
		out.channel = hmWord(h[k+len(hmChannel):])
	}
	if k := strings.Index(h, hmConstrain); k >= 0 {
		out.ctype = hmWord(h[k+len(hmConstrain):])
	} else if strings.Contains(h, " json") {
		out.ctype = "json"
	}
	for k := 0; k < len(h); {
		i := strings.Index(h[k:], "to=")
		if i < 0 {
			break
		}
		i += k
		if i == 0 || h[i-1] == ' ' || h[i-1] == '>' || h[i-1] == '\n' || h[i-1] == '\t' {
			out.recipient = hmWord(h[i+3:])
			break
		}
		k = i + 3
	}
	return out
}

// hmWord returns the leading token up to whitespace or a special token.
func hmWord(s string) string {
	s = strings.TrimLeft(s, " \t\n")
	e := 0
	for e < len(s) && s[e] != ' ' && s[e] != '\t' && s[e] != '\n' && !strings.HasPrefix(s[e:], "<|") {
		e++
	}
	return s[:e]
}

// Parse walks the messages in order.
func (harmonyToolParser) Parse(text string, _ []ToolSchema) Result {
	if !strings.Contains(text, hmMessage) {
		return Result{Content: textPtr(text)}
	}
	var c vlCollector
	var finals, preamble []string
	pos := 0
	for pos < len(text) {
		m := strings.Index(text[pos:], hmMessage)
		if m < 0 {
			// A trailing header without a message: a call cut before its
			// body is a truncation; anything else carries no content.
			if h := parseHeader(text[pos:]); hmIsCall(h.recipient) {
				c.fail(hmName(h.recipient), "truncated: the output ends before the call's message", text[pos:])
			}
			break
		}
		m += pos
		hdr := parseHeader(text[pos:m])
		bs := m + len(hmMessage)
		be, next, term := len(text), len(text), ""
		for i := bs; i < len(text); {
			k := strings.Index(text[i:], "<|")
			if k < 0 {
				break
			}
			i += k
			found := false
			for _, t := range hmTerminators {
				if strings.HasPrefix(text[i:], t) {
					be, term, found = i, t, true
					break
				}
			}
			if found {
				break
			}
			i += 2
		}
		switch term {
		case "<|end|>", "<|call|>", "<|return|>":
			next = be + len(term)
		case "":
		default:
			next = be // the next header starts here
		}
		body := text[bs:be]
		switch {
		case hmIsCall(hdr.recipient):
			hmCall(&c, hdr, body, text[pos:next], term == "")
		case hdr.channel == "final":
			finals = append(finals, body)
		case hdr.channel == "commentary" || hdr.channel == "":
			preamble = append(preamble, body)
		}
		pos = next
	}
	content := vlJoin(finals)
	if content == nil {
		content = vlJoin(preamble)
	}
	return c.result(content)
}

// hmIsCall: a recipient other than the conversation roles.
func hmIsCall(r string) bool {
	return r != "" && r != "assistant" && r != "user" && r != "system" && r != "developer"
}

func hmName(r string) string { return strings.TrimPrefix(r, "functions.") }

// hmCall records a call message. Arguments must be a JSON object (vLLM
// passes non-JSON text through); a message cut off by the end of the
// output is accepted only when its JSON is complete, as <|call|> is a stop
// token that servers usually strip.
func hmCall(c *vlCollector, h hmHeader, body, raw string, atEOF bool) {
	name := hmName(h.recipient)
	if !vlValidName(name) {
		c.fail(name, "invalid recipient "+snippet(h.recipient), raw)
		return
	}
	t := strings.TrimSpace(body)
	if t == "" {
		if atEOF {
			c.fail(name, "truncated: the output ends before the arguments", raw)
			return
		}
		c.add(name, "{}", raw)
		return
	}
	if atEOF {
		if _, st := vlSkipJSON(t, 0, false); st == vlTrunc {
			c.fail(name, "truncated: the output ends inside the arguments", raw)
			return
		}
	}
	args, err := normalizeArgs(t)
	if err != nil {
		c.fail(name, err.Error(), raw)
		return
	}
	c.add(name, args, raw)
}
