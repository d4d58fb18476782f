package tartree

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "sub"), 0o755))
	must(os.WriteFile(filepath.Join(root, "sub", "a.txt"), []byte("hello"), 0o640))
	must(os.Symlink("sub/a.txt", filepath.Join(root, "link")))
	if l, err := net.Listen("unix", filepath.Join(root, "sock")); err == nil { // skipped: nothing to copy
		defer l.Close()
	}
	for _, keepIDs := range []bool{false, true} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		must(Write(context.Background(), tw, root, keepIDs))
		must(tw.Close())
		got := map[string]*tar.Header{}
		body := map[string]string{}
		tr := tar.NewReader(&buf)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			must(err)
			got[h.Name] = h
			b, _ := io.ReadAll(tr)
			body[h.Name] = string(b)
		}
		if len(got) != 3 || got["sub/"] == nil || body["sub/a.txt"] != "hello" || got["sub/a.txt"].Mode&0o777 != 0o640 || got["link"].Linkname != "sub/a.txt" {
			t.Fatalf("keepIDs %v: entries %v", keepIDs, got)
		}
		for name, h := range got {
			if h.Uname != "" || h.Gname != "" || (!keepIDs && (h.Uid != 0 || h.Gid != 0)) || (keepIDs && h.Uid != os.Getuid()) {
				t.Errorf("keepIDs %v: %s owner %q/%q %d/%d", keepIDs, name, h.Uname, h.Gname, h.Uid, h.Gid)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Write(ctx, tar.NewWriter(io.Discard), root, false); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled walk: %v", err)
	}
}
