package trajectory

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLockDirOneWriter(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	l, err := LockDir(dir, "job first")
	if err != nil {
		t.Fatal(err)
	}
	_, err = LockDir(dir, "job second")
	var le *LockedError
	if !errors.As(err, &le) || !errors.Is(err, ErrLocked) {
		t.Fatalf("second writer: %v, want a LockedError", err)
	}
	if le.Holder == nil || le.Holder.PID != os.Getpid() || le.Holder.Owner != "job first" {
		t.Fatalf("holder: %+v", le.Holder)
	}
	if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("pid %d", os.Getpid())) || !strings.Contains(msg, "job first") || !strings.Contains(msg, dir) {
		t.Errorf("the error should name the directory and the holder: %v", err)
	}
	if h, err := ReadLockHolder(dir); err != nil || h == nil || h.Owner != "job first" {
		t.Errorf("ReadLockHolder while held: %+v, %v", h, err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Errorf("second Unlock: %v", err)
	}
	if h, err := ReadLockHolder(dir); err != nil || h != nil {
		t.Errorf("ReadLockHolder after Unlock: %+v, %v", h, err)
	}
	l2, err := LockDir(dir, "job second")
	if err != nil {
		t.Fatalf("after Unlock: %v", err)
	}
	defer l2.Unlock()
	if h, err := ReadLockHolder(t.TempDir()); err != nil || h != nil {
		t.Errorf("ReadLockHolder of a directory never locked: %+v, %v", h, err)
	}
}

const lockChildEnv = "ROLLOUT_TEST_LOCK_CHILD"

// TestLockHolderChild is the helper process of TestLockDirStaleHolder: it
// holds the lock until it is killed.
func TestLockHolderChild(t *testing.T) {
	dir := os.Getenv(lockChildEnv)
	if dir == "" {
		t.Skip("helper process of TestLockDirStaleHolder")
	}
	if _, err := LockDir(dir, "child"); err != nil {
		fmt.Println("error", err)
		os.Exit(3)
	}
	fmt.Println("locked")
	time.Sleep(time.Hour)
}

// A writer killed with SIGKILL leaves its lock file behind; the kernel has
// released the flock, so the next writer takes the directory at once.
func TestLockDirStaleHolder(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHolderChild$")
	cmd.Env = append(os.Environ(), lockChildEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "locked" {
		t.Fatalf("child: %q, %v", line, err)
	}
	_, err = LockDir(dir, "parent")
	var le *LockedError
	if !errors.As(err, &le) || le.Holder == nil || le.Holder.PID != cmd.Process.Pid || le.Holder.Owner != "child" {
		t.Fatalf("while the child holds the lock: %v", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, err := os.Stat(filepath.Join(dir, LockName)); err != nil {
		t.Fatalf("the lock file should stay: %v", err)
	}
	l, err := LockDir(dir, "parent")
	if err != nil {
		t.Fatalf("after the holder died: %v", err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
}
