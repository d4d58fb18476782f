package agent

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/rollout-rl/rollout/internal/util/tartree"
)

// asUser runs fn on a locked OS thread whose effective uid/gid (and so
// filesystem uid/gid) are the sandbox user's, so file operations get
// exactly the user's permissions (and create files owned by the user)
// although the agent is root. Only this thread changes (raw setresuid and
// setresgid, not the process-wide Go wrappers); the saved uid stays 0, so
// the thread switches back. (setfsuid alone is not enough: gVisor ignores
// it.) A thread that could not switch back is never reused: it stays
// locked and ends with its goroutine.
func (s *server) asUser(fn func() error) error {
	if s.uid == 0 && s.gid == 0 {
		return fn()
	}
	runtime.LockOSThread()
	keep := ^uintptr(0) // -1: leave unchanged
	set := func(uid, gid int) error {
		if uid != 0 { // to the user: gid first, while still root
			if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, keep, uintptr(gid), keep); e != 0 {
				return e
			}
			if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
				return e
			}
			return nil
		}
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, 0, keep); e != 0 {
			return e
		}
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, keep, 0, keep); e != 0 {
			return e
		}
		return nil
	}
	if err := set(s.uid, s.gid); err != nil {
		return fmt.Errorf("switch to the sandbox user for a file operation: %w", err)
	}
	defer func() {
		if set(0, 0) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return fn()
}

func cleanAbs(path string) (string, error) {
	if path == "" || !filepath.IsAbs(path) {
		return "", invalidf("path %q is not absolute", path)
	}
	if strings.ContainsRune(path, 0) {
		return "", invalidf("path contains a NUL byte")
	}
	return filepath.Clean(path), nil
}

// chanReader reads the request's inbound Data frames.
type chanReader struct {
	ctx  context.Context
	ch   <-chan []byte
	buf  []byte
	done bool
}

func (r *chanReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.done {
			return 0, io.EOF
		}
		select {
		case b, ok := <-r.ch:
			if !ok {
				r.done = true
				continue
			}
			r.buf = b
		case <-r.ctx.Done():
			return 0, fmt.Errorf("transfer aborted: %w", r.ctx.Err())
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// frameWriter sends its bytes as Data frames of request id.
type frameWriter struct {
	p  *peer
	id uint32
	n  int64
}

func (w *frameWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		c := min(len(p), ChunkSize)
		if err := w.p.send(FrameData, w.id, p[:c]); err != nil {
			return written, err
		}
		written += c
		w.n += int64(c)
		p = p[c:]
	}
	return written, nil
}

func (s *server) writeFile(ctx context.Context, path string, mode uint32, data <-chan []byte) (int64, error) {
	p, err := cleanAbs(path)
	if err != nil {
		return 0, err
	}
	perm := fs.FileMode(mode) & fs.ModePerm
	if perm == 0 {
		perm = 0o644
	}
	var n int64
	err = s.asUser(func() error {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
		if err != nil {
			return err
		}
		n, err = io.Copy(f, &chanReader{ctx: ctx, ch: data})
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		return os.Chmod(p, perm)
	})
	if err != nil {
		return n, fmt.Errorf("write %s: %w", p, err)
	}
	return n, nil
}

func (s *server) readFile(ctx context.Context, pr *peer, id uint32, path string) (int64, error) {
	p, err := cleanAbs(path)
	if err != nil {
		return 0, err
	}
	w := &frameWriter{p: pr, id: id}
	err = s.asUser(func() error {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if fi, err := f.Stat(); err == nil && fi.IsDir() {
			return invalidf("%s is a directory", p)
		}
		_, err = io.Copy(w, ctxReader{ctx, f})
		return err
	})
	_ = pr.send(FrameEnd, id, nil)
	if err != nil {
		return w.n, fmt.Errorf("read %s: %w", p, err)
	}
	return w.n, nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// upload extracts a tar stream into dir. Entries may not leave dir.
func (s *server) upload(ctx context.Context, dir string, data <-chan []byte) error {
	root, err := cleanAbs(dir)
	if err != nil {
		return err
	}
	err = s.asUser(func() error {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return err
		}
		tr := tar.NewReader(&chanReader{ctx: ctx, ch: data})
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("tar stream: %w", err)
			}
			target, err := within(root, h.Name)
			if err != nil {
				return err
			}
			mode := fs.FileMode(h.Mode) & (fs.ModePerm | fs.ModeSticky)
			switch h.Typeflag {
			case tar.TypeDir:
				if err := os.MkdirAll(target, 0o755); err != nil {
					return err
				}
				if err := os.Chmod(target, mode|0o700); err != nil {
					return err
				}
			case tar.TypeReg:
				if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
					return err
				}
				_ = os.Remove(target)
				f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
				if err != nil {
					return err
				}
				_, err = io.Copy(f, tr)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return fmt.Errorf("%s: %w", h.Name, err)
				}
				if err := os.Chmod(target, mode); err != nil {
					return err
				}
			case tar.TypeSymlink:
				if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
					return err
				}
				_ = os.Remove(target)
				if err := os.Symlink(h.Linkname, target); err != nil {
					return err
				}
			case tar.TypeLink:
				src, err := within(root, h.Linkname)
				if err != nil {
					return err
				}
				_ = os.Remove(target)
				if err := os.Link(src, target); err != nil {
					return err
				}
			default:
				// Devices, fifos and the like are not placed into sandboxes.
			}
		}
	})
	if err != nil {
		// The reader loop drops the rest of the stream once we returned.
		return fmt.Errorf("upload into %s: %w", root, err)
	}
	return nil
}

func within(root, name string) (string, error) {
	clean := filepath.Clean("/" + name)
	if clean == "/" {
		return root, nil
	}
	rel := strings.TrimPrefix(clean, "/")
	if filepath.IsAbs(name) || strings.HasPrefix(filepath.Clean(name), "..") {
		return "", invalidf("tar entry %q leaves the target directory", name)
	}
	return filepath.Join(root, rel), nil
}

// download writes a tar stream of dir as Data frames.
func (s *server) download(ctx context.Context, pr *peer, id uint32, dir string) (int64, error) {
	root, err := cleanAbs(dir)
	if err != nil {
		return 0, err
	}
	w := &frameWriter{p: pr, id: id}
	err = s.asUser(func() error {
		fi, err := os.Stat(root)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return invalidf("%s is not a directory", root)
		}
		tw := tar.NewWriter(w)
		// Owner ids are kept: they are the sandbox's own.
		err = tartree.Write(ctx, tw, root, true)
		if err != nil {
			return err
		}
		return tw.Close()
	})
	_ = pr.send(FrameEnd, id, nil)
	if err != nil {
		return w.n, fmt.Errorf("download %s: %w", root, err)
	}
	return w.n, nil
}
