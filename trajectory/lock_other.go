//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package trajectory

import (
	"fmt"
	"os"
	"runtime"
)

// tryLock is not implemented here: run directories cannot be locked, so
// writers refuse to start rather than risk two writers in one directory.
func tryLock(*os.File) (bool, error) {
	return false, fmt.Errorf("run directory locks are not implemented on %s", runtime.GOOS)
}

func unlock(*os.File) error { return nil }
