package inference

import (
	"strings"
	"unicode/utf8"
)

// tokenPieces are the texts of a turn's sampled ids as the generation
// response spelled them, one per id: llama-server's completion_probabilities
// carry each entry's bytes. With them the turn's text and its token spans
// need no /detokenize round trip. A control token (<|im_end|>, <|im_start|>)
// is spelled empty there while /detokenize writes it out, so a piece that
// is empty is unknown text, never used as text.
type tokenPieces struct {
	text string // all pieces, concatenated
	ends []int  // ends[i] is the byte end of id i's piece in text
}

// llamaPieces reads the pieces from llama-server's completion_probabilities
// when it wrote one entry per sampled id (positional: each entry's id is
// the id at its place); nil when entries were withheld (ids inside an
// unfinished UTF-8 character) or an entry has no id or a byte out of range.
func llamaPieces(ids []int32, probs []LlamaProb) *tokenPieces {
	if len(ids) == 0 || len(probs) != len(ids) {
		return nil
	}
	n := 0
	for i, pr := range probs {
		if pr.ID == nil || *pr.ID != ids[i] {
			return nil
		}
		n += len(pr.Bytes)
	}
	var b strings.Builder
	b.Grow(n)
	ends := make([]int, len(ids))
	for i, pr := range probs {
		for _, x := range pr.Bytes {
			if x < 0 || x > 255 {
				return nil
			}
			b.WriteByte(byte(x))
		}
		ends[i] = b.Len()
	}
	return &tokenPieces{text: b.String(), ends: ends}
}

// empty reports whether id i's piece is empty (a control token's).
func (p *tokenPieces) empty(i int) bool {
	start := 0
	if i > 0 {
		start = p.ends[i-1]
	}
	return p.ends[i] == start
}

// textOf is the text of the first n ids when every one of them has a
// non-empty piece and together they are valid UTF-8 (what /detokenize
// would answer for them); ok is false otherwise, and the caller asks the
// server.
func (p *tokenPieces) textOf(n int) (string, bool) {
	if p == nil || n <= 0 || n > len(p.ends) {
		return "", false
	}
	for i := range n {
		if p.empty(i) {
			return "", false
		}
	}
	t := p.text[:p.ends[n-1]]
	if !utf8.ValidString(t) {
		return "", false
	}
	return t, true
}

// prefixLen is prefixer.length from the pieces: the byte length of the
// text of the first k ids when it is a prefix of text, else -1. An id
// with an empty piece (a control token, spelled out by /detokenize) makes
// every prefix through it unknown, hence -1, as is a prefix that ends
// inside a UTF-8 character (the server decodes it to a replacement).
func (p *tokenPieces) prefixLen(k int, text string) int {
	if k == 0 {
		return 0
	}
	for i := range k {
		if p.empty(i) {
			return -1
		}
	}
	n := p.ends[k-1]
	if n > len(text) || p.text[:n] != text[:n] || !utf8.ValidString(text[:n]) {
		return -1
	}
	return n
}
