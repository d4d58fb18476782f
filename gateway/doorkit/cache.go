package doorkit

import "sync"

// DecodeCache remembers what a door decoded from a part of a request
// that harnesses send again and again unchanged — the tool list, tens of
// kilobytes of JSON schemas for a coding harness, on every call — keyed by
// its raw bytes, so that each distinct form is decoded once. Values are
// shared by every call that sends the same bytes: read-only. It holds at
// most Max entries (default 64) and starts afresh when full. The zero
// value is ready to use.
type DecodeCache[V any] struct {
	Max int

	mu sync.Mutex
	m  map[string]V
}

// Get is decode(raw), from the cache when raw was decoded before. An error
// is not cached.
func (c *DecodeCache[V]) Get(raw []byte, decode func([]byte) (V, error)) (V, error) {
	c.mu.Lock()
	v, ok := c.m[string(raw)]
	c.mu.Unlock()
	if ok {
		return v, nil
	}
	v, err := decode(raw)
	if err != nil {
		return v, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	max := c.Max
	if max <= 0 {
		max = 64
	}
	if c.m == nil || len(c.m) >= max {
		c.m = make(map[string]V, max)
	}
	c.m[string(raw)] = v
	return v, nil
}
