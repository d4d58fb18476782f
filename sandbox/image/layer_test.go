package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

type entry struct {
	name     string
	typ      byte
	data     string
	uid, gid int
	mode     int64
	link     string
}

func makeTar(t *testing.T, entries []entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.data)), Linkname: e.link}
		if e.typ == tar.TypeDir || e.typ == tar.TypeSymlink {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(e.data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func readTar(t *testing.T, data []byte) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out[h.Name] = entry{name: h.Name, typ: h.Typeflag, data: string(b), uid: h.Uid, gid: h.Gid, mode: h.Mode, link: h.Linkname}
	}
}

func TestAddUser(t *testing.T) {
	l := agentUser
	tests := []struct {
		name    string
		in      []entry
		want    map[string]string // name → content of account files after
		wantErr string
	}{
		{
			name: "debian layout with ./ prefix and shadow",
			in: []entry{
				{name: "./", typ: tar.TypeDir},
				{name: "./etc/", typ: tar.TypeDir},
				{name: "./etc/passwd", typ: tar.TypeReg, data: "root:x:0:0:root:/root:/bin/bash\n"},
				{name: "./etc/group", typ: tar.TypeReg, data: "root:x:0:\n"},
				{name: "./etc/shadow", typ: tar.TypeReg, data: "root:*:19000:0:99999:7:::"},
				{name: "./home/", typ: tar.TypeDir},
			},
			want: map[string]string{
				"./etc/passwd": "root:x:0:0:root:/root:/bin/bash\nagent:x:1000:1000::/home/agent:/bin/sh\n",
				"./etc/group":  "root:x:0:\nagent:x:1000:\n",
				"./etc/shadow": "root:*:19000:0:99999:7:::\nagent:!:19000:0:99999:7:::\n",
			},
		},
		{
			name: "user already there is kept",
			in: []entry{
				{name: "etc/passwd", typ: tar.TypeReg, data: "agent:x:1000:1000::/home/agent:/bin/sh\n"},
				{name: "etc/group", typ: tar.TypeReg, data: "agent:x:1000:\n"},
			},
			want: map[string]string{
				"etc/passwd": "agent:x:1000:1000::/home/agent:/bin/sh\n",
				"etc/group":  "agent:x:1000:\n",
			},
		},
		{
			name: "uid taken by another user",
			in: []entry{
				{name: "etc/passwd", typ: tar.TypeReg, data: "ubuntu:x:1000:1000::/home/ubuntu:/bin/sh\n"},
				{name: "etc/group", typ: tar.TypeReg, data: ""},
			},
			wantErr: `id 1000 already belongs to "ubuntu"`,
		},
		{
			name: "name taken with another uid",
			in: []entry{
				{name: "etc/passwd", typ: tar.TypeReg, data: "agent:x:1001:1001::/:/bin/sh\n"},
				{name: "etc/group", typ: tar.TypeReg, data: ""},
			},
			wantErr: `"agent" already exists with id 1001`,
		},
		{
			name:    "no passwd",
			in:      []entry{{name: "etc/group", typ: tar.TypeReg, data: "root:x:0:\n"}},
			wantErr: "rootfs has no /etc/passwd",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := addUser(bytes.NewReader(makeTar(t, tt.in)), &out, l, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := readTar(t, out.Bytes())
			for name, want := range tt.want {
				if diff := cmp.Diff(want, got[name].data); diff != "" {
					t.Errorf("%s (-want +got):\n%s", name, diff)
				}
			}
			prefix := ""
			if strings.HasPrefix(tt.in[0].name, "./") {
				prefix = "./"
			}
			for _, dir := range []string{"home/agent/", "workspace/"} {
				e, ok := got[prefix+dir]
				if !ok {
					t.Fatalf("%s%s not added; have %v", prefix, dir, keys(got))
				}
				if e.typ != tar.TypeDir || e.uid != 1000 || e.gid != 1000 {
					t.Errorf("%s: type %c uid %d gid %d, want dir owned by 1000:1000", dir, e.typ, e.uid, e.gid)
				}
			}
		})
	}
}

