package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"time"
)

// userLayer is the "small build step" applied to every base rootfs: a
// non-root user and a workspace it owns. It is done by rewriting the rootfs
// tar before import rather than by a RUN step, so it needs no shell or
// useradd in the image (busybox has neither in a usable form) and no
// container has to run during the build.
type userLayer struct {
	User      string
	UID, GID  int
	Home      string
	Shell     string
	Workspace string
}

// spec is the canonical text of the layer, part of the recipe hash.
func (l userLayer) spec() string {
	return fmt.Sprintf("user=%s uid=%d gid=%d home=%s shell=%s workspace=%s", l.User, l.UID, l.GID, l.Home, l.Shell, l.Workspace)
}

// epoch is the mtime of every entry the layer adds, so the same input gives
// the same tar.
var epoch = time.Unix(1700000000, 0).UTC()

const maxAccountFile = 1 << 20

// addUser copies the rootfs tar from r to w, appending the layer's user to
// etc/passwd and etc/group (and etc/shadow, etc/gshadow when present) and
// adding the home and workspace directories owned by the user.
func addUser(r io.Reader, w io.Writer, l userLayer, prune []pruneRule) error {
	tr := tar.NewReader(r)
	dropped := map[string]bool{}
	tw := tar.NewWriter(w)
	seen := map[string]bool{}
	prefix := "" // "./" when the input uses it, so added entries match
	first := true
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// GNU tar pads the archive to its record size after the end
			// marker; read it so the producer does not see a closed pipe.
			if _, err := io.Copy(io.Discard, r); err != nil {
				return fmt.Errorf("read rootfs tar padding: %w", err)
			}
			break
		}
		if err != nil {
			return fmt.Errorf("read rootfs tar: %w", err)
		}
		if first {
			if strings.HasPrefix(hdr.Name, "./") {
				prefix = "./"
			}
			first = false
		}
		name := cleanName(hdr.Name)
		if pruned(prune, name, hdr.Typeflag == tar.TypeDir) {
			dropped[name] = true
			continue
		}
		if hdr.Typeflag == tar.TypeLink && dropped[cleanName(hdr.Linkname)] {
			return fmt.Errorf("rootfs entry %s is a hard link to pruned %s: narrow the prune rules", hdr.Name, hdr.Linkname)
		}
		seen[name] = true
		edit := accountEdit(name, l)
		if edit == nil || hdr.Typeflag != tar.TypeReg {
			if err := tw.WriteHeader(hdr); err != nil {
				return fmt.Errorf("write rootfs tar %s: %w", hdr.Name, err)
			}
			if _, err := io.Copy(tw, tr); err != nil {
				return fmt.Errorf("copy rootfs tar %s: %w", hdr.Name, err)
			}
			continue
		}
		old, err := io.ReadAll(io.LimitReader(tr, maxAccountFile+1))
		if err != nil {
			return fmt.Errorf("read rootfs %s: %w", name, err)
		}
		if len(old) > maxAccountFile {
			return fmt.Errorf("rootfs %s is larger than %d bytes", name, maxAccountFile)
		}
		data, err := edit(old)
		if err != nil {
			return fmt.Errorf("add user %s to %s: %w", l.User, name, err)
		}
		h := *hdr
		h.Size = int64(len(data))
		if err := tw.WriteHeader(&h); err != nil {
			return fmt.Errorf("write rootfs tar %s: %w", hdr.Name, err)
		}
		if _, err := tw.Write(data); err != nil {
			return fmt.Errorf("write rootfs tar %s: %w", hdr.Name, err)
		}
	}
	for _, must := range []string{"etc/passwd", "etc/group"} {
		if !seen[must] {
			return fmt.Errorf("rootfs has no /%s: cannot add user %s", must, l.User)
		}
	}
	for _, dir := range []string{l.Home, l.Workspace} {
		rel := cleanName(dir)
		// Parents first; a tar may list a directory only implicitly.
		var parents []string
		for p := path.Dir(rel); p != "." && p != "/" && !seen[p]; p = path.Dir(p) {
			parents = append([]string{p}, parents...)
		}
		for _, p := range parents {
			if err := writeDir(tw, prefix+p+"/", 0, 0, 0o755); err != nil {
				return err
			}
			seen[p] = true
		}
		// Written even when the rootfs has it: the later entry wins on
		// import, so ownership is always the user's.
		if err := writeDir(tw, prefix+rel+"/", l.UID, l.GID, 0o755); err != nil {
			return err
		}
		seen[rel] = true
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("finish rootfs tar: %w", err)
	}
	return nil
}

