// Package secrets reads the environment variables a config names for its
// secrets (api_key_env, bearer_token_env). Every such lookup goes through
// Lookup, so that `rollout serve`, whose configs come from its clients, can
// confine them: otherwise a client could name any variable of the server's
// environment as a key and point the endpoint at a server of its own, and
// the server would send the value there.
package secrets

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
)

// ErrNotAllowed is wrapped when a name is outside the restriction.
var ErrNotAllowed = errors.New("not allowed by this server (rollout serve --allow-env)")

var (
	mu         sync.RWMutex
	restricted bool
	patterns   []string
)

// Restrict confines Lookup to the names that match one of patterns: a
// name, or a prefix ending in "*". No patterns allow no name. It returns a
// function that lifts the restriction again (for tests: the restriction is
// the process's).
func Restrict(allow []string) (lift func()) {
	mu.Lock()
	defer mu.Unlock()
	restricted, patterns = true, append([]string(nil), allow...)
	return func() {
		mu.Lock()
		defer mu.Unlock()
		restricted, patterns = false, nil
	}
}

// Allowed reports whether Lookup may read name.
func Allowed(name string) bool {
	mu.RLock()
	defer mu.RUnlock()
	if !restricted {
		return true
	}
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok && strings.HasPrefix(name, prefix) || p == name {
			return true
		}
	}
	return false
}

// Lookup returns the value of the environment variable name. A name
// outside the restriction wraps ErrNotAllowed, and an empty or unset
// variable is an error too: a secret that is not there.
func Lookup(name string) (string, error) {
	if name == "" {
		return "", errors.New("no environment variable named")
	}
	if !Allowed(name) {
		return "", fmt.Errorf("environment variable %s: %w", name, ErrNotAllowed)
	}
	v := os.Getenv(name)
	if v == "" {
		return "", fmt.Errorf("environment variable %s is empty or unset", name)
	}
	return v, nil
}
