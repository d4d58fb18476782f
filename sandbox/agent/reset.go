package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// defaultResetTimeout bounds a reset whose request gives no TimeoutNS.
	defaultResetTimeout = 60 * time.Second
	// quiesceTimeout bounds waiting for cancelled requests and for the
	// killed processes to disappear from /proc.
	quiesceTimeout = 5 * time.Second
)

func failedf(format string, a ...any) error {
	return &codedError{CodeFailed, fmt.Sprintf(format, a...)}
}

// reset is OpReset: see the op's comment in proto.go. self/selfID is the
// reset request itself, which is not cancelled.
func (s *server) reset(ctx context.Context, self *peer, selfID uint32, req *Request) (*ResetResult, error) {
	start := time.Now()
	if req.TimeoutNS < 0 {
		return nil, invalidf("negative timeout")
	}
	roots, err := validateResetPaths(req.Paths, s.roots)
	if err != nil {
		return nil, err
	}
	if s.checkMounts {
		if err := checkCoverage(s.mountTable, req.Paths, s.uid, s.gid, unix.Lstat); err != nil {
			return nil, err
		}
	}
	if os.Getpid() == 1 {
		return nil, invalidf("reset: the agent is pid 1, nothing would reap orphaned processes")
	}
	// From here on the serve loops refuse new requests (see servePeer).
	if !s.resetting.CompareAndSwap(false, true) {
		return nil, failedf("another reset is in progress")
	}
	defer s.resetting.Store(false)
	budget := defaultResetTimeout
	if req.TimeoutNS > 0 {
		budget = time.Duration(req.TimeoutNS)
	}
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()

	res := &ResetResult{}
	if err := s.cancelOthers(ctx, self, selfID); err != nil {
		return nil, err
	}
	if res.Killed, err = killAndWait(ctx); err != nil {
		return nil, err
	}
	if err := s.clearState(ctx); err != nil {
		return nil, err
	}
	if res.IPC, err = s.cleanIPC(ctx); err != nil {
		return nil, err
	}
	for _, r := range roots {
		n, err := wipeDir(ctx, r.path)
		res.Removed += n
		if err != nil {
			return nil, failedf("reset %s: %v", r.path, err)
		}
		if err := restoreRoot(r); err != nil {
			return nil, failedf("reset %s: %v", r.path, err)
		}
	}
	if err := s.prepareDirs(); err != nil {
		return nil, failedf("reset: %v", err)
	}
	// Kernel keys (keyctl; Docker's default seccomp profile denies it)
	// outlive processes and are not the agent's to remove.
	if s.keyBase >= 0 {
		if n := keyCount(s.uid); n > s.keyBase {
			return nil, failedf("reset: uid %d holds %d kernel keys (%d at start-up); they outlive its processes", s.uid, n, s.keyBase)
		}
	}
	res.DurationNS = int64(time.Since(start))
	return res, nil
}

// cancelOthers cancels every in-flight request of every peer but the reset
// itself and waits for their handlers to return.
func (s *server) cancelOthers(ctx context.Context, self *peer, selfID uint32) error {
	s.mu.Lock()
	peers := make([]*peer, 0, len(s.peers))
	for p := range s.peers {
		peers = append(peers, p)
	}
	s.mu.Unlock()
	var dones []chan struct{}
	for _, p := range peers {
		p.mu.Lock()
		for id, in := range p.reqs {
			if p == self && id == selfID {
				continue
			}
			in.cancel()
			dones = append(dones, in.done)
		}
		p.mu.Unlock()
	}
	t := time.NewTimer(quiesceTimeout)
	defer t.Stop()
	for i, d := range dones {
		select {
		case <-d:
		case <-t.C:
			return failedf("reset: %d cancelled requests still running after %v", len(dones)-i, quiesceTimeout)
		case <-ctx.Done():
			return failedf("reset: waiting for cancelled requests: %v", ctx.Err())
		}
	}
	return nil
}

