// Package registry is the one name → value table behind the project's
// plugin registries (env kinds, env protocols, tool-call and reasoning
// parsers, sandbox backends): filled at init, read concurrently.
package registry

import (
	"slices"
	"sync"
)

// Registry holds values by name. The zero value is not usable: use New.
type Registry[T any] struct {
	what string // how a duplicate's panic names the table, e.g. "env protocol"
	mu   sync.RWMutex
	m    map[string]T
}

// New returns an empty registry whose entries are called what.
func New[T any](what string) *Registry[T] {
	return &Registry[T]{what: what, m: map[string]T{}}
}

// Register adds v under name. It panics on a duplicate name: registration
// happens at init, and a clash is a programming error.
func (r *Registry[T]) Register(name string, v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.m[name]; dup {
		panic(r.what + " " + name + " registered twice")
	}
	r.m[name] = v
}

// Lookup returns the value registered under name.
func (r *Registry[T]) Lookup(name string) (T, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	v, ok := r.m[name]
	return v, ok
}

// Names lists the registered names, sorted.
func (r *Registry[T]) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.m))
	for n := range r.m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
