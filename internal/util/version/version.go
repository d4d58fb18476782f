// Package version holds the build identity of the rollout binary. Version
// and Commit are stamped by the Makefile through -ldflags; a plain `go build`
// or `go install` falls back to the module build information.
package version

import (
	"runtime"
	"runtime/debug"
)

// Stamped with -ldflags "-X github.com/rollout-rl/rollout/internal/util/version.Version=..."
// (see LDFLAGS in the Makefile). They stay variables so the linker can set
// them.
var (
	Version = "dev"
	Commit  = "unknown"
)

// Info is the identity of this build.
type Info struct {
	Version   string
	Commit    string
	GoVersion string
}

// Get returns the build identity, filling gaps from the embedded build
// information so that `go install ...@v1.2.3` still reports v1.2.3.
func Get() Info {
	info := Info{Version: Version, Commit: Commit, GoVersion: GoVersion()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	if info.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		info.Version = bi.Main.Version
	}
	if info.Commit == "unknown" {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				info.Commit = s.Value
				if len(info.Commit) > 12 {
					info.Commit = info.Commit[:12]
				}
			}
		}
	}
	return info
}

// GoVersion is the Go toolchain the binary was built with.
func GoVersion() string { return runtime.Version() }
