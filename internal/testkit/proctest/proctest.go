// Package proctest holds what tests that run child processes (rollout
// serve, rollout sim, a Python trainer) need from one place: a buffer the
// child writes while the test reads it, a free loopback port, and starting
// a server child on one (StartServer).
package proctest

import (
	"bytes"
	"net"
	"os"
	"sync"
	"testing"
)

// Buffer is a bytes.Buffer safe for a child's output and the test reading
// it at the same time.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Python is the interpreter the Python tests run: Debian's /usr/bin/python3,
// or ROLLOUT_PYTHON. The first python3 on PATH may be a pyenv or virtualenv
// one that does not see Debian's packages.
func Python() string {
	if p := os.Getenv("ROLLOUT_PYTHON"); p != "" {
		return p
	}
	return "/usr/bin/python3"
}

// Need skips the test with msg, or fails it when CI is "true": CI never
// passes by skipping what it was set up to run.
func Need(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true: " + msg)
	}
	t.Skip(msg)
}
