package render

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// Tokenizer is a byte-level BPE tokenizer (GPT-2 style byte-to-unicode
// mapping), with added/special tokens. It is safe for concurrent use.
type Tokenizer struct {
	vocab        map[string]int32 // byte-level token text → id
	size         int
	ranks        map[string]int32 // "left right" → merge rank
	ignoreMerges bool
	pre          *preTokenizer
	normalize    func(string) string // nil: none
	added        []addedToken        // longest first
	byFirst      [256][]addedToken   // added, by first byte (longest first)
	leftmost     bool                // added tokens: leftmost-longest (Hugging Face) rather than llama.cpp's longest-first
	cache        *wordCache
}

// addedToken is a token matched in the text before pre-tokenisation.
type addedToken struct {
	text string
	id   int32
}

// tokenizerSpec is what a model file provides to build a Tokenizer.
type tokenizerSpec struct {
	vocab        map[string]int32
	size         int
	merges       []string // "left right", in rank order
	ignoreMerges bool
	pre          *preTokenizer
	normalize    func(string) string
	added        []addedToken
	leftmost     bool
}

// newTokenizer checks spec and builds the Tokenizer.
func newTokenizer(spec tokenizerSpec) (*Tokenizer, error) {
	if len(spec.vocab) == 0 {
		return nil, errors.New("empty vocabulary")
	}
	if spec.pre == nil {
		return nil, errors.New("no pre-tokenizer")
	}
	ranks := make(map[string]int32, len(spec.merges))
	for i, m := range spec.merges {
		if sp := strings.IndexByte(m, ' '); sp <= 0 || sp == len(m)-1 {
			return nil, fmt.Errorf("merge %d %q is not two space-separated parts", i, m)
		}
		if _, dup := ranks[m]; !dup {
			ranks[m] = int32(i)
		}
	}
	added := make([]addedToken, 0, len(spec.added))
	for _, a := range spec.added {
		if a.text != "" {
			added = append(added, a)
		}
	}
	sort.SliceStable(added, func(i, j int) bool { return len(added[i].text) > len(added[j].text) })
	t := &Tokenizer{
		vocab: spec.vocab, size: spec.size, ranks: ranks, ignoreMerges: spec.ignoreMerges,
		pre: spec.pre, normalize: spec.normalize, added: added, leftmost: spec.leftmost,
		cache: &wordCache{},
	}
	for _, a := range added {
		t.byFirst[a.text[0]] = append(t.byFirst[a.text[0]], a)
	}
	return t, nil
}

// VocabSize is the number of token ids (the largest id plus one).
func (t *Tokenizer) VocabSize() int { return t.size }

// Encode tokenises text. With parseSpecial, every added token (special or
// not, e.g. "<|im_start|>", "<think>", "<tool_call>") found in text is
// emitted as its single id; without it they are ordinary text. No BOS/EOS
// is added.
//
// Added tokens are found as the engine that reads the model file finds
// them: for a GGUF, llama.cpp's order (the longest token first, each of
// its occurrences left to right, then the next longest in what remains);
// for a Hugging Face tokenizer.json, leftmost-longest. The two differ only
// when added tokens overlap one another in the text.
//
// Without parseSpecial this differs from llama.cpp's parse_special=false,
// which still matches user-defined tokens (GGUF token type 4, such as
// "<think>" in Qwen3): here every added token is then plain text.
//
// Invalid UTF-8 bytes are tokenised as U+FFFD, as llama.cpp does.
func (t *Tokenizer) Encode(text string, parseSpecial bool) ([]int32, error) {
	if t == nil || t.vocab == nil {
		return nil, errors.New("render: Encode on a nil Tokenizer")
	}
	frags := []fragment{{text: text, id: -1}}
	if parseSpecial && len(t.added) > 0 {
		if t.leftmost {
			frags = t.splitLeftmost(text)
		} else {
			frags = t.splitLongestFirst(text)
		}
	}
	ids := make([]int32, 0, len(text)/3+1)
	for _, f := range frags {
		if f.id >= 0 {
			ids = append(ids, f.id)
			continue
		}
		ids = t.encodeText(ids, f.text)
	}
	return ids, nil
}

// fragment is a run of raw text (id -1) or an added token.
type fragment struct {
	text string
	id   int32
}

// splitLongestFirst cuts text at added tokens as llama.cpp's
// tokenizer_st_partition does.
func (t *Tokenizer) splitLongestFirst(text string) []fragment {
	frags := []fragment{{text: text, id: -1}}
	for _, a := range t.added {
		var out []fragment
		for fi, f := range frags {
			if f.id >= 0 || !strings.Contains(f.text, a.text) {
				if out != nil {
					out = append(out, f)
				}
				continue
			}
			if out == nil {
				out = append(make([]fragment, 0, len(frags)+4), frags[:fi]...)
			}
			out = appendSplit(out, f.text, a)
		}
		if out != nil {
			frags = out
		}
	}
	return frags
}

// appendSplit appends s cut at every occurrence of a.
func appendSplit(out []fragment, s string, a addedToken) []fragment {
	for {
		i := strings.Index(s, a.text)
		if i < 0 {
			break
		}
		if i > 0 {
			out = append(out, fragment{text: s[:i], id: -1})
		}
		out = append(out, a.asFragment())
		s = s[i+len(a.text):]
	}
	if s != "" {
		out = append(out, fragment{text: s, id: -1})
	}
	return out
}

func (a addedToken) asFragment() fragment { return fragment{text: a.text, id: a.id} }

// splitLeftmost cuts text at added tokens leftmost-longest, as Hugging
// Face tokenizers does.
func (t *Tokenizer) splitLeftmost(text string) []fragment {
	var frags []fragment
	last := 0
	for i := 0; i < len(text); {
		a, ok := t.addedAt(text[i:])
		if !ok {
			i++
			continue
		}
		if i > last {
			frags = append(frags, fragment{text: text[last:i], id: -1})
		}
		frags = append(frags, a.asFragment())
		i += len(a.text)
		last = i
	}
	if last < len(text) {
		frags = append(frags, fragment{text: text[last:], id: -1})
	}
	return frags
}

// addedAt returns the longest added token s starts with.
func (t *Tokenizer) addedAt(s string) (addedToken, bool) {
	for _, a := range t.byFirst[s[0]] { // longest first
		if strings.HasPrefix(s, a.text) {
			return a, true
		}
	}
	return addedToken{}, false
}

// encodeText appends the ids of raw text (no added tokens in it) to ids.
func (t *Tokenizer) encodeText(ids []int32, text string) []int32 {
	if t.normalize != nil {
		text = t.normalize(text)
	}
	text = validUTF8(text)
	r := []rune(text)
	bounds := t.pre.split(r)
	var (
		st  bpeState
		buf []byte
		off int // byte offset of rune bounds[i]
	)
	for i := 0; i+1 < len(bounds); i++ {
		end := off
		for _, c := range r[bounds[i]:bounds[i+1]] {
			end += utf8.RuneLen(c)
		}
		word := text[off:end]
		off = end
		if cached, ok := t.cache.get(word); ok {
			ids = append(ids, cached...)
			continue
		}
		buf = appendByteLevel(buf[:0], word)
		n := len(ids)
		ids = t.bpeWord(ids, &st, string(buf))
		t.cache.put(word, append([]int32(nil), ids[n:]...))
	}
	return ids
}

// validUTF8 replaces each byte of s that is not part of valid UTF-8 with
// U+FFFD, as llama.cpp's unicode_cpts_from_utf8 does.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for _, c := range s {
		b.WriteRune(c) // range yields U+FFFD for each invalid byte
	}
	return b.String()
}