// killAndWait kills every process but init and the agent and waits until
// /proc lists none, zombies included (init reaps orphans, the agent's
// handlers and background waiters reap its own children).
func killAndWait(ctx context.Context) (int, error) {
	killed, err := killAll()
	deadline := time.Now().Add(quiesceTimeout)
	for {
		pids, lerr := otherPIDs()
		if lerr != nil {
			return killed, failedf("reset: %v", lerr)
		}
		if len(pids) == 0 {
			return killed, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			msg := fmt.Sprintf("reset: processes survived the reset: pids %v", pids[:min(len(pids), 20)])
			if err != nil {
				msg += " (" + err.Error() + ")"
			}
			return killed, failedf("%s", msg)
		}
		n, kerr := killAll()
		killed += n
		if kerr != nil {
			err = kerr
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// otherPIDs lists every process in /proc but pid 1 and the agent.
func otherPIDs() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list /proc: %w", err)
	}
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 || pid == self {
			continue
		}
		out = append(out, pid)
	}
	return out, nil
}

// clearState forgets what the previous requests left in the agent: the
// background processes (their waiters have returned: every process is
// gone) and the shell session. The rest of the server is set at start-up
// only (user, workdir, base environment, mounts) or per request.
func (s *server) clearState(ctx context.Context) error {
	s.mu.Lock()
	procs := s.procs
	s.procs = map[string]*proc{}
	s.order = nil
	s.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.done:
		case <-ctx.Done():
			return failedf("reset: background process %s not collected: %v", p.id, ctx.Err())
		}
	}
	s.shellMu.Lock()
	s.shellCwd = s.workdir
	s.shellEnv = nil
	s.shellMu.Unlock()
	return nil
}

// sysvipcFiles are the kernel's lists of SysV IPC objects in the agent's
// IPC namespace.
var sysvipcFiles = []string{"/proc/sysvipc/shm", "/proc/sysvipc/sem", "/proc/sysvipc/msg"}

// listIPC returns the ids of every SysV object per kind ("shm", "sem",
// "msg"). A missing list is an error: objects may exist that cannot be
// seen (gVisor has the calls; a kernel without SysV IPC, which has
// neither, is not worth a special case).
func listIPC() (map[string][]int, int, error) {
	out := map[string][]int{}
	total := 0
	for _, f := range sysvipcFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, 0, fmt.Errorf("read %s: %w", f, err)
		}
		ids, err := parseSysvipc(b)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", f, err)
		}
		out[path.Base(f)] = ids
		total += len(ids)
	}
	return out, total, nil
}

// parseSysvipc reads the id column (the second) of a /proc/sysvipc file,
// after its header line.
func parseSysvipc(b []byte) ([]int, error) {
	var ids []int
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) == 0 {
			continue
		}
		if len(f) < 2 {
			return nil, fmt.Errorf("malformed line %q", line)
		}
		id, err := strconv.Atoi(f[1])
		if err != nil {
			return nil, fmt.Errorf("malformed id in %q", line)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// cleanIPC removes the SysV IPC objects of the namespace. The agent lacks
// CAP_SYS_ADMIN (and CAP_IPC_OWNER), so only an object's owner or creator
// may remove it: the removal runs in a child, the agent's own binary with
// -ipc-clean, with the credentials commands get. Every object must be gone
// afterwards.
func (s *server) cleanIPC(ctx context.Context) (int, error) {
	_, n, err := listIPC()
	if err != nil {
		return 0, failedf("reset: %v", err)
	}
	if n == 0 {
		return 0, nil
	}
	cmd := exec.CommandContext(ctx, s.selfExe, ipcCleanFlag)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if s.uid != 0 || s.gid != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(s.uid), Gid: uint32(s.gid), Groups: []uint32{}}
	}
	out := newCapBuf(4 << 10)
	cmd.Stdout, cmd.Stderr = out, out
	runErr := cmd.Run()
	left, m, err := listIPC()
	if err != nil {
		return 0, failedf("reset: %v", err)
	}
	if m > 0 {
		msg, _, _ := out.bytes()
		detail := strings.TrimSpace(string(msg))
		if runErr != nil {
			detail = strings.TrimSpace(runErr.Error() + ": " + detail)
		}
		return 0, failedf("reset: SysV IPC objects left (shm %v, sem %v, msg %v): %s", left["shm"], left["sem"], left["msg"], detail)
	}
	return n, nil
}

