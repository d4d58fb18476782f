package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseMountinfo(t *testing.T) {
	const in = `22 1 254:0 / / ro,relatime master:1 - overlay overlay rw,lowerdir=/l
30 22 0:40 / /tmp rw,nosuid,nodev - tmpfs tmpfs rw,size=65536k,mode=1777
31 22 0:41 / /my\040work\134dir rw,relatime shared:7 master:2 - tmpfs tmpfs rw
32 22 0:42 / /dev/mqueue rw,nosuid,nodev,noexec,relatime - mqueue mqueue rw
33 22 0:43 /x /etc/hosts ro - ext4 /dev/vda rw
`
	got, err := parseMountinfo(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []mountEntry{
		{"/", "overlay", false, unix.Mkdev(254, 0)},
		{"/tmp", "tmpfs", true, unix.Mkdev(0, 40)},
		{`/my work\dir`, "tmpfs", true, unix.Mkdev(0, 41)},
		{"/dev/mqueue", "mqueue", true, unix.Mkdev(0, 42)},
		{"/etc/hosts", "ext4", false, unix.Mkdev(0, 43)},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	for _, bad := range []string{"1 2 0:1 / /x rw tmpfs tmpfs rw\n", "1 2 0:1 / /x\\04 rw - tmpfs t rw\n", "1 2 x / /x rw - tmpfs t rw\n"} {
		if _, err := parseMountinfo(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	// The real one parses and has a root.
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	real, err := parseMountinfo(f)
	if err != nil || !slices.ContainsFunc(real, func(m mountEntry) bool { return m.path == "/" }) {
		t.Fatalf("real mountinfo: %v %+v", err, real)
	}
}

func TestValidateResetPaths(t *testing.T) {
	roots := map[string]*mountRoot{}
	for _, p := range []string{"/tmp", "/workspace", "/dev/shm", "/dev/mqueue", "/proc/acpi", "/dev", "/"} {
		roots[p] = &mountRoot{path: p}
	}
	ok := [][]string{nil, {"/tmp"}, {"/tmp", "/workspace", "/dev/shm", "/dev/mqueue"}}
	for _, paths := range ok {
		got, err := validateResetPaths(paths, roots)
		if err != nil || len(got) != len(paths) {
			t.Errorf("%q: %v", paths, err)
		}
	}
	bad := [][]string{{""}, {"tmp"}, {"/tmp/"}, {"/tmp/../tmp"}, {"/tmp", "/tmp"}, {"/"}, {"/dev"}, {"/proc"}, {"/sys"},
		{"/proc/acpi"}, {"/sys/fs/cgroup"}, {"/var/tmp"}, {"/tmp\x00"}, {"/tmp", "/nope"}}
	for _, paths := range bad {
		_, err := validateResetPaths(paths, roots)
		var ce *codedError
		if !errors.As(err, &ce) || ce.code != CodeInvalid {
			t.Errorf("%q: %v, want invalid", paths, err)
		}
	}
}

func TestCheckCoverage(t *testing.T) {
	stats := map[string]unix.Stat_t{
		"/tmp":        {Mode: unix.S_IFDIR | 0o1777},
		"/workspace":  {Mode: unix.S_IFDIR | 0o755, Uid: 1000, Gid: 1000},
		"/dev":        {Mode: unix.S_IFDIR | 0o755},
		"/dev/shm":    {Mode: unix.S_IFDIR | 0o1777},
		"/etc/hosts":  {Mode: unix.S_IFREG | 0o644},
		"/grp":        {Mode: unix.S_IFDIR | 0o775, Gid: 1000},
		"/proc":       {Mode: unix.S_IFDIR | 0o555},
		"/proc/acpi":  {Mode: unix.S_IFDIR | 0o777},
		"/.rollout/r": {Mode: unix.S_IFDIR | 0o777},
	}
	lstat := func(p string, st *unix.Stat_t) error {
		v, ok := stats[p]
		if !ok {
			return unix.ENOENT
		}
		*st = v
		return nil
	}
	base := []mountEntry{
		{path: "/", fstype: "overlay"},
		{path: "/proc", fstype: "proc", rw: true},
		{path: "/proc/acpi", fstype: "tmpfs", rw: true},
		{path: "/dev", fstype: "tmpfs", rw: true},
		{path: "/dev/shm", fstype: "tmpfs", rw: true},
		{path: "/tmp", fstype: "tmpfs", rw: true},
		{path: "/workspace", fstype: "tmpfs", rw: true},
		{path: "/etc/hosts", fstype: "ext4", rw: true},
		{path: "/.rollout/r", fstype: "ext4"}, // read-only bind mount
	}
	all := []string{"/tmp", "/workspace", "/dev/shm"}
	if err := checkCoverage(base, all, 1000, 1000, lstat); err != nil {
		t.Fatalf("covered: %v", err)
	}
	for name, tc := range map[string]struct {
		mounts []mountEntry
		paths  []string
		want   string
	}{
		"shm left out":      {base, []string{"/tmp", "/workspace"}, "/dev/shm"},
		"workdir left out":  {base, []string{"/tmp", "/dev/shm"}, "/workspace"},
		"writable root":     {append([]mountEntry{{path: "/", fstype: "overlay", rw: true}}, base[1:]...), all, "read-only root"},
		"root remounted rw": {append(slices.Clone(base), mountEntry{path: "/", fstype: "overlay", rw: true}), all, "read-only root"},
		"group writable":    {append(slices.Clone(base), mountEntry{path: "/grp", fstype: "ext4", rw: true}), all, "/grp"},
		"no table":          {nil, all, "mount table"},
	} {
		err := checkCoverage(tc.mounts, tc.paths, 1000, 1000, lstat)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", name, err, tc.want)
		}
	}
}

func TestParseProcLists(t *testing.T) {
	ku := []byte("    0:    10 9/9 5/1000000 100/25000000\n 1000:     2 3/3 3/200 90/20000\n")
	if n := parseKeyUsers(ku, 1000); n != 3 {
		t.Errorf("key users 1000: %d", n)
	}
	if n := parseKeyUsers(ku, 1001); n != 0 {
		t.Errorf("key users 1001: %d", n)
	}
	shm := []byte("       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid\n" +
		"         0          5   600                  4096    10     0      0  1000  1000  1000  1000\n" +
		"  12345678      32769   666                  4096    10     0      0  1000  1000  1000  1000\n")
	ids, err := parseSysvipc(shm)
	if err != nil || !slices.Equal(ids, []int{5, 32769}) {
		t.Errorf("sysvipc: %v %v", ids, err)
	}
	if _, err := parseSysvipc([]byte("h\n1 x\n")); err == nil {
		t.Error("bad id accepted")
	}
}

// onAgentThread runs fn on an OS thread whose effective capabilities are
// the agent's only (CHOWN, SETUID, SETGID, KILL: no DAC_OVERRIDE, no
// FOWNER). Capabilities are per thread; this one is never unlocked, so it
// ends with its goroutine.
func onAgentThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("capget: %w", err)
			return
		}
		data[0].Effective &= 1<<unix.CAP_CHOWN | 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID | 1<<unix.CAP_KILL
		data[1].Effective = 0
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("capset: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// makeDeep creates a chain of depth directories named d under dir, with
// fd-relative calls (the path is longer than PATH_MAX), and a file at the
// bottom.
func makeDeep(t *testing.T, dir string, depth int) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	for range depth {
		must(t, unix.Mkdirat(fd, "d", 0o755))
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(t, err)
		_ = unix.Fchownat(fd, "d", 1000, 1000, 0)
		_ = unix.Close(fd)
		fd = next
	}
	f, err := unix.Openat(fd, "bottom", unix.O_CREAT|unix.O_WRONLY, 0o600)
	must(t, err)
	_ = unix.Close(f)
	_ = unix.Fchmod(fd, 0)
	_ = unix.Close(fd)
}

// The wipe empties a tree built to resist it, without DAC_OVERRIDE or
// FOWNER, never following a symlink, and restoreRoot puts the root back.
func TestWipeDirHostile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_CHOWN)")
	}
	base := t.TempDir()
	baseFI, err := os.Stat(base)
	must(t, err)
	outside := filepath.Join(base, "outside")
	must(t, os.MkdirAll(filepath.Join(outside, "dir"), 0o755))
	must(t, os.WriteFile(filepath.Join(outside, "target"), []byte("keep"), 0o644))
	must(t, os.WriteFile(filepath.Join(outside, "dir", "inner"), []byte("keep"), 0o644))
	root := filepath.Join(base, "root")
	must(t, os.Mkdir(root, 0o755))
	must(t, os.Chown(root, 1000, 1000))
	old := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	must(t, os.Chtimes(root, old, old))
	rec, err := statRoot(root)
	must(t, err)

	// The rollout's mess: nested mode-000 directories of another uid, a
	// sticky world-writable directory with other users' files, symlinks
	// out of the tree, a FIFO, a socket, hard links, a tree deeper than
	// PATH_MAX, an xattr and a new mode on the root itself.
	p := func(parts ...string) string { return filepath.Join(append([]string{root}, parts...)...) }
	must(t, os.MkdirAll(p("a", "b", "c"), 0o755))
	must(t, os.WriteFile(p("a", "b", "c", "answer"), []byte("42"), 0o600))
	must(t, os.Link(p("a", "b", "c", "answer"), p("hardlink")))
	for _, d := range []string{p("a", "b", "c"), p("a", "b"), p("a")} {
		must(t, os.Chown(d, 1000, 1000))
		must(t, os.Chmod(d, 0))
	}
	must(t, os.Mkdir(p("sticky"), 0o777))
	must(t, os.Chmod(p("sticky"), 0o1777))
	for i, uid := range []int{1000, 1001, 0} {
		f := p("sticky", "f"+strconv.Itoa(i))
		must(t, os.WriteFile(f, []byte("x"), 0o600))
		must(t, os.Chown(f, uid, uid))
		must(t, os.Chmod(f, 0))
	}
	must(t, os.Symlink(filepath.Join(outside, "target"), p("sticky", "link")))
	must(t, os.Symlink(filepath.Join(outside, "dir"), p("dirlink")))
	must(t, os.Symlink("/", p("rootlink")))
	must(t, unix.Mkfifo(p("fifo"), 0o600))
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	must(t, err)
	must(t, unix.Bind(sock, &unix.SockaddrUnix{Name: p("sock")}))
	_ = unix.Close(sock)
	must(t, os.Mkdir(p("deep"), 0o755))
	makeDeep(t, p("deep"), 2100) // 2100 × "/d" > PATH_MAX (4096)
	must(t, os.Chown(p("deep"), 1001, 1001))
	must(t, os.Chmod(p("deep"), 0o500))
	must(t, os.Chmod(root, 0o700))
	xattr := unix.Lsetxattr(root, "user.note", []byte("the answer is 42"), 0)
	if xattr != nil {
		t.Logf("no user xattr on this filesystem: %v", xattr)
	}

	var removed int
	err = onAgentThread(func() error {
		// The thread really lacks DAC_OVERRIDE: a mode-000 directory of
		// another user is closed to it.
		if _, err := os.ReadDir(p("a")); !errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("the test thread can read a mode-000 directory (%v): capabilities not dropped", err)
		}
		n, err := wipeDir(context.Background(), root)
		removed = n
		if err != nil {
			return fmt.Errorf("wipe: %w", err)
		}
		return restoreRoot(rec)
	})
	must(t, err)
	// a b c answer hardlink sticky f0 f1 f2 link dirlink rootlink fifo
	// sock deep + 2100 d + bottom
	if want := 15 + 2100 + 1; removed != want {
		t.Errorf("removed %d entries, want %d", removed, want)
	}
	if ents, err := os.ReadDir(root); err != nil || len(ents) != 0 {
		t.Fatalf("root after the wipe: %v %v", ents, err)
	}
	got, err := statRoot(root)
	must(t, err)
	if got.mode != rec.mode || got.uid != 1000 || got.gid != 1000 || !tsEqual(got.mtime, rec.mtime) ||
		!sameXattrs(got.xattrs, rec.xattrs) || got.ino != rec.ino {
		t.Fatalf("root not restored: %+v, want %+v", got, rec)
	}
	for _, f := range []string{filepath.Join(outside, "target"), filepath.Join(outside, "dir", "inner")} {
		if b, err := os.ReadFile(f); err != nil || string(b) != "keep" {
			t.Errorf("%s, outside the tree, was touched: %q %v", f, b, err)
		}
	}
	if fi, err := os.Stat(base); err != nil || fi.Mode() != baseFI.Mode() {
		t.Errorf("the parent of the root changed: %v %v", fi.Mode(), err)
	}
}

