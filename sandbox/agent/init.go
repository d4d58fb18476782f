package agent

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

// installSelf copies the running executable to dst (mode 0755): how the
// Kubernetes backend's init container puts the agent into a pod's shared
// emptyDir, where the sandbox container runs it from. The file is written
// under a temporary name and renamed, so a half-written agent never runs.
func installSelf(dst string) error {
	if !filepath.IsAbs(dst) {
		return fmt.Errorf("%s is not absolute", dst)
	}
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer src.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// runInit is the main process of a Kubernetes sandbox pod. The agent that
// serves the channel is exec'd into the container (so its output never
// reaches the container log and no byte is lost before the host connects);
// this process only keeps the container alive as pid 1 and reaps the
// orphans the sandbox user's commands leave behind, like docker-init does
// for the Docker backend.
func runInit() int {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return 0
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
	return 0
}
