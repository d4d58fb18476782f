package version

import (
	"runtime"
	"strings"
	"testing"
)

func TestGet(t *testing.T) {
	old, oldCommit := Version, Commit
	t.Cleanup(func() { Version, Commit = old, oldCommit })

	Version, Commit = "v1.2.3", "abc1234"
	got := Get()
	if got.Version != "v1.2.3" || got.Commit != "abc1234" {
		t.Errorf("stamped values not used: %+v", got)
	}
	if got.GoVersion != runtime.Version() || !strings.HasPrefix(got.GoVersion, "go") {
		t.Errorf("GoVersion = %q, want %q", got.GoVersion, runtime.Version())
	}

	Version, Commit = "dev", "unknown"
	got = Get()
	if got.Version == "" || got.Commit == "" {
		t.Errorf("unstamped build must still report something: %+v", got)
	}
}
