package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// holdDpkgLock takes the dpkg frontend lock the way apt does (an fcntl
// write lock) and returns its release. It skips without root or apt, and
// when another apt process holds the lock for a minute (a shared machine).
func holdDpkgLock(t *testing.T) (release func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the dpkg lock is root's")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("no apt-get on this host")
	}
	f, err := os.OpenFile(aptLockFiles[0], os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no dpkg lock file: %v", err)
	}
	lk := syscall.Flock_t{Type: syscall.F_WRLCK}
	deadline := time.Now().Add(time.Minute)
	for {
		err = syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			f.Close()
			t.Skipf("another apt process holds the dpkg lock: %v", AptLockHolders())
		}
		time.Sleep(time.Second)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			un := syscall.Flock_t{Type: syscall.F_UNLCK}
			_ = syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &un)
			f.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// The holder is named from /proc/locks: this test's own pid.
func TestAptLockHolders(t *testing.T) {
	holdDpkgLock(t)
	h := AptLockHolders()
	want := fmt.Sprintf("pid %d (", os.Getpid())
	if len(h) == 0 || !strings.Contains(strings.Join(h, "; "), want) || !strings.Contains(h[0], "/var/lib/dpkg/lock-frontend") {
		t.Fatalf("holders %q, want this process (%s…) holding /var/lib/dpkg/lock-frontend", h, want)
	}
}

// A lock held past the bound fails the install saying who holds it, after
// apt waited, and without updating the lists; nothing is installed
// (coreutils is, already).
func TestAptInstallLockHeldTooLong(t *testing.T) {
	holdDpkgLock(t)
	t.Setenv("ROLLOUT_DPKG_LOCK_TIMEOUT", "2")
	var log bytes.Buffer
	start := time.Now()
	err := aptInstall(context.Background(), &log, "coreutils")
	took := time.Since(start)
	if !errors.Is(err, ErrMissingTool) {
		t.Fatalf("install under a held lock: %v, want ErrMissingTool", err)
	}
	for _, want := range []string{"dpkg lock is still held after waiting 2s", fmt.Sprintf("pid %d (", os.Getpid()), "/var/lib/dpkg/lock-frontend"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// apt waited its 2 s: by the clock (its own "Waiting for cache lock"
	// line does not always reach a pipe).
	out := log.String()
	if !strings.Contains(out, "waiting up to 2s for the dpkg lock: pid ") || took < 1500*time.Millisecond {
		t.Errorf("after %s, log does not show the wait:\n%s", took, out)
	}
	if strings.Contains(out, "Hit:") || strings.Contains(out, "Get:") {
		t.Errorf("the lists were updated under a held lock:\n%s", out)
	}
}

// lineWatch is a log writer that reports when a line containing want
// went by.
type lineWatch struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *lineWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// A lock released while apt waits: the install goes on and succeeds.
// The release follows the install's own "waiting" line and a few seconds
// in which apt, started under the held lock, did not return: apt's
// "Waiting for cache lock" line is not waited for, since whether it
// reaches a pipe before apt ends depends on apt's buffering (one CI run
// saw nothing from apt in five minutes).
func TestAptInstallWaitsForLock(t *testing.T) {
	release := holdDpkgLock(t)
	t.Setenv("ROLLOUT_DPKG_LOCK_TIMEOUT", "300")
	w := &lineWatch{want: "waiting up to 5m0s for the dpkg lock", seen: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- aptInstall(ctx, w, "coreutils") }()
	select {
	case <-w.seen:
	case err := <-done:
		t.Fatalf("install returned without waiting for the lock: %v\n%s", err, w.buf.String())
	}
	select {
	case err := <-done:
		t.Fatalf("install returned while the lock was held: %v\n%s", err, w.buf.String())
	case <-time.After(3 * time.Second):
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("install after the lock was released: %v\n%s", err, w.buf.String())
	}
}

// scripts/apt-install.sh, which the ensure-*.sh scripts and lab.sh use,
// does the same: waits, names the holder, fails after the bound.
func TestAptInstallScriptLockHeld(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "apt-install.sh")
	holdDpkgLock(t)
	cmd := exec.Command(script, "coreutils")
	cmd.Env = append(os.Environ(), "ROLLOUT_DPKG_LOCK_TIMEOUT=2")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("apt-install.sh under a held lock succeeded:\n%s", out)
	}
	for _, want := range []string{"waiting up to 2 s for the dpkg lock", "still held after 2 s", fmt.Sprintf("pid %d (", os.Getpid())} {
		if !strings.Contains(string(out), want) {
			t.Errorf("apt-install.sh output does not say %q:\n%s", want, out)
		}
	}
}

// A malformed ROLLOUT_DPKG_LOCK_TIMEOUT is an error naming it, never a
// silent default.
func TestAptLockTimeoutSetting(t *testing.T) {
	t.Setenv("ROLLOUT_DPKG_LOCK_TIMEOUT", "")
	if d, err := aptLockTimeout(); err != nil || d != DefaultAptLockTimeout {
		t.Fatalf("unset: %v, %v", d, err)
	}
	t.Setenv("ROLLOUT_DPKG_LOCK_TIMEOUT", "7")
	if d, err := aptLockTimeout(); err != nil || d != 7*time.Second {
		t.Fatalf("7: %v, %v", d, err)
	}
	for _, bad := range []string{"abc", "-1", "1.5"} {
		t.Setenv("ROLLOUT_DPKG_LOCK_TIMEOUT", bad)
		if _, err := aptLockTimeout(); err == nil || !strings.Contains(err.Error(), "ROLLOUT_DPKG_LOCK_TIMEOUT") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