// docsPrune drops documentation, man pages, lintian overrides and
// translations: nothing in a sandbox, an engine or a lab node reads them.
var docsPrune = []pruneRule{
	{Dir: "usr/share/doc", Keep: []string{"usr/share/doc/*/copyright"}},
	{Dir: "usr/share/man"},
	{Dir: "usr/share/info"},
	{Dir: "usr/share/lintian"},
	{Dir: "usr/share/locale", Keep: []string{"usr/share/locale/locale.alias"}},
}

// pruneRule drops what lies below Dir (the directory itself stays), except
// paths matching one of Keep (path.Match patterns, relative to the root).
type pruneRule struct {
	Dir  string
	Keep []string
}

func (p pruneRule) String() string { return p.Dir + "/** except " + strings.Join(p.Keep, ",") }

func pruned(rules []pruneRule, name string, isDir bool) bool {
	for _, r := range rules {
		if !strings.HasPrefix(name, r.Dir+"/") {
			continue
		}
		for _, k := range r.Keep {
			if ok, _ := path.Match(k, name); ok {
				return false
			}
			// Keep the directories leading to a kept file.
			if isDir {
				if ok, _ := path.Match(path.Dir(k), name); ok {
					return false
				}
			}
		}
		return true
	}
	return false
}

func writeDir(tw *tar.Writer, name string, uid, gid int, mode int64) error {
	err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: gid,
		ModTime: epoch, Format: tar.FormatPAX,
	})
	if err != nil {
		return fmt.Errorf("write rootfs tar %s: %w", name, err)
	}
	return nil
}

// cleanName turns "./etc/passwd", "/etc/passwd" and "etc/passwd/" into
// "etc/passwd".
func cleanName(name string) string {
	n := path.Clean("/" + name)
	return strings.TrimPrefix(n, "/")
}

// accountEdit returns how to rewrite an account database, or nil when name
// is not one.
func accountEdit(name string, l userLayer) func([]byte) ([]byte, error) {
	uid, gid := strconv.Itoa(l.UID), strconv.Itoa(l.GID)
	switch name {
	case "etc/passwd":
		return func(b []byte) ([]byte, error) {
			return addEntry(b, l.User, 2, uid, fmt.Sprintf("%s:x:%d:%d::%s:%s", l.User, l.UID, l.GID, l.Home, l.Shell))
		}
	case "etc/group":
		return func(b []byte) ([]byte, error) {
			return addEntry(b, l.User, 2, gid, fmt.Sprintf("%s:x:%d:", l.User, l.GID))
		}
	case "etc/shadow":
		// "!" locks the password: the user exists only to drop root.
		return func(b []byte) ([]byte, error) { return addEntry(b, l.User, -1, "", l.User+":!:19000:0:99999:7:::") }
	case "etc/gshadow":
		return func(b []byte) ([]byte, error) { return addEntry(b, l.User, -1, "", l.User+":!::") }
	}
	return nil
}

// addEntry appends line to a colon-separated account file. An entry with the
// same name and id is kept as is; a clash on either is an error, because
// the sandbox relies on uid 1000 being `agent`. idField < 0 skips the id check.
func addEntry(data []byte, name string, idField int, id, line string) ([]byte, error) {
	for _, ln := range strings.Split(string(data), "\n") {
		f := strings.Split(ln, ":")
		if len(f) < 2 {
			continue
		}
		sameName := f[0] == name
		sameID := idField >= 0 && len(f) > idField && f[idField] == id
		switch {
		case sameName && (idField < 0 || sameID):
			return data, nil
		case sameName:
			return nil, fmt.Errorf("%q already exists with id %s, want %s", name, f[idField], id)
		case sameID:
			return nil, fmt.Errorf("id %s already belongs to %q", id, f[0])
		}
	}
	var b bytes.Buffer
	b.Write(data)
	if len(data) > 0 && data[len(data)-1] != '\n' {
		b.WriteByte('\n')
	}
	b.WriteString(line)
	b.WriteByte('\n')
	return b.Bytes(), nil
}
