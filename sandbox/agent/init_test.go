package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// -install copies the running executable (the init container's job).
func TestInstallSelf(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "sub", "agent")
	if code := Main([]string{"-install", dst}); code != 0 {
		t.Fatalf("install exited %d", code)
	}
	got, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Stat("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if got.Size() != self.Size() || got.Mode().Perm() != 0o755 {
		t.Fatalf("installed %d bytes mode %v, want %d bytes mode 0755", got.Size(), got.Mode().Perm(), self.Size())
	}
	if _, err := os.Stat(dst + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary file left: %v", err)
	}
	if code := Main([]string{"-install", "relative/path"}); code == 0 {
		t.Fatal("relative install path accepted")
	}
}
