package agent

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
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

// runSupervised is pid 1 of a sandbox the runc backend starts (no
// docker-init there): it starts the agent proper, /proc/self/exe with args,
// as its child on the same stdin, stdout and stderr, reaps every orphan the
// sandbox user's commands leave behind, forwards termination signals to the
// agent, and exits with the agent's status once it is gone. The agent is
// never pid 1, so its reset can tell its own processes from the rest.
func runSupervised(args []string) int {
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGCHLD)
	child, err := os.StartProcess("/proc/self/exe", append([]string{"rollout-agent"}, args...), &os.ProcAttr{
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Env:   os.Environ(),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "rollout-agent: supervise: start the agent:", err)
		return 1
	}
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			_ = child.Signal(sig)
			continue
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			if pid == child.Pid {
				return exitStatus(ws)
			}
		}
	}
	return 0
}

// exitStatus is a shell's rendering of a wait status: the exit code, or
// 128 + the signal that ended the process.
func exitStatus(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// commandPrefix is what came between the program and args on the command
// line (the rollout binary's "agent" subcommand), so that the supervised
// child is started the same way.
func commandPrefix(args []string) []string {
	n := len(os.Args) - len(args)
	if n < 1 || !slices.Equal(os.Args[n:], args) {
		return nil
	}
	return slices.Clone(os.Args[1:n])
}

// withoutFlag returns args less -name and --name.
func withoutFlag(args []string, name string) []string {
	out := make([]string, 0, len(args))
	for _, a := range args {
		if a != "-"+name && a != "--"+name {
			out = append(out, a)
		}
	}
	return out
}
