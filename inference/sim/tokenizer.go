package sim

import (
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// specialToken is one marker the tokenizer keeps whole. Control tokens are
// removed from text when a request asks for skip_special_tokens; added
// tokens (think and tool-call markers) always stay, as in Qwen's tokenizer
// where <think> and <tool_call> are added but not "special".
type specialToken struct {
	text    string
	control bool
}

// vocabSpecials is the fixed list of marker tokens. The order defines the ids
// (256 + index) and must never change: golden files and client tests depend
// on it. New markers go at the end.
var vocabSpecials = []specialToken{
	{"<|endoftext|>", true},
	{"<|im_start|>", true},
	{"<|im_end|>", true},
	{"<think>", false},
	{"</think>", false},
	{"<tool_call>", false},
	{"</tool_call>", false},
	{"<tool_response>", false},
	{"</tool_response>", false},
	{"<|begin_of_text|>", true},
	{"<|end_of_text|>", true},
	{"<|start_header_id|>", true},
	{"<|end_header_id|>", true},
	{"<|eot_id|>", true},
	{"<|eom_id|>", true},
	{"<|python_tag|>", true},
	{"<s>", true},
	{"</s>", true},
	{"[INST]", true},
	{"[/INST]", true},
	{"[TOOL_CALLS]", true},
	{"[AVAILABLE_TOOLS]", true},
	{"[/AVAILABLE_TOOLS]", true},
	{"[TOOL_RESULTS]", true},
	{"[/TOOL_RESULTS]", true},
	{"[SYSTEM_PROMPT]", true},
	{"[/SYSTEM_PROMPT]", true},
	{"<｜begin▁of▁sentence｜>", true},
	{"<｜end▁of▁sentence｜>", true},
	{"<｜User｜>", true},
	{"<｜Assistant｜>", true},
	{"<｜tool▁calls▁begin｜>", true},
	{"<｜tool▁calls▁end｜>", true},
	{"<｜tool▁call▁begin｜>", true},
	{"<｜tool▁call▁end｜>", true},
	{"<｜tool▁sep｜>", true},
	{"<｜tool▁outputs▁begin｜>", true},
	{"<｜tool▁outputs▁end｜>", true},
	{"<｜tool▁output▁begin｜>", true},
	{"<｜tool▁output▁end｜>", true},
	{"<|tool_calls_section_begin|>", true},
	{"<|tool_calls_section_end|>", true},
	{"<|tool_call_begin|>", true},
	{"<|tool_call_argument_begin|>", true},
	{"<|tool_call_end|>", true},
	{"<arg_key>", false},
	{"</arg_key>", false},
	{"<arg_value>", false},
	{"</arg_value>", false},
}

// Tokenizer is the simulator's deterministic byte-level tokenizer: ids 0-255
// are raw bytes and ids from 256 on are the marker tokens of vocabSpecials.
// Encoding is unambiguous and Decode(Encode(s)) == s for every string, so
// the only drift a client can see comes from the chat templates, as with a
// real model.
type Tokenizer struct {
	byText  map[string]int
	first   [256][]int // marker ids by first byte, longest text first
	control []bool     // indexed by id-256
}

// NewTokenizer builds the tokenizer. It is cheap and immutable; one per
// server is shared by all requests.
func NewTokenizer() *Tokenizer {
	t := &Tokenizer{byText: make(map[string]int, len(vocabSpecials))}
	for i, sp := range vocabSpecials {
		id := 256 + i
		t.byText[sp.text] = id
		b := sp.text[0]
		t.first[b] = append(t.first[b], id)
		t.control = append(t.control, sp.control)
	}
	for b := range t.first {
		ids := t.first[b]
		sort.SliceStable(ids, func(i, j int) bool {
			return len(vocabSpecials[ids[i]-256].text) > len(vocabSpecials[ids[j]-256].text)
		})
	}
	return t
}

// VocabSize is the number of ids; valid ids are [0, VocabSize).
func (t *Tokenizer) VocabSize() int { return 256 + len(vocabSpecials) }

// ID returns the id of a marker token.
func (t *Tokenizer) ID(marker string) (int, bool) {
	id, ok := t.byText[marker]
	return id, ok
}

// mustID is for markers the simulator itself defines; a miss is a
// programming error caught by the template tests.
func (t *Tokenizer) mustID(marker string) int {
	id, ok := t.byText[marker]
	if !ok {
		panic("sim: marker not in vocabulary: " + marker)
	}
	return id
}

// Encode maps text to ids, matching the longest marker at each position and
// falling back to single bytes.
func (t *Tokenizer) Encode(text string) []int {
	out := make([]int, 0, len(text))
	for i := 0; i < len(text); {
		matched := false
		for _, id := range t.first[text[i]] {
			m := vocabSpecials[id-256].text
			if strings.HasPrefix(text[i:], m) {
				out = append(out, id)
				i += len(m)
				matched = true
				break
			}
		}
		if !matched {
			out = append(out, int(text[i]))
			i++
		}
	}
	return out
}

// Decode maps ids back to text. skipControl drops control markers (the
// skip_special_tokens behaviour). An id outside the vocabulary is an error.
func (t *Tokenizer) Decode(ids []int, skipControl bool) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		if err := t.check(id); err != nil {
			return "", err
		}
		if id < 256 {
			b.WriteByte(byte(id))
			continue
		}
		if skipControl && t.control[id-256] {
			continue
		}
		b.WriteString(vocabSpecials[id-256].text)
	}
	return b.String(), nil
}

func (t *Tokenizer) check(id int) error {
	if id < 0 || id >= t.VocabSize() {
		return fmt.Errorf("token id %d is out of vocabulary (size %d)", id, t.VocabSize())
	}
	return nil
}

// IsControl reports whether id is a control marker.
func (t *Tokenizer) IsControl(id int) bool {
	return id >= 256 && id < t.VocabSize() && t.control[id-256]
}

// Bytes returns the raw bytes of one token.
func (t *Tokenizer) Bytes(id int) []byte {
	if id < 256 {
		return []byte{byte(id)}
	}
	return []byte(vocabSpecials[id-256].text)
}

// TokenString is the token's display string, as convert_ids_to_tokens and
// logprob entries show it. A byte that is not valid UTF-8 on its own is shown
// as "bytes:\xNN", which is how vLLM renders partial characters.
func (t *Tokenizer) TokenString(id int) string {
	if id >= 256 {
		return vocabSpecials[id-256].text
	}
	b := []byte{byte(id)}
	if utf8.Valid(b) {
		return string(b)
	}
	return fmt.Sprintf("bytes:\\x%02x", id)
}
