package render

import (
	"sync"
	"unicode/utf8"
)

// byteLevel maps each byte to the printable rune that stands for it in a
// byte-level BPE vocabulary (the GPT-2 convention): the printable Latin-1
// bytes '!'..'~', '¡'..'¬' and '®'..'ÿ' stand for themselves, every other
// byte is shifted to U+0100 and up, in byte order.
var byteLevel = func() (m [256]string) {
	next := rune(256)
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			m[b] = string(rune(b))
			continue
		}
		m[b] = string(next)
		next++
	}
	return m
}()

// appendByteLevel appends the byte-level form of raw to dst.
func appendByteLevel(dst []byte, raw string) []byte {
	for i := 0; i < len(raw); i++ {
		dst = append(dst, byteLevel[raw[i]]...)
	}
	return dst
}

// symbol is one run of a word during BPE: the bytes [start, start+n) of the
// byte-level word; n is 0 once merged into its left neighbour.
type symbol struct {
	start, n   int
	prev, next int
}

// bigram is a candidate merge of the symbols left and right (adjacent when
// queued), size bytes long in all.
type bigram struct {
	rank        int32
	left, right int
	size        int
}

// bigramQueue is a min-heap on (rank, left): the lowest-ranked merge
// first, the leftmost among equals, as llama.cpp's llm_tokenizer_bpe_session.
// (Typed rather than container/heap, which would box every bigram.)
type bigramQueue []bigram

func (q bigramQueue) less(i, j int) bool {
	return q[i].rank < q[j].rank || (q[i].rank == q[j].rank && q[i].left < q[j].left)
}

func (q *bigramQueue) push(b bigram) {
	*q = append(*q, b)
	h := *q
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (q *bigramQueue) pop() bigram {
	h := *q
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h.less(l, m) {
			m = l
		}
		if r < len(h) && h.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return top
}

// bpeState is the scratch space of one word's merges, reused from word
// to word.
type bpeState struct {
	word  string
	syms  []symbol
	queue bigramQueue
	key   []byte
}

// bpeWord appends the ids of one pre-token, already in byte-level form,
// to dst.
func (t *Tokenizer) bpeWord(dst []int32, st *bpeState, word string) []int32 {
	if t.ignoreMerges {
		if id, ok := t.vocab[word]; ok {
			return append(dst, id)
		}
	}
	st.word = word
	st.queue = st.queue[:0]
	st.split()
	for i := 1; i < len(st.syms); i++ {
		t.addBigram(st, i-1, i)
	}
	for len(st.queue) > 0 {
		bg := st.queue.pop()
		l, r := &st.syms[bg.left], &st.syms[bg.right]
		if l.n == 0 || r.n == 0 || l.next != bg.right || l.n+r.n != bg.size {
			continue // outdated: one side was merged since it was queued
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			st.syms[r.next].prev = bg.left
		}
		t.addBigram(st, l.prev, bg.left)
		t.addBigram(st, bg.left, l.next)
	}
	for i := 0; i >= 0 && i < len(st.syms); i = st.syms[i].next {
		s := st.syms[i]
		if s.n == 0 {
			continue
		}
		dst = t.appendPiece(dst, word[s.start:s.start+s.n])
	}
	return dst
}

// split cuts the word into its UTF-8 characters, one symbol each.
func (st *bpeState) split() {
	st.syms = st.syms[:0]
	for off := 0; off < len(st.word); {
		_, n := utf8.DecodeRuneInString(st.word[off:])
		i := len(st.syms)
		st.syms = append(st.syms, symbol{start: off, n: n, prev: i - 1, next: i + 1})
		off += n
	}
	if len(st.syms) > 0 {
		st.syms[len(st.syms)-1].next = -1
	}
}

// addBigram queues the merge of symbols left and right when the merges
// list has it.
func (t *Tokenizer) addBigram(st *bpeState, left, right int) {
	if left < 0 || right < 0 {
		return
	}
	l, r := st.syms[left], st.syms[right]
	st.key = append(st.key[:0], st.word[l.start:l.start+l.n]...)
	st.key = append(st.key, ' ')
	st.key = append(st.key, st.word[r.start:r.start+r.n]...)
	rank, ok := t.ranks[string(st.key)]
	if !ok {
		return
	}
	st.queue.push(bigram{rank: rank, left: left, right: right, size: l.n + r.n})
}

// appendPiece appends the id of a finished symbol; one the vocabulary
// lacks falls back, as in llama.cpp, to the ids of its single bytes that
// are tokens (the others are dropped).
func (t *Tokenizer) appendPiece(dst []int32, piece string) []int32 {
	if id, ok := t.vocab[piece]; ok {
		return append(dst, id)
	}
	for i := 0; i < len(piece); i++ {
		if id, ok := t.vocab[piece[i:i+1]]; ok {
			dst = append(dst, id)
		}
	}
	return dst
}

// Cache bounds: words longer than maxCachedWord bytes are not cached, and
// the cache is emptied when it reaches maxCacheEntries.
const (
	maxCachedWord   = 128
	maxCacheEntries = 1 << 16
)

// wordCache maps a pre-token (its raw text) to its ids; bounded, safe for
// concurrent use.
type wordCache struct {
	mu sync.Mutex
	m  map[string][]int32
}

func (c *wordCache) get(word string) ([]int32, bool) {
	c.mu.Lock()
	ids, ok := c.m[word]
	c.mu.Unlock()
	return ids, ok
}

func (c *wordCache) put(word string, ids []int32) {
	if len(word) > maxCachedWord {
		return
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCacheEntries {
		c.m = make(map[string][]int32)
	}
	c.m[word] = ids
	c.mu.Unlock()
}
