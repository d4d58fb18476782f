//go:build !linux

package bench

import "os/exec"

// startTied starts cmd (there is no parent-death signal outside Linux).
func startTied(cmd *exec.Cmd) (release func(), err error) {
	return func() {}, cmd.Start()
}
