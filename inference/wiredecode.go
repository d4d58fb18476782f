package inference

import (
	"bytes"
	"errors"
	"fmt"

	json "github.com/segmentio/encoding/json"

	"github.com/rollout-rl/rollout/internal/util/jsonscan"
)

// wireDecoder is implemented by the responses a tokens-mode turn decodes
// most (/tokenize, /v1/completions, llama.cpp's /completion): their
// token-id arrays — a whole prompt's worth in every render and in vLLM's
// prompt echo — are parsed straight from the body in one pass. Through the codec each array was
// scanned twice: once, number by number, to find where it ends before the
// codec hands it to TokenIDs, and once by TokenIDs itself; the first scan
// was 8 % of the client's CPU at 4,096 loops (docs/inference.md, "Client
// cost"). Everything else in these responses still goes through the
// codec, one value at a time, so what is accepted and what each field
// holds is what json.Unmarshal gives (wiredecode_test.go checks the two
// against each other on fuzzed bodies).
type wireDecoder interface {
	decodeWire(b []byte) error
}

// decodeResponse decodes a response body into out.
func decodeResponse(b []byte, out any) error {
	if d, ok := out.(wireDecoder); ok {
		return d.decodeWire(b)
	}
	return json.Unmarshal(b, out)
}

var errWire = errors.New("invalid JSON")

// wireDoc decodes document b, one object walked by wireObject with names
// and field, and checks that nothing but white space follows it; a
// document that is null leaves the value as it is (as json.Unmarshal
// does).
func wireDoc(b []byte, names []string, field func(name string, i int) (int, error)) error {
	i := jsonscan.SkipWS(b, 0)
	var err error
	if isNull(b, i) {
		i += 4
	} else if i, err = wireObject(b, i, names, field); err != nil {
		return err
	}
	if i = jsonscan.SkipWS(b, i); i != len(b) {
		return fmt.Errorf("%w: data after the top-level value at offset %d", errWire, i)
	}
	return nil
}

func isNull(b []byte, i int) bool {
	return i+4 <= len(b) && string(b[i:i+4]) == "null"
}

// wireObject walks the object at b[i:], calling field with each key (the
// name of the struct field it matches, exactly or else case-insensitively
// as json.Unmarshal matches them, or "" for none) and the offset of its
// value; field returns the offset just past that value. wireObject
// returns the offset just past the object.
func wireObject(b []byte, i int, names []string, field func(name string, i int) (int, error)) (int, error) {
	if i >= len(b) || b[i] != '{' {
		return 0, fmt.Errorf("%w: want an object at offset %d", errWire, i)
	}
	i = jsonscan.SkipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return 0, fmt.Errorf("%w: want a key at offset %d", errWire, i)
		}
		var name string
		var err error
		end := i + 1
		for end < len(b) && b[end] != '"' && b[end] != '\\' && b[end] >= 0x20 {
			end++
		}
		if end < len(b) && b[end] == '"' {
			// A key with no escapes and no control characters: valid, and
			// its bytes are its name.
			end++
			name = matchName(b[i+1:end-1], names)
		} else {
			if end, err = valueEnd(b, i); err != nil {
				return 0, err
			}
			if name, err = fieldName(b[i:end], names); err != nil {
				return 0, err
			}
		}
		i = jsonscan.SkipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return 0, fmt.Errorf("%w: want ':' at offset %d", errWire, i)
		}
		i = jsonscan.SkipWS(b, i+1)
		if i, err = field(name, i); err != nil {
			return 0, err
		}
		i = jsonscan.SkipWS(b, i)
		if i >= len(b) {
			return 0, fmt.Errorf("%w: unterminated object", errWire)
		}
		switch b[i] {
		case ',':
			i = jsonscan.SkipWS(b, i+1)
		case '}':
			return i + 1, nil
		default:
			return 0, fmt.Errorf("%w: unexpected %q in an object at offset %d", errWire, b[i], i)
		}
	}
}

// wireArray walks the array at b[i:] (or null), calling elem with the
// offset of each element; elem returns the offset just past it. It
// returns the offset just past the array and whether it was null.
func wireArray(b []byte, i int, elem func(i int) (int, error)) (end int, null bool, err error) {
	if isNull(b, i) {
		return i + 4, true, nil
	}
	if i >= len(b) || b[i] != '[' {
		return 0, false, fmt.Errorf("%w: want an array at offset %d", errWire, i)
	}
	i = jsonscan.SkipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, false, nil
	}
	for {
		if i, err = elem(i); err != nil {
			return 0, false, err
		}
		i = jsonscan.SkipWS(b, i)
		if i >= len(b) {
			return 0, false, fmt.Errorf("%w: unterminated array", errWire)
		}
		switch b[i] {
		case ',':
			i = jsonscan.SkipWS(b, i+1)
		case ']':
			return i + 1, false, nil
		default:
			return 0, false, fmt.Errorf("%w: unexpected %q in an array at offset %d", errWire, b[i], i)
		}
	}
}

// fieldName is the name in names the JSON string key matches: exactly,
// or else case-insensitively; "" when none does.
func fieldName(key []byte, names []string) (string, error) {
	raw := key[1 : len(key)-1]
	if bytes.IndexByte(raw, '\\') >= 0 {
		var k string
		if err := json.Unmarshal(key, &k); err != nil {
			return "", err
		}
		raw = []byte(k)
	} else if !json.Valid(key) {
		return "", fmt.Errorf("%w: bad key %s", errWire, snippet(key))
	}
	return matchName(raw, names), nil
}