// ipcCleanFlag is the hidden mode of the agent's binary that removes the
// caller's SysV IPC objects (see ipcClean).
const ipcCleanFlag = "-ipc-clean"

// ipcClean removes, with IPC_RMID, every SysV shm segment, semaphore set
// and message queue of the IPC namespace that the calling process may
// remove, and exits non-zero if any could not be. The reset runs it as the
// sandbox user. Anyone who can run the agent's binary (the sandbox user
// can: it is mounted into the container) gains nothing: the kernel lets a
// process remove only objects it owns or created (or with CAP_SYS_ADMIN,
// which commands never have), which `ipcrm` does as well.
func ipcClean() int {
	rmid := map[string]func(int) error{
		"shm": func(id int) error { _, err := unix.SysvShmCtl(id, unix.IPC_RMID, nil); return err },
		"sem": func(id int) error {
			_, _, e := unix.Syscall6(unix.SYS_SEMCTL, uintptr(id), 0, unix.IPC_RMID, 0, 0, 0)
			return errnoErr(e)
		},
		"msg": func(id int) error {
			_, _, e := unix.Syscall(unix.SYS_MSGCTL, uintptr(id), unix.IPC_RMID, 0)
			return errnoErr(e)
		},
	}
	objs, _, err := listIPC()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ipc-clean:", err)
		return 1
	}
	failed, removed := 0, 0
	for _, kind := range []string{"shm", "sem", "msg"} {
		for _, id := range objs[kind] {
			err := rmid[kind](id)
			switch {
			case err == nil:
				removed++
			case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EIDRM):
				// gone meanwhile
			default:
				failed++
				fmt.Fprintf(os.Stderr, "ipc-clean: %s %d: %v\n", kind, id, err)
			}
		}
	}
	fmt.Fprintf(os.Stdout, "ipc-clean: removed %d\n", removed)
	if failed > 0 {
		return 1
	}
	return 0
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// wipeDir removes everything under the directory root (a mount root),
// never following a symlink and without DAC_OVERRIDE or FOWNER: every
// directory is first given to root (CAP_CHOWN) and made 0700, so root, as
// its owner, may list it and remove any entry, sticky bit or not. The walk
// is iterative and holds one descriptor: it goes down with openat and back
// up with "..", checking the inode it arrives at, so a tree of any depth
// costs only its names on the way down. ctx bounds it. Entries on another
// filesystem (a mount point below root) are an error. root is left owned
// by root, mode 0700; restoreRoot puts back its start-up state.
func wipeDir(ctx context.Context, root string) (removed int, err error) {
	w, err := openWipe(root)
	if err != nil {
		return 0, err
	}
	// w.fd moves with the walk: close whichever directory it ends in.
	defer func() { _ = unix.Close(w.fd) }()
	for ops := 1; ; ops++ {
		if ops%256 == 0 {
			if err := ctx.Err(); err != nil {
				return w.removed, fmt.Errorf("stopped after removing %d entries: %w", w.removed, err)
			}
		}
		top := &w.stack[len(w.stack)-1]
		if len(top.pending) == 0 {
			names, err := w.list()
			if err != nil {
				return w.removed, err
			}
			if len(names) > 0 {
				top.pending = names
				continue
			}
			if len(w.stack) == 1 {
				return w.removed, nil
			}
			if err := w.up(); err != nil {
				return w.removed, err
			}
			continue
		}
		name := top.pending[0]
		top.pending = top.pending[1:]
		if err := w.entry(name); err != nil {
			return w.removed, err
		}
	}
}

// openDir opens a directory of the walk, never through a symlink.
const openDir = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

// wiper is the state of one wipeDir walk: fd is the directory it is in,
// stack the path from root down to it.
type wiper struct {
	root    string
	dev     uint64 // root's filesystem: the walk never leaves it
	fd      int
	stack   []wipeFrame
	buf     []byte
	removed int
}

