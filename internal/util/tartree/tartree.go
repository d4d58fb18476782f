// Package tartree writes a directory tree as a tar stream: the one walk
// shared by the in-sandbox agent (a download out of the sandbox) and
// toolcontext (an upload into it). It uses the standard library only,
// because the agent is built as a small static binary.
package tartree

import (
	"archive/tar"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Write adds the entries below root (not root itself) to tw, named
// relative to root with '/' separators, directories with a trailing '/'.
// Regular files, directories and symlinks are written; sockets, devices
// and fifos are skipped, there is nothing to copy. Owner names are cleared
// because they mean nothing on the other side; numeric owner ids too,
// unless keepIDs (the agent keeps them: they are the sandbox's own). ctx is
// checked between entries, so a cancelled copy stops walking. Write does
// not close tw.
func Write(ctx context.Context, tw *tar.Writer, root string, keepIDs bool) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return writeEntry(tw, p, rel, info, keepIDs)
	})
}

// writeEntry writes one entry: its header and, for a regular file, its
// content.
func writeEntry(tw *tar.Writer, p, rel string, info fs.FileInfo, keepIDs bool) error {
	link := ""
	if info.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	} else if !info.Mode().IsRegular() && !info.IsDir() {
		return nil
	}
	hdr, err := tar.FileInfoHeader(info, link)
	if err != nil {
		return err
	}
	hdr.Name = filepath.ToSlash(rel)
	if info.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", ""
	if !keepIDs {
		hdr.Uid, hdr.Gid = 0, 0
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(tw, f)
	return err
}
