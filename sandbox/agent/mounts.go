package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	path   string // mount point, unescaped
	fstype string
	rw     bool   // the per-mount options say rw
	dev    uint64 // major:minor, as in st_dev
}

// parseMountinfo reads /proc/self/mountinfo's format (proc(5)): id,
// parent id, major:minor, root, mount point, mount options, optional
// fields up to "-", then fstype, source and super options. Paths have
// space, tab, newline and backslash escaped as \ooo.
func parseMountinfo(r io.Reader) ([]mountEntry, error) {
	var out []mountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		sep := slices.Index(f, "-")
		if sep < 6 || sep+1 >= len(f) {
			return nil, fmt.Errorf("mountinfo: malformed line %q", sc.Text())
		}
		maj, min, ok := strings.Cut(f[2], ":")
		ma, err1 := strconv.ParseUint(maj, 10, 32)
		mi, err2 := strconv.ParseUint(min, 10, 32)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("mountinfo: bad device %q", f[2])
		}
		path, err := unescapeMount(f[4])
		if err != nil {
			return nil, err
		}
		out = append(out, mountEntry{
			path:   path,
			fstype: f[sep+1],
			rw:     slices.Contains(strings.Split(f[5], ","), "rw"),
			dev:    unix.Mkdev(uint32(ma), uint32(mi)),
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mountinfo: %w", err)
	}
	return out, nil
}

// unescapeMount undoes the kernel's \ooo (three octal digits) escapes.
func unescapeMount(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+4 > len(s) {
			return "", fmt.Errorf("mountinfo: bad escape in %q", s)
		}
		n, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
		if err != nil {
			return "", fmt.Errorf("mountinfo: bad escape in %q", s)
		}
		b.WriteByte(byte(n))
		i += 3
	}
	return b.String(), nil
}

// mountRoot is the start-up state of a tmpfs or mqueue mount root, which a
// reset restores.
type mountRoot struct {
	path         string
	fstype       string
	dev, ino     uint64
	mode         uint32 // permission bits with setuid, setgid, sticky
	uid, gid     int
	atime, mtime unix.Timespec
	xattrs       map[string][]byte
	flags        uint32 // FS_IOC_GETFLAGS (chattr) flags
	hasFlags     bool   // the filesystem answered FS_IOC_GETFLAGS
}

// recordMounts remembers every visible tmpfs/mqueue mount root and the
// whole mount table (for the reset's coverage check). A table that cannot
// be read leaves nothing recorded: a later reset then refuses every path.
func (s *server) recordMounts() {
	s.roots = map[string]*mountRoot{}
	s.mountTable = nil
	s.mountErr = nil
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		s.mountErr = err
		return
	}
	defer f.Close()
	mounts, err := parseMountinfo(f)
	if err != nil {
		s.mountErr = err
		return
	}
	s.mountTable = mounts
	for _, m := range mounts {
		if m.fstype != "tmpfs" && m.fstype != "mqueue" {
			continue
		}
		r, err := statRoot(m.path)
		// A mount hidden by a later one on the same or a parent path has
		// another device than what the path now shows: not a root to reset.
		if err != nil || r.dev != m.dev {
			delete(s.roots, m.path)
			continue
		}
		r.fstype = m.fstype
		s.roots[m.path] = r
	}
	s.keyBase = keyCount(s.uid)
}

// statRoot reads what a reset restores of a mount root.
func statRoot(path string) (*mountRoot, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, fmt.Errorf("%s is not a directory", path)
	}
	xa, err := listXattrs(path)
	if err != nil {
		return nil, err
	}
	r := &mountRoot{
		path: path, dev: st.Dev, ino: st.Ino, mode: st.Mode & 0o7777,
		uid: int(st.Uid), gid: int(st.Gid), atime: st.Atim, mtime: st.Mtim, xattrs: xa,
	}
	r.flags, r.hasFlags = getFlags(path)
	return r, nil
}

// listXattrs returns every extended attribute of path (not following a
// symlink) with its value; none where the filesystem has none.
func listXattrs(path string) (map[string][]byte, error) {
	out := map[string][]byte{}
	sz, err := unix.Llistxattr(path, nil)
	if errors.Is(err, unix.ENOTSUP) || sz == 0 {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
	}
	buf := make([]byte, sz+256)
	sz, err = unix.Llistxattr(path, buf)
	if err != nil {
		return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
	}
	for name := range bytes.SplitSeq(buf[:sz], []byte{0}) {
		if len(name) == 0 {
			continue
		}
		n := string(name)
		vsz, err := unix.Lgetxattr(path, n, nil)
		if err != nil {
			return nil, fmt.Errorf("xattr %s of %s: %w", n, path, err)
		}
		val := make([]byte, vsz)
		if vsz > 0 {
			if vsz, err = unix.Lgetxattr(path, n, val); err != nil {
				return nil, fmt.Errorf("xattr %s of %s: %w", n, path, err)
			}
		}
		out[n] = val[:vsz]
	}
	return out, nil
}