type wipeFrame struct {
	name    string // in the parent
	ino     uint64
	pending []string // names read from the directory, not yet handled
}

// openWipe takes root over (owner root, mode 0700) and opens it to start
// the walk there.
func openWipe(root string) (*wiper, error) {
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, fmt.Errorf("%s is not a directory", root)
	}
	if err := unix.Lchown(root, 0, 0); err != nil {
		return nil, fmt.Errorf("chown %s: %w", root, err)
	}
	if err := unix.Chmod(root, 0o700); err != nil {
		return nil, fmt.Errorf("chmod %s: %w", root, err)
	}
	fd, err := unix.Open(root, openDir, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", root, err)
	}
	if err := sameInode(fd, st.Dev, st.Ino); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", root, err)
	}
	return &wiper{
		root:  root,
		dev:   st.Dev,
		fd:    fd,
		stack: []wipeFrame{{ino: st.Ino}},
		buf:   make([]byte, 32<<10),
	}, nil
}

// where names the entry name of the current directory for an error,
// shortened in the middle when the tree is deep.
func (w *wiper) where(name string) string {
	parts := []string{w.root}
	for _, f := range w.stack[1:] {
		parts = append(parts, f.name)
	}
	if name != "" {
		parts = append(parts, name)
	}
	p := path.Join(parts...)
	if len(p) > 300 {
		p = p[:120] + "…" + p[len(p)-120:]
	}
	return p
}

// list reads the next names of the current directory; none means it is
// empty.
func (w *wiper) list() ([]string, error) {
	names, err := readNames(w.fd, w.buf)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", w.where(""), err)
	}
	if len(names) == 0 {
		// End of the directory from the current offset: every entry
		// before it was removed. Read once more from the start.
		if _, err := unix.Seek(w.fd, 0, 0); err != nil {
			return nil, fmt.Errorf("rewind %s: %w", w.where(""), err)
		}
		if names, err = readNames(w.fd, w.buf); err != nil {
			return nil, fmt.Errorf("list %s: %w", w.where(""), err)
		}
	}
	return names, nil
}

// up leaves the current, now empty directory for its parent and removes
// it there.
func (w *wiper) up() error {
	name := w.stack[len(w.stack)-1].name
	parent, err := unix.Openat(w.fd, "..", openDir, 0)
	if err != nil {
		return fmt.Errorf("open parent of %s: %w", w.where(""), err)
	}
	_ = unix.Close(w.fd)
	w.fd = parent
	w.stack = w.stack[:len(w.stack)-1]
	if err := sameInode(w.fd, w.dev, w.stack[len(w.stack)-1].ino); err != nil {
		return fmt.Errorf("back up to %s: %w", w.where(""), err)
	}
	if err := unix.Unlinkat(w.fd, name, unix.AT_REMOVEDIR); err != nil {
		return fmt.Errorf("remove directory %s: %w", w.where(name), err)
	}
	w.removed++
	return nil
}

// entry removes the entry name of the current directory if it is not a
// directory, else takes the directory over and goes down into it.
func (w *wiper) entry(name string) error {
	var est unix.Stat_t
	if err := unix.Fstatat(w.fd, name, &est, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("stat %s: %w", w.where(name), err)
	}
	if est.Dev != w.dev {
		return fmt.Errorf("%s is on another filesystem (a mount point)", w.where(name))
	}
	if est.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(w.fd, name, 0); err != nil {
			return fmt.Errorf("remove %s: %w", w.where(name), err)
		}
		w.removed++
		return nil
	}
	// Nothing else runs in the container (every process is gone), so
	// the entry stays the directory just seen; the inode is checked
	// once open all the same.
	if err := unix.Fchownat(w.fd, name, 0, 0, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown %s: %w", w.where(name), err)
	}
	if err := unix.Fchmodat(w.fd, name, 0o700, 0); err != nil {
		return fmt.Errorf("chmod %s: %w", w.where(name), err)
	}
	child, err := unix.Openat(w.fd, name, openDir, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", w.where(name), err)
	}
	if err := sameInode(child, w.dev, est.Ino); err != nil {
		_ = unix.Close(child)
		return fmt.Errorf("%s: %w", w.where(name), err)
	}
	_ = unix.Close(w.fd)
	w.fd = child
	w.stack = append(w.stack, wipeFrame{name: name, ino: est.Ino})
	return nil
}

