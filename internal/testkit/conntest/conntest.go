// Package conntest checks, in tests, how many connections an HTTP client
// opens: a test server that counts its clients' connections, and
// concurrent rounds of calls to run against it.
package conntest

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// Server is an httptest.Server that remembers the remote address of every
// request it serves.
type Server struct {
	*httptest.Server
	mu    sync.Mutex
	addrs map[string]bool
}

// NewServer starts a Server serving h; close it with Close.
func NewServer(h http.Handler) *Server {
	s := &Server{addrs: map[string]bool{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.addrs[r.RemoteAddr] = true
		s.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	return s
}

// Conns is the number of distinct connections requests came on.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.addrs)
}

// Rounds calls fn from callers goroutines at once, rounds times, each
// round after the one before has ended, and fails t on any error.
func Rounds(t testing.TB, callers, rounds int, fn func() error) {
	t.Helper()
	for range rounds {
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for range callers {
			wg.Go(func() {
				if err := fn(); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
}