// getFlags reads a directory's inode flags (chattr); ok is false where
// the filesystem does not keep them.
func getFlags(path string) (uint32, bool) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	v, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		return 0, false
	}
	return v, true
}

// keyCount is the number of kernel keys uid owns (/proc/key-users), or -1
// when the file is unreadable.
func keyCount(uid int) int {
	b, err := os.ReadFile("/proc/key-users")
	if err != nil {
		return -1
	}
	return parseKeyUsers(b, uid)
}

// parseKeyUsers finds uid's nkeys in /proc/key-users ("uid: usage
// nkeys/nikeys qnkeys/maxkeys qnbytes/maxbytes"); 0 when uid has no line.
func parseKeyUsers(b []byte, uid int) int {
	want := strconv.Itoa(uid) + ":"
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != want {
			continue
		}
		n, _, _ := strings.Cut(f[2], "/")
		if v, err := strconv.Atoi(n); err == nil {
			return v
		}
	}
	return 0
}

// forbiddenReset is true for paths a reset never empties whatever the
// mount table says.
func forbiddenReset(p string) bool {
	switch p {
	case "/", "/dev", "/proc", "/sys":
		return true
	}
	return strings.HasPrefix(p, "/proc/") || strings.HasPrefix(p, "/sys/")
}

// validateResetPaths checks the request's paths: absolute, clean, distinct,
// recorded tmpfs/mqueue roots, none of the forbidden ones.
func validateResetPaths(paths []string, roots map[string]*mountRoot) ([]*mountRoot, error) {
	seen := map[string]bool{}
	out := make([]*mountRoot, 0, len(paths))
	for _, p := range paths {
		switch {
		case p == "" || !filepath.IsAbs(p):
			return nil, invalidf("reset path %q is not absolute", p)
		case strings.ContainsRune(p, 0):
			return nil, invalidf("reset path contains a NUL byte")
		case filepath.Clean(p) != p:
			return nil, invalidf("reset path %q is not clean (%q)", p, filepath.Clean(p))
		case forbiddenReset(p):
			return nil, invalidf("reset path %q is never emptied", p)
		case seen[p]:
			return nil, invalidf("reset path %q given twice", p)
		}
		r := roots[p]
		if r == nil {
			return nil, invalidf("reset path %q is not a tmpfs or mqueue mount recorded at start-up", p)
		}
		seen[p] = true
		out = append(out, r)
	}
	return out, nil
}

// checkCoverage refuses a reset that would leave writable storage behind:
// the root filesystem must be read-only, and every other read-write mount
// whose root the sandbox user (uid, gid, no supplementary groups) can
// write must be among paths. /proc and /sys are the kernel's, not storage.
// Only mount roots are checked: a writable directory deeper in a
// read-write mount the user cannot write at its root is not detected.
func checkCoverage(mounts []mountEntry, paths []string, uid, gid int, lstat func(string, *unix.Stat_t) error) error {
	if len(mounts) == 0 {
		return invalidf("reset: the mount table could not be read at start-up")
	}
	covered := map[string]bool{}
	for _, p := range paths {
		covered[p] = true
	}
	// The last entry for a path is the visible mount.
	last := map[string]mountEntry{}
	for _, m := range mounts {
		last[m.path] = m
	}
	root, ok := last["/"]
	if !ok {
		return invalidf("reset: no root filesystem in the mount table")
	}
	if root.rw {
		return invalidf("reset needs a read-only root filesystem")
	}
	keys := make([]string, 0, len(last))
	for p := range last {
		keys = append(keys, p)
	}
	slices.Sort(keys)
	for _, p := range keys {
		m := last[p]
		if !m.rw || covered[p] || p == "/proc" || p == "/sys" || strings.HasPrefix(p, "/proc/") || strings.HasPrefix(p, "/sys/") {
			continue
		}
		var st unix.Stat_t
		if err := lstat(p, &st); err != nil {
			return invalidf("reset: mount %s: %v", p, err)
		}
		if writableBy(&st, uid, gid) {
			return invalidf("reset: %s (%s) is writable by the sandbox user but not among the paths to empty", p, m.fstype)
		}
	}
	return nil
}

// writableBy applies the permission bits as the kernel does for a caller
// without capabilities.
func writableBy(st *unix.Stat_t, uid, gid int) bool {
	switch {
	case int(st.Uid) == uid:
		return st.Mode&0o200 != 0
	case int(st.Gid) == gid:
		return st.Mode&0o020 != 0
	}
	return st.Mode&0o002 != 0
}