// matchName is the name in names the unescaped key raw matches: exactly,
// or else case-insensitively; "" when none does.
func matchName(raw []byte, names []string) string {
	for _, n := range names {
		if string(raw) == n {
			return n
		}
	}
	for _, n := range names {
		if bytes.EqualFold(raw, []byte(n)) {
			return n
		}
	}
	return ""
}

// wireValue decodes the value at b[i:] into v with the codec and returns
// the offset just past it; v nil checks the value and drops it.
func wireValue(b []byte, i int, v any) (int, error) {
	if end, ok := valueSpan(b, i); ok {
		// Checked in the same pass that found its end: what valueEnd and
		// json.Valid would say.
		if v == nil {
			return end, nil
		}
		return end, json.Unmarshal(b[i:end], v)
	}
	end, err := valueEnd(b, i)
	if err != nil {
		return 0, err
	}
	if v == nil {
		if !json.Valid(b[i:end]) {
			return 0, fmt.Errorf("%w: bad value %s", errWire, snippet(b[i:end]))
		}
		return end, nil
	}
	return end, json.Unmarshal(b[i:end], v)
}

// valueEnd finds where the JSON value at b[i:] ends by its structure
// alone (jsonscan.ValueEnd). It checks nothing else; the caller's decode of
// b[i:end] does.
func valueEnd(b []byte, i int) (int, error) {
	end, err := jsonscan.ValueEnd(b, i)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errWire, err)
	}
	return end, nil
}

// Field names, in the order the decoders below switch on them.
var (
	tokenizeNames   = []string{"count", "max_model_len", "tokens"}
	completionNames = []string{"id", "choices", "usage"}
	choiceNames     = []string{"index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_token_ids"}
	logprobsNames   = []string{"tokens", "token_logprobs"}
	llamaNames      = []string{"content", "tokens", "stop_type", "stopping_word", "truncated", "tokens_predicted",
		"tokens_evaluated", "completion_probabilities", "generation_settings"}
)

func (r *TokenizeResponse) decodeWire(b []byte) error {
	return wireDoc(b, tokenizeNames, func(name string, i int) (int, error) {
		switch name {
		case "count":
			return wireInt(b, i, &r.Count)
		case "max_model_len":
			return wireInt(b, i, &r.MaxModelLen)
		case "tokens":
			return r.Tokens.scan(b, i)
		}
		return wireValue(b, i, nil)
	})
}

func (r *CompletionResponse) decodeWire(b []byte) error {
	return wireDoc(b, completionNames, func(name string, i int) (int, error) {
		switch name {
		case "id":
			return wireString(b, i, &r.ID)
		case "usage":
			return wireValue(b, i, &r.Usage)
		case "choices":
			r.Choices = r.Choices[:0]
			end, null, err := wireArray(b, i, func(i int) (int, error) {
				r.Choices = append(r.Choices, CompletionChoice{})
				c := &r.Choices[len(r.Choices)-1]
				c.PromptTokenIDs.expect = r.expectEcho
				return c.scan(b, i)
			})
			if null {
				r.Choices = nil
			} else if r.Choices == nil {
				r.Choices = []CompletionChoice{}
			}
			return end, err
		}
		return wireValue(b, i, nil)
	})
}

func (r *LlamaCompletionResponse) decodeWire(b []byte) error {
	return wireDoc(b, llamaNames, func(name string, i int) (int, error) {
		switch name {
		case "content":
			return wireValue(b, i, &r.Content)
		case "tokens":
			return r.Tokens.scan(b, i)
		case "stop_type":
			return wireValue(b, i, &r.StopType)
		case "stopping_word":
			return wireValue(b, i, &r.StoppingWord)
		case "truncated":
			return wireValue(b, i, &r.Truncated)
		case "tokens_predicted":
			return wireValue(b, i, &r.TokensPredicted)
		case "tokens_evaluated":
			return wireValue(b, i, &r.TokensEvaluated)
		case "completion_probabilities":
			return wireValue(b, i, &r.Probs)
		case "generation_settings":
			return wireValue(b, i, &r.GenerationSettings)
		}
		return wireValue(b, i, nil)
	})
}

// scan decodes one choice; null leaves it zero.
func (c *CompletionChoice) scan(b []byte, i int) (int, error) {
	if isNull(b, i) {
		return i + 4, nil
	}
	return wireObject(b, i, choiceNames, func(name string, i int) (int, error) {
		switch name {
		case "index":
			return wireInt(b, i, &c.Index)
		case "text":
			return wireString(b, i, &c.Text)
		case "logprobs":
			if isNull(b, i) {
				c.Logprobs = nil
				return i + 4, nil
			}
			if c.Logprobs == nil {
				c.Logprobs = new(CompletionLogprobs)
			}
			return c.Logprobs.scan(b, i)
		case "finish_reason":
			return wireString(b, i, &c.FinishReason)
		case "stop_reason":
			return wireValue(b, i, &c.StopReason)
		case "token_ids":
			return c.TokenIDs.scan(b, i)
		case "prompt_token_ids":
			return c.PromptTokenIDs.scan(b, i)
		}
		return wireValue(b, i, nil)
	})
}

// scan decodes the parallel arrays of a choice's logprobs.
func (l *CompletionLogprobs) scan(b []byte, i int) (int, error) {
	return wireObject(b, i, logprobsNames, func(name string, i int) (int, error) {
		switch name {
		case "tokens":
			return l.Tokens.scan(b, i)
		case "token_logprobs":
			return l.TokenLogprobs.scan(b, i)
		}
		return wireValue(b, i, nil)
	})
}