func tsEqual(a, b unix.Timespec) bool { return a.Sec == b.Sec && a.Nsec == b.Nsec }

// A cancelled context stops a large wipe with an error, not a hang or a
// success.
func TestWipeDirCancelled(t *testing.T) {
	root := t.TempDir()
	for i := range 600 {
		must(t, os.WriteFile(filepath.Join(root, strconv.Itoa(i)), nil, 0o600))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n, err := wipeDir(ctx, root)
	if err == nil || !errors.Is(err, context.Canceled) || n >= 600 {
		t.Fatalf("wipe with a cancelled context: %d removed, %v", n, err)
	}
	if _, err := wipeDir(context.Background(), filepath.Join(root, "0")); err == nil {
		t.Fatal("wiping a file succeeded")
	}
}

// makeIPC creates one SysV shm segment, semaphore set and message queue.
func makeIPC() error {
	if _, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600); err != nil {
		return fmt.Errorf("shmget: %w", err)
	}
	if _, _, e := unix.Syscall(unix.SYS_SEMGET, unix.IPC_PRIVATE, 1, unix.IPC_CREAT|0o600); e != 0 {
		return fmt.Errorf("semget: %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_MSGGET, unix.IPC_PRIVATE, unix.IPC_CREAT|0o600, 0); e != 0 {
		return fmt.Errorf("msgget: %w", e)
	}
	return nil
}

// cleanIPC removes the objects of the namespace through the -ipc-clean
// child, as root and as the sandbox user; an object the user may not
// remove fails the clean. It runs in a new IPC namespace (on a thread
// that is then discarded), so the host's objects are never touched.
func TestCleanIPC(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (unshare, setuid)")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in its own IPC namespace
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWIPC); err != nil {
				return fmt.Errorf("unshare: %w", err)
			}
			count := func() int {
				_, n, err := listIPC()
				if err != nil {
					return -1
				}
				return n
			}
			s := newServer(&bytes.Buffer{})
			ctx := context.Background()
			if err := makeIPC(); err != nil {
				return err
			}
			if n := count(); n != 3 {
				return fmt.Errorf("%d objects after creating 3", n)
			}
			if n, err := s.cleanIPC(ctx); err != nil || n != 3 || count() != 0 {
				return fmt.Errorf("as root: removed %d, %v, %d left", n, err, count())
			}
			s.uid, s.gid = 1000, 1000
			if err := s.asUser(makeIPC); err != nil {
				return err
			}
			if n, err := s.cleanIPC(ctx); err != nil || n != 3 || count() != 0 {
				return fmt.Errorf("as the user: removed %d, %v, %d left", n, err, count())
			}
			if err := makeIPC(); err != nil { // root's: not the user's to remove
				return err
			}
			_, err := s.cleanIPC(ctx)
			var ce *codedError
			if !errors.As(err, &ce) || ce.code != CodeFailed || !strings.Contains(err.Error(), "left") || count() != 3 {
				return fmt.Errorf("root's objects with the user's clean: %v (%d left)", err, count())
			}
			s.uid, s.gid = 0, 0
			if n, err := s.cleanIPC(ctx); err != nil || n != 3 || count() != 0 {
				return fmt.Errorf("root's clean of its objects: removed %d, %v, %d left", n, err, count())
			}
			return nil
		}()
	}()
	must(t, <-errc)
}

