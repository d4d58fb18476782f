package bench

import (
	"os/exec"
	"runtime"
	"syscall"
)

// startTied starts cmd so that the kernel sends it SIGTERM if this process
// dies without stopping it. The parent-death signal fires when the thread
// that forked the child exits, so that thread stays locked (and alive)
// until release is called, after the child has exited.
func startTied(cmd *exec.Cmd) (release func(), err error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	errc := make(chan error)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		errc <- cmd.Start()
		<-done
	}()
	if err := <-errc; err != nil {
		close(done)
		return nil, err
	}
	return func() { close(done) }, nil
}
