package image

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// Dockerfiles come from env definitions: parsing them must never panic.
func FuzzFromImages(f *testing.F) {
	for _, s := range []string{
		"FROM rollout-sandbox:busybox\n",
		"ARG B=x\nFROM ${B:-y} AS s\nFROM s\n",
		"FROM \\\n",
		"from --platform=$P a",
		"ARG\nFROM $",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, df string) {
		imgs, err := fromImages([]byte(df), map[string]string{"B": "z"})
		if err == nil && len(imgs) == 0 && !bytes.Contains(bytes.ToLower([]byte(df)), []byte("from")) {
			t.Errorf("no FROM but no error for %q", df)
		}
	})
}

// apt sources are read from the host: any content is handled.
func FuzzHostMirrors(f *testing.F) {
	f.Add("deb http://a/debian bookworm main\n", "Types: deb\nURIs: http://b\nSuites: x y\n")
	f.Add("deb [ http://a", "Types:\n\n\nURIs:")
	f.Fuzz(func(t *testing.T, oneLine, deb822 string) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "sources.list.d"), 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.WriteFile(filepath.Join(dir, "sources.list"), []byte(oneLine), 0o644)
		_ = os.WriteFile(filepath.Join(dir, "sources.list.d", "x.sources"), []byte(deb822), 0o644)
		for suite, uri := range hostMirrors(dir) {
			if suite == "" || !isDebianURI(uri) {
				t.Errorf("bad mirror %q → %q", suite, uri)
			}
		}
	})
}

// Build-context tarballs are user input: malformed ones give an error, not
// a panic, and never an entry outside the context.
func FuzzTarballContext(f *testing.F) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_ = tw.WriteHeader(&tar.Header{Name: "Dockerfile", Typeflag: tar.TypeReg, Mode: 0o644, Size: 7})
	_, _ = tw.Write([]byte("FROM x\n"))
	_ = tw.Close()
	f.Add(b.Bytes())
	f.Add([]byte{0x1f, 0x8b, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "ctx.tar")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if _, err := writeContext(&out, TaskSpec{Context: p, DockerfilePath: "Dockerfile"}); err != nil {
			return
		}
		tr := tar.NewReader(&out)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Fatalf("canonical context unreadable: %v", err)
			}
			if c := cleanName(h.Name); c != h.Name && c+"/" != h.Name {
				t.Errorf("entry %q not canonical", h.Name)
			}
		}
	})
}