// e2eRoleEnv selects the part the test binary plays in TestResetE2E:
// "init" (pid 1 of new pid, mount and IPC namespaces; see e2eInit) or
// "agent" (the server under test, a child of init).
const (
	e2eRoleEnv = "ROLLOUT_AGENT_RESET_E2E"
	e2eDirEnv  = "ROLLOUT_AGENT_RESET_DIR"
)

// TestResetE2E drives a reset through the protocol in a stand-in for a
// container: new pid, mount and IPC namespaces, tmpfs and mqueue mounts,
// a reaping init as pid 1, and the agent with its four capabilities under
// no-new-privileges. The reset kills for real there, so it never runs in
// the host's pid namespace.
func TestResetE2E(t *testing.T) {
	if os.Getenv(e2eRoleEnv) == "agent" {
		resetScenario(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces, mounts)")
	}
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		must(t, os.Chmod(d, 0o755)) // the sandbox user reaches the mounts
	}
	for _, d := range []string{"tmp", "work", "shm", "mq"} {
		must(t, os.Mkdir(filepath.Join(dir, d), 0o755))
	}
	must(t, os.WriteFile(filepath.Join(dir, "outside"), []byte("keep"), 0o644))
	cmd := exec.Command("/proc/self/exe", "-test.run=^TestResetE2E$", "-test.v", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), e2eRoleEnv+"=init", e2eDirEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC,
		Pdeathsig:  syscall.SIGKILL,
	}
	out, err := cmd.CombinedOutput()
	t.Logf("namespaced run:\n%s", out)
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestResetE2E")) {
		t.Fatalf("namespaced run failed: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "outside")); err != nil || string(b) != "keep" {
		t.Fatalf("a file outside the mounts was touched: %q %v", b, err)
	}
}