func keys(m map[string]entry) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// GNU tar pads archives past the end marker; the producer must be able to
// write all of it (mmdebstrap failed with EOF before this was handled).
func TestAddUserDrainsPadding(t *testing.T) {
	data := makeTar(t, []entry{
		{name: "etc/passwd", typ: tar.TypeReg, data: "root:x:0:0::/root:/bin/sh\n"},
		{name: "etc/group", typ: tar.TypeReg, data: "root:x:0:\n"},
	})
	data = append(data, make([]byte, 10240)...)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := pw.Write(data)
		pw.Close()
		done <- err
	}()
	if err := addUser(pr, io.Discard, agentUser, nil); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	if err := <-done; err != nil {
		t.Fatalf("producer got %v; padding was not drained", err)
	}
}

func TestHostMirrors(t *testing.T) {
	got := hostMirrors("testdata/apt")
	want := map[string]string{
		"bookworm":          "http://mirror.example.org/debian",
		"bookworm-security": "http://security.example.org/debian-security",
		"bookworm-updates":  "http://updates.example.org/debian",
		"trixie":            "http://updates.example.org/debian",
		"nodistro":          "https://deb.nodesource.com/node_20.x",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("mirrors (-want +got):\n%s", diff)
	}
	if got := hostMirrors("testdata/does-not-exist"); len(got) != 0 {
		t.Errorf("missing dir: got %v", got)
	}
}

func TestBookwormSources(t *testing.T) {
	src := bookworm.sources()
	if len(src) != 3 {
		t.Fatalf("sources = %v", src)
	}
	for i, suite := range []string{"bookworm", "bookworm-updates", "bookworm-security"} {
		f := strings.Fields(src[i])
		if len(f) != 4 || f[0] != "deb" || f[2] != suite || f[3] != "main" {
			t.Errorf("source %d = %q", i, src[i])
		}
	}
}

func TestWriteBusyboxTree(t *testing.T) {
	var b bytes.Buffer
	if err := writeBusyboxTree(&b, []byte("\x7fELF fake"), []string{"usr/bin/env", "bin/busybox", "sbin/ifconfig", "bin/ls", "../escape", "opt/x/tool"}); err != nil {
		t.Fatal(err)
	}
	got := readTar(t, b.Bytes())
	for name, want := range map[string]struct {
		typ  byte
		mode int64
		link string
	}{
		"bin/busybox":   {tar.TypeReg, 0o755, ""},
		"bin/sh":        {tar.TypeSymlink, 0o777, "/bin/busybox"},
		"bin/ls":        {tar.TypeSymlink, 0o777, "/bin/busybox"},
		"usr/bin/env":   {tar.TypeSymlink, 0o777, "/bin/busybox"},
		"opt/x/tool":    {tar.TypeSymlink, 0o777, "/bin/busybox"},
		"opt/x/":        {tar.TypeDir, 0o755, ""},
		"tmp/":          {tar.TypeDir, 0o1777, ""},
		"etc/passwd":    {tar.TypeReg, 0o644, ""},
		"etc/group":     {tar.TypeReg, 0o644, ""},
		"sbin/ifconfig": {tar.TypeSymlink, 0o777, "/bin/busybox"},
	} {
		e, ok := got[name]
		if !ok {
			t.Errorf("%s missing", name)
			continue
		}
		if e.typ != want.typ || e.mode != want.mode || e.link != want.link {
			t.Errorf("%s: type %c mode %o link %q, want %c %o %q", name, e.typ, e.mode, e.link, want.typ, want.mode, want.link)
		}
	}
	for name := range got {
		if strings.Contains(name, "..") {
			t.Errorf("entry %q escapes the root", name)
		}
	}
}