// sameInode checks that fd is the expected directory.
func sameInode(fd int, dev, ino uint64) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Dev != dev || st.Ino != ino {
		return fmt.Errorf("directory changed under the reset (inode %d:%d, want %d:%d)", st.Dev, st.Ino, dev, ino)
	}
	return nil
}

// readNames reads one batch of directory entries at fd's offset, without
// "." and "..": none at the end of the directory.
func readNames(fd int, buf []byte) ([]string, error) {
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return nil, nil
		}
		_, _, names := unix.ParseDirent(buf[:n], -1, nil)
		if len(names) > 0 {
			return names, nil
		}
	}
}

// restoreRoot puts an emptied mount root back as start-up recorded it:
// empty, its xattrs (ACLs included) and inode flags, times, mode, owner.
// wipeDir left it root's, so root may change all of it; the owner comes
// last. The result is checked.
func restoreRoot(r *mountRoot) error {
	fd, err := unix.Open(r.path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer func() { _ = unix.Close(fd) }()
	if err := sameInode(fd, r.dev, r.ino); err != nil {
		return err
	}
	names, err := readNames(fd, make([]byte, 4<<10))
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	if len(names) > 0 {
		return fmt.Errorf("not empty after the wipe: %q", names[:min(len(names), 5)])
	}
	cur, err := listXattrs(r.path)
	if err != nil {
		return err
	}
	for name, val := range cur {
		want, ok := r.xattrs[name]
		switch {
		case !ok:
			if err := unix.Lremovexattr(r.path, name); err != nil {
				return fmt.Errorf("remove xattr %s: %w", name, err)
			}
		case !bytes.Equal(val, want):
			if err := unix.Lsetxattr(r.path, name, want, 0); err != nil {
				return fmt.Errorf("restore xattr %s: %w", name, err)
			}
		}
	}
	for name, want := range r.xattrs {
		if _, ok := cur[name]; !ok {
			if err := unix.Lsetxattr(r.path, name, want, 0); err != nil {
				return fmt.Errorf("restore xattr %s: %w", name, err)
			}
		}
	}
	if r.hasFlags {
		if v, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS); err != nil || v != r.flags {
			if err := unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(r.flags)); err != nil {
				return fmt.Errorf("restore inode flags %#x: %w", r.flags, err)
			}
		}
	}
	ts := []unix.Timespec{r.atime, r.mtime}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, r.path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("restore times: %w", err)
	}
	if err := unix.Chmod(r.path, r.mode); err != nil {
		return fmt.Errorf("restore mode %#o: %w", r.mode, err)
	}
	if err := unix.Lchown(r.path, r.uid, r.gid); err != nil {
		return fmt.Errorf("restore owner %d:%d: %w", r.uid, r.gid, err)
	}
	got, err := statRoot(r.path)
	if err != nil {
		return err
	}
	switch {
	case got.dev != r.dev || got.ino != r.ino:
		return errors.New("the mount root changed")
	case got.mode != r.mode || got.uid != r.uid || got.gid != r.gid:
		return fmt.Errorf("mode/owner %#o %d:%d after restore, want %#o %d:%d", got.mode, got.uid, got.gid, r.mode, r.uid, r.gid)
	case got.hasFlags != r.hasFlags || got.flags != r.flags:
		return fmt.Errorf("inode flags %#x after restore, want %#x", got.flags, r.flags)
	case !sameXattrs(got.xattrs, r.xattrs):
		return fmt.Errorf("xattrs %v after restore, want %v", slices.Sorted(maps.Keys(got.xattrs)), slices.Sorted(maps.Keys(r.xattrs)))
	}
	return nil
}

func sameXattrs(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}