// e2eInit is pid 1 of TestResetE2E's namespaces: it mounts /proc and the
// sandbox's tmpfs/mqueue mounts, keeps only the agent's capabilities in the
// bounding set, sets no-new-privileges, starts the agent role and reaps
// every process until the agent role exits.
func e2eInit() int {
	runtime.LockOSThread() // the bounding set is per thread; the child is forked from this one
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "e2e init: "+format+"\n", a...)
		return 1
	}
	dir := os.Getenv(e2eDirEnv)
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fail("make mounts private: %v", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fail("mount proc: %v", err)
	}
	for _, m := range []struct{ dir, fstype, opts string }{
		{"tmp", "tmpfs", "mode=1777,size=64m"},
		{"work", "tmpfs", "mode=755,size=64m"},
		{"shm", "tmpfs", "mode=1777,size=16m"},
		{"mq", "mqueue", ""},
	} {
		if err := unix.Mount(m.fstype, filepath.Join(dir, m.dir), m.fstype, unix.MS_NOSUID|unix.MS_NODEV, m.opts); err != nil {
			return fail("mount %s: %v", m.dir, err)
		}
	}
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return fail("%v", err)
	}
	last, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fail("cap_last_cap: %v", err)
	}
	for c := 0; c <= last; c++ {
		switch c {
		case unix.CAP_CHOWN, unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_KILL:
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fail("drop capability %d: %v", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fail("no_new_privs: %v", err)
	}
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Env = append(os.Environ(), e2eRoleEnv+"=agent")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return fail("start the agent role: %v", err)
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fail("wait: %v", err)
		}
		if pid == cmd.Process.Pid {
			if ws.Exited() {
				return ws.ExitStatus()
			}
			return fail("agent role: %v", ws)
		}
	}
}