func TestRecipeHashStable(t *testing.T) {
	ctx := t.Context()
	for _, name := range Names() {
		if name == "busybox" {
			if _, err := findBusybox(); err != nil {
				t.Logf("skip busybox: %v", err)
				continue
			}
		}
		a, err := RecipeHash(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		b, err := RecipeHash(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if a != b || len(a) != 64 {
			t.Errorf("%s: hash %q then %q", name, a, b)
		}
	}
	if _, err := RecipeHash(ctx, "nope"); !errors.Is(err, ErrUnknownRecipe) {
		t.Errorf("unknown recipe: err = %v, want ErrUnknownRecipe", err)
	}
	// A change to any part of the recipe changes the hash.
	r := *recipes["bookworm"]
	base, _ := r.hash(ctx)
	r.changes = append(append([]string{}, r.changes...), "ENV X=1")
	changed, _ := r.hash(ctx)
	r2 := *recipes["bookworm"]
	r2.layer.UID = 1001
	layer, _ := r2.hash(ctx)
	if base == changed || base == layer {
		t.Errorf("hash did not follow the recipe: %s %s %s", base, changed, layer)
	}
}

func TestAddUserPrunes(t *testing.T) {
	rules := []pruneRule{
		{Dir: "usr/share/doc", Keep: []string{"usr/share/doc/*/copyright"}},
		{Dir: "usr/share/man"},
	}
	in := []entry{
		{name: "./etc/passwd", typ: tar.TypeReg, data: "root:x:0:0::/root:/bin/sh\n"},
		{name: "./etc/group", typ: tar.TypeReg, data: "root:x:0:\n"},
		{name: "./usr/share/doc/", typ: tar.TypeDir},
		{name: "./usr/share/doc/git/", typ: tar.TypeDir},
		{name: "./usr/share/doc/git/copyright", typ: tar.TypeReg, data: "GPL"},
		{name: "./usr/share/doc/git/README.md", typ: tar.TypeReg, data: "readme"},
		{name: "./usr/share/doc/git/html/", typ: tar.TypeDir},
		{name: "./usr/share/doc/git/html/index.html", typ: tar.TypeReg, data: "<html>"},
		{name: "./usr/share/man/", typ: tar.TypeDir},
		{name: "./usr/share/man/man1/", typ: tar.TypeDir},
		{name: "./usr/share/man/man1/git.1.gz", typ: tar.TypeReg, data: "man"},
		{name: "./usr/share/manual", typ: tar.TypeReg, data: "not under man/"},
		{name: "./usr/bin/git", typ: tar.TypeReg, data: "elf"},
	}
	var out bytes.Buffer
	if err := addUser(bytes.NewReader(makeTar(t, in)), &out, agentUser, rules); err != nil {
		t.Fatal(err)
	}
	got := readTar(t, out.Bytes())
	for _, keep := range []string{"./usr/share/doc/", "./usr/share/doc/git/", "./usr/share/doc/git/copyright", "./usr/share/man/", "./usr/share/manual", "./usr/bin/git"} {
		if _, ok := got[keep]; !ok {
			t.Errorf("%s dropped", keep)
		}
	}
	for _, drop := range []string{"./usr/share/doc/git/README.md", "./usr/share/doc/git/html/", "./usr/share/doc/git/html/index.html", "./usr/share/man/man1/", "./usr/share/man/man1/git.1.gz"} {
		if _, ok := got[drop]; ok {
			t.Errorf("%s kept", drop)
		}
	}

	// A hard link to a pruned file cannot be kept.
	in = append(in, entry{name: "./usr/bin/readme", typ: tar.TypeLink, link: "./usr/share/doc/git/README.md"})
	err := addUser(bytes.NewReader(makeTar(t, in)), io.Discard, agentUser, rules)
	if err == nil || !strings.Contains(err.Error(), "hard link to pruned") {
		t.Errorf("err = %v, want hard link error", err)
	}
}
