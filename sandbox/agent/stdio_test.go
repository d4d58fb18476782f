package agent

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A pipe handed over in blocking mode (as runc and the shims hand the
// agent its stdio) comes back served by the poller: it takes deadlines,
// which a blocking file refuses, and reads what is written.
func TestPollableStdioPipe(t *testing.T) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	r, w := os.NewFile(uintptr(fds[0]), "r"), os.NewFile(uintptr(fds[1]), "w")
	defer r.Close()
	defer w.Close()
	if err := r.SetReadDeadline(time.Now()); !errors.Is(err, os.ErrNoDeadline) {
		t.Fatalf("a blocking pipe took a deadline (%v): the test does not start from blocking stdio", err)
	}
	pr := pollable(r)
	defer pr.Close()
	if pr.Fd() == r.Fd() {
		t.Fatal("the pollable file owns the original's descriptor: both would close it")
	}
	if fl, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
		t.Fatalf("flags %#x, %v: want O_NONBLOCK", fl, err)
	}
	if err := pr.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("the pipe is not in the poller: %v", err)
	}
	if _, err := w.Write([]byte("frame")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if n, err := pr.Read(buf); err != nil || string(buf[:n]) != "frame" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	// An empty pipe blocks its reader until the deadline, not EAGAIN.
	if err := pr.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := pr.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read of an empty pipe: %v, want the deadline", err)
	}
}

// Anything but a pipe (a file, a terminal, /dev/null) is left as it is.
func TestPollableLeavesFiles(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := pollable(f); got != f {
		t.Fatal("a regular file was replaced")
	}
	if fl, _ := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); fl&unix.O_NONBLOCK != 0 {
		t.Fatal("a regular file was set non-blocking")
	}
}