// resetScenario is the agent role of TestResetE2E.
func resetScenario(t *testing.T) {
	dir := os.Getenv(e2eDirEnv)
	tmp, work, shm, mq := filepath.Join(dir, "tmp"), filepath.Join(dir, "work"), filepath.Join(dir, "shm"), filepath.Join(dir, "mq")
	status, err := os.ReadFile("/proc/self/status")
	must(t, err)
	if !bytes.Contains(status, []byte("CapEff:\t00000000000000e1")) || os.Getppid() != 1 {
		t.Fatalf("not in the stand-in container (pid %d):\n%s", os.Getpid(), status)
	}
	var sv *server
	c := startServerWith(t, func(s *server) error {
		sv = s
		// The host's own mounts (a writable root, its /dev/shm) are
		// visible here: the coverage check is TestCheckCoverage's.
		s.checkMounts = false
		return s.setup("1000", "", false, work)
	})
	for _, p := range []string{tmp, work, shm, mq} {
		if sv.roots[p] == nil {
			t.Fatalf("%s not recorded as a mount root: %v", p, sv.mountErr)
		}
	}
	if r := sv.roots[work]; r.uid != 1000 || r.mode != 0o755 {
		t.Fatalf("workdir recorded as %d %#o, want the user's 0755", r.uid, r.mode)
	}
	run := func(spec ExecSpec) *ExecResult {
		t.Helper()
		_, resp := c.call(Request{Op: OpExec, Exec: &spec}, nil)
		if resp.Err != "" || resp.Exec == nil || resp.Exec.ExitCode != 0 {
			t.Fatalf("%q: %+v", spec.Command, resp)
		}
		return resp.Exec
	}
	// The session: a cwd and an exported variable.
	run(ExecSpec{Command: "mkdir sub && cd sub && export SECRET=42", Shell: true})
	if got := run(ExecSpec{Command: `echo "$PWD $SECRET"`, Shell: true}); string(got.Stdout) != filepath.Join(work, "sub")+" 42\n" {
		t.Fatalf("session: %q", got.Stdout)
	}
	// Files the next rollout must not find, made hard to remove.
	run(ExecSpec{Command: `set -e
cd "$W"
mkdir -p a/b/c && echo 42 > a/b/c/answer && chmod 000 a/b/c a/b a
ln -s "$O" link && ln -s / rootlink && mkfifo fifo && echo h > h1 && ln h1 h2
mkdir deep && cd deep && i=0 && while [ $i -lt 200 ]; do mkdir d && cd d; i=$((i+1)); done && echo bottom > f && chmod 0 .
cd "$W" && chmod 700 "$W"
mkdir "$T/sticky" && chmod 1777 "$T/sticky" && echo s > "$T/sticky/s" && chmod 0 "$T/sticky/s" && ln -s "$O" "$T/out"
echo y > "$S/y"
: > "$M/q1"
test -e "$M/q1"`, Env: map[string]string{"W": work, "T": tmp, "S": shm, "M": mq, "O": filepath.Join(dir, "outside")}})
	// Processes: a background one, an orphan in its own session, and a
	// foreground command still running when the reset comes.
	if _, resp := c.call(Request{Op: OpStart, Exec: &ExecSpec{Argv: []string{"sleep", "1000"}}}, nil); resp.Proc == nil {
		t.Fatalf("start: %+v", resp)
	}
	run(ExecSpec{Command: "setsid sleep 1000 >/dev/null 2>&1 </dev/null &"})
	c.seq++
	b, _ := json.Marshal(Request{Op: OpExec, Exec: &ExecSpec{Argv: []string{"sleep", "1000"}}})
	must(t, WriteFrame(c.w, FrameRequest, c.seq, b))
	must(t, sv.asUser(makeIPC))
	// The foreground sleep starts asynchronously: wait until it runs.
	for i := 0; ; i++ {
		pids, err := otherPIDs()
		if err == nil && len(pids) >= 3 {
			break
		}
		if i == 500 {
			t.Fatalf("processes before the reset: %v %v", pids, err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Refused, nothing done.
	for _, paths := range [][]string{{"/"}, {dir}, {"tmp"}, {tmp + "/"}, {"/proc/sys"}} {
		if _, resp := c.call(Request{Op: OpReset, Paths: paths}, nil); resp.Code != CodeInvalid {
			t.Errorf("reset %q: %+v", paths, resp)
		}
	}
	// The coverage check is on in a real agent: the writable root here
	// (and the host's other mounts) refuse the reset before anything is
	// done. Set between calls: the handlers of earlier calls have returned.
	sv.checkMounts = true
	if _, resp := c.call(Request{Op: OpReset, Paths: []string{tmp, work, shm, mq}}, nil); resp.Code != CodeInvalid || !strings.Contains(resp.Err, "read-only root") {
		t.Errorf("reset on a writable root: %+v", resp)
	}
	sv.checkMounts = false
	if _, n, _ := listIPC(); n != 3 {
		t.Fatalf("a refused reset changed something: %d IPC objects", n)
	}
	if _, resp := c.call(Request{Op: OpList}, nil); len(resp.Procs) != 1 {
		t.Fatalf("a refused reset changed something: processes %+v", resp.Procs)
	}

	_, resp := c.call(Request{Op: OpReset, Paths: []string{tmp, work, shm, mq}}, nil)
	if resp.Err != "" || resp.Reset == nil {
		t.Fatalf("reset: %+v", resp)
	}
	r := resp.Reset
	t.Logf("reset: %+v", *r)
	if r.Killed < 2 || r.IPC != 3 || r.Removed < 200+15 || r.DurationNS <= 0 {
		t.Errorf("counts: %+v", *r)
	}
	if pids, err := otherPIDs(); err != nil || len(pids) != 0 {
		t.Errorf("processes after the reset: %v %v", pids, err)
	}
	if _, n, err := listIPC(); err != nil || n != 0 {
		t.Errorf("IPC objects after the reset: %d %v", n, err)
	}
	for _, p := range []string{tmp, work, shm, mq} {
		ents, err := os.ReadDir(p)
		if err != nil || len(ents) != 0 {
			t.Errorf("%s after the reset: %v %v", p, ents, err)
		}
		got, err := statRoot(p)
		want := sv.roots[p]
		if err != nil || got.mode != want.mode || got.uid != want.uid || got.gid != want.gid || !tsEqual(got.mtime, want.mtime) {
			t.Errorf("%s after the reset: %+v %v, want %+v", p, got, err, want)
		}
	}
	// As new: no background process, a fresh session, commands work.
	if _, resp := c.call(Request{Op: OpList}, nil); len(resp.Procs) != 0 {
		t.Errorf("processes listed after the reset: %+v", resp.Procs)
	}
	if got := run(ExecSpec{Command: `echo "$PWD [$SECRET]"; id -u; touch f`, Shell: true}); string(got.Stdout) != work+" []\n1000\n" {
		t.Errorf("session after the reset: %q %q", got.Stdout, got.Stderr)
	}
	// A second reset of a used container works the same.
	if _, resp := c.call(Request{Op: OpReset, Paths: []string{tmp, work, shm, mq}}, nil); resp.Err != "" || resp.Reset.Removed != 1 {
		t.Fatalf("second reset: %+v", resp)
	}
}

// While a reset runs, every new request is refused (nothing may start
// between its kill and its wipe).
func TestRequestsRefusedDuringReset(t *testing.T) {
	var sv *server
	dir := t.TempDir()
	c := startServerWith(t, func(s *server) error { sv = s; return s.setup("", "", false, dir) })
	sv.resetting.Store(true)
	if _, resp := c.call(Request{Op: OpPing}, nil); resp.Code != CodeFailed || !strings.Contains(resp.Err, "being reset") {
		t.Fatalf("ping during a reset: %+v", resp)
	}
	sv.resetting.Store(false)
	if _, resp := c.call(Request{Op: OpPing}, nil); resp.Err != "" {
		t.Fatalf("ping after: %+v", resp)
	}
}
