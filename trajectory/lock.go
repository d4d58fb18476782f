package trajectory

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// LockName is the lock file of a run directory. Every writer of the
// directory (rollout run, eval, demo, serve jobs) holds an exclusive
// flock(2) on it for as long as it writes; readers (inspect, export) never
// take it. The kernel drops the lock when its holder dies, so a lock left by
// a crashed or killed process is recovered by the next writer without any
// clean-up. The file itself stays: removing it would let two processes
// lock two different files of the same name.
const LockName = "run.lock"

// ErrLocked is wrapped by the error LockDir returns when another writer
// holds the run directory.
var ErrLocked = errors.New("run directory is in use by another writer")

// LockHolder is what a writer records in the lock file, so that a refused
// writer can name who holds the directory.
type LockHolder struct {
	PID  int    `json:"pid"`
	Host string `json:"host"`
	// BootID tells a holder of this boot from a pid of a previous one
	// (Linux: /proc/sys/kernel/random/boot_id).
	BootID string `json:"boot_id,omitempty"`
	// Since is when the lock was taken.
	Since time.Time `json:"since"`
	// Command is the holder's command line (truncated).
	Command string `json:"command"`
	// Owner names the writer within its process, e.g. "job nightly-7".
	Owner string `json:"owner,omitempty"`
}

func (h LockHolder) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pid %d on %s", h.PID, h.Host)
	if h.Owner != "" {
		fmt.Fprintf(&b, " (%s)", h.Owner)
	}
	if h.Command != "" {
		fmt.Fprintf(&b, ", command %q", h.Command)
	}
	if !h.Since.IsZero() {
		fmt.Fprintf(&b, ", since %s", h.Since.Format(time.RFC3339))
	}
	return b.String()
}

// LockedError is returned by LockDir when the directory is held.
type LockedError struct {
	Dir string
	// Holder is nil when the holder had not yet recorded itself.
	Holder *LockHolder
}

func (e *LockedError) Error() string {
	who := "another process (it has not recorded itself yet)"
	if e.Holder != nil {
		who = e.Holder.String()
	}
	return fmt.Sprintf("%s: %v: held by %s; wait for it to end or use another output dir", e.Dir, ErrLocked, who)
}

// Unwrap makes errors.Is(err, ErrLocked) true.
func (e *LockedError) Unwrap() error { return ErrLocked }

// DirLock is a held run-directory lock. Unlock releases it; so does the
// death of the process.
type DirLock struct {
	f    *os.File
	path string
	once sync.Once
}

// LockDir takes the writer lock of run directory dir (created if needed)
// without waiting: when another writer holds it, it returns a *LockedError
// naming the holder. owner names this writer in the holder record.
func LockDir(dir, owner string) (*DirLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create run dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, LockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if !held {
		e := &LockedError{Dir: dir}
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			var h LockHolder
			if json.Unmarshal(b, &h) == nil && h.PID != 0 {
				e.Holder = &h
			}
		}
		f.Close()
		return nil, e
	}
	l := &DirLock{f: f, path: path}
	h := currentHolder(owner)
	b, _ := json.Marshal(h)
	b = append(b, '\n')
	// The holder record is information for a refused writer, not the lock:
	// a failure to write it does not release the directory.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt(b, 0)
	}
	return l, nil
}

// Unlock releases the lock. It is safe to call more than once.
func (l *DirLock) Unlock() error {
	if l == nil {
		return nil
	}
	var err error
	l.once.Do(func() {
		// Clear the record first: a writer refused in between reads an
		// empty file rather than a holder that is leaving.
		_ = l.f.Truncate(0)
		err = unlock(l.f)
		if cerr := l.f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			err = fmt.Errorf("unlock %s: %w", l.path, err)
		}
	})
	return err
}

// ReadLockHolder returns the holder recorded in dir's lock file while the
// directory is locked, or nil when no writer holds it.
func ReadLockHolder(dir string) (*LockHolder, error) {
	path := filepath.Join(dir, LockName)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	held, err := tryLock(f)
	if err != nil {
		return nil, err
	}
	if held {
		_ = unlock(f)
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var h LockHolder
	if err := json.Unmarshal(b, &h); err != nil {
		return &LockHolder{}, nil
	}
	return &h, nil
}

var (
	holderOnce sync.Once
	holderBase LockHolder
)

func currentHolder(owner string) LockHolder {
	holderOnce.Do(func() {
		host, _ := os.Hostname()
		boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
		cmd := strings.Join(os.Args, " ")
		if len(cmd) > 300 {
			cmd = cmd[:300] + "…"
		}
		holderBase = LockHolder{PID: os.Getpid(), Host: host, BootID: strings.TrimSpace(string(boot)), Command: cmd}
	})
	h := holderBase
	h.Since = time.Now().UTC().Truncate(time.Second)
	h.Owner = owner
	return h
}
