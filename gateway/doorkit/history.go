package doorkit

import (
	"encoding/binary"
	"hash/maphash"
	"slices"
	"sync"
)

// HistoryCache remembers the messages a door decoded from the message
// array of a request, keyed by the raw bytes of the array's elements. A
// harness re-sends its whole history on every call — the previous call's
// messages first, byte for byte, then the reply and the new tool results
// or user turns — so with the cache a call decodes only the elements after
// the longest run of leading elements it has seen before, and the cost of
// a call no longer grows with the history it carries. Decoding is a
// function of the bytes alone, so any session's entry serves any request
// with the same leading bytes; the key is a seeded 64-bit hash of the
// elements (each with its length) plus their count and total size.
//
// Entries are bounded by the raw bytes they stand for (MaxBytes, default
// 256 MiB): past it the cache starts afresh. An entry that a longer one
// extends is dropped (a session needs only its latest). The zero value is
// ready to use.
type HistoryCache[V any] struct {
	MaxBytes int

	once  sync.Once
	seed  maphash.Seed
	mu    sync.Mutex
	m     map[historyKey][]V
	bytes int
	// Hits and Reused count the calls that found a prefix and the
	// elements they did not decode (read under mu, for tests).
	hits, reused int
}

type historyKey struct {
	sum         uint64
	n, rawBytes int
}

// Decode is decode applied to every element of elems (the raw message
// objects, in order), the leading ones taken from the cache when a request
// with the same leading elements was decoded before. The result is the
// caller's; what the cache keeps is its own copy. An error of decode is
// returned as is and nothing is cached.
func (c *HistoryCache[V]) Decode(elems [][]byte, decode func(i int, raw []byte) (V, error)) ([]V, error) {
	c.once.Do(func() { c.seed = maphash.MakeSeed() })
	keys := make([]historyKey, len(elems))
	var h maphash.Hash
	h.SetSeed(c.seed)
	var n [8]byte
	size := 0
	for i, e := range elems {
		binary.LittleEndian.PutUint64(n[:], uint64(len(e)))
		h.Write(n[:])
		h.Write(e)
		size += len(e)
		keys[i] = historyKey{sum: h.Sum64(), n: i + 1, rawBytes: size}
	}
	var (
		prefix []V
		hit    historyKey
	)
	c.mu.Lock()
	for k := len(keys) - 1; k >= 0; k-- {
		if v, ok := c.m[keys[k]]; ok {
			prefix, hit = v, keys[k]
			c.hits++
			c.reused += len(v)
			break
		}
	}
	c.mu.Unlock()
	out := make([]V, len(prefix), len(elems))
	copy(out, prefix)
	for i := len(prefix); i < len(elems); i++ {
		v, err := decode(i, elems[i])
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if len(keys) == 0 || len(prefix) == len(elems) {
		return out, nil
	}
	last := keys[len(keys)-1]
	keep := slices.Clone(out)
	limit := c.MaxBytes
	if limit <= 0 {
		limit = 256 << 20
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prefix != nil {
		if _, ok := c.m[hit]; ok {
			delete(c.m, hit)
			c.bytes -= hit.rawBytes
		}
	}
	if c.m == nil || c.bytes+last.rawBytes > limit {
		c.m, c.bytes = map[historyKey][]V{}, 0
	}
	if _, ok := c.m[last]; !ok {
		c.m[last] = keep
		c.bytes += last.rawBytes
	}
	return out, nil
}

// Stats are the calls that found a decoded prefix and the elements they
// took from it.
func (c *HistoryCache[V]) Stats() (hits, reused int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.reused
}
