package parsers

import (
	"errors"
	"strings"
)

// llamaJSONParser finds bare {"name", "parameters"|"arguments"} objects,
// optionally after <|python_tag|>, separated by anything ("; " usually).
//
// Content is the text before the first call (vLLM drops all text once a call
// is found; Hermes keeps text before the first "{" even when that brace is
// not a call). A JSON object without both keys is prose, not a call; an
// object that starts like a call ({"name": …) but does not parse is a
// CallError instead of turning the whole output into text.
type llamaJSONParser struct{}

var _ Parser = llamaJSONParser{}

func init() {
	Register("llama3_json", llamaJSONParser{})
	Register("llama4_json", llamaJSONParser{})
}

const pythonTag = "<|python_tag|>"

func (llamaJSONParser) Parse(text string, _ []ToolSchema) Result {
	var c collector
	first := -1
	pos := 0
	tagAt := strings.Index(text, pythonTag)
	for pos < len(text) {
		k := strings.IndexByte(text[pos:], '{')
		if k < 0 {
			break
		}
		j := pos + k
		q := skipSpace(text, j+1)
		// After <|python_tag|> the model is committed to a call, so output
		// that ends inside an object there is a truncated call.
		tagged := tagAt >= 0 && tagAt < j
		if q >= len(text) && tagged {
			if first < 0 {
				first = j
			}
			c.fail("", "call is truncated (output ended after '{')", text[j:])
			break
		}
		if q >= len(text) || text[q] != '"' {
			pos = j + 1
			continue
		}
		end, co, err := scanCallObject(text, j)
		if err != nil {
			cutShort := errors.Is(err, errJSONEOF) && (tagged || strings.HasPrefix(`"name"`, text[q:]))
			if !strings.HasPrefix(text[q:], `"name"`) && !cutShort {
				pos = j + 1
				continue
			}
			if first < 0 {
				first = j
			}
			stop := end
			if stop <= j {
				stop = j + 1
			}
			c.fail(nameHint(text[j:]), describeScanErr(err, "call JSON"), text[j:min(len(text), stop+1)])
			pos = stop
			continue
		}
		if co.hasName && co.hasArgs {
			if first < 0 {
				first = j
			}
			if co.argsErr != nil {
				c.fail(co.name, "arguments: "+co.argsErr.Error(), text[j:end])
			} else if co.name == "" {
				c.fail("", `call object has an empty "name"`, text[j:end])
			} else {
				c.ok(co.name, co.args, text[j:end])
			}
		}
		pos = end
	}
	if first >= 0 {
		if t := strings.Index(text[:first], pythonTag); t >= 0 {
			first = t
		}
	}
	return c.result(text, first)
}
