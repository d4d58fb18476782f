package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
)

// Owner binding. A sandbox must not outlive the process that created it:
//
//   - The container's main process is the agent, which serves the exec
//     channel on its stdin and exits when stdin ends (agent.Main).
//   - Containers are created with StdinOnce, so the engine closes the
//     agent's stdin as soon as the one attach connection of the owner
//     closes — also when the owner is killed (kill -9, OOM, crash): the
//     kernel closes its socket to the engine.
//   - Containers are created with AutoRemove, so the engine deletes them
//     when the agent has exited. Together: within about a second of the
//     owner's death its containers are gone, with no other process involved.
//     Warm-pool containers are attached like any other and go the same way.
//   - The reaper (reaper.go) remains the second line for what the engine
//     could not do by itself: containers created but never started (a crash
//     between ContainerCreate and ContainerStart), and an engine that was
//     down or restarted while the owner died. It removes a container only
//     when its owner labels (host, boot id, pid, pid start time) name a
//     process that no longer runs, so a live `rollout` beside it on the same
//     engine never loses a sandbox.

var bootOnce = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// ownerLabels are the labels (annotations for runc) that bind a backend's
// sandboxes to this process (instance, host, pid, its start time, boot id)
// for the reaper.
func ownerLabels(instance string) map[string]string {
	host, _ := os.Hostname()
	return map[string]string{
		LabelManaged:  "true",
		LabelInstance: instance,
		LabelHost:     host,
		LabelPID:      strconv.Itoa(os.Getpid()),
		LabelPIDStart: pidStart(os.Getpid()),
		LabelBoot:     bootID(),
	}
}

// bootID is the kernel's boot id ("" where /proc does not have it).
func bootID() string { return bootOnce() }

// The watchdog is the owner's second line for the containers the engine
// cannot remove by itself: those created but not yet started when the
// owner died (a burst of creates keeps several in that state). NewDocker
// starts a copy of the running executable as a small watchdog process
// holding the read end of a pipe whose write end only the owner holds.
// When the owner dies, the kernel closes the pipe; the watchdog then
// removes every container labelled with the owner's pid, pid start time and
// boot id, for a few seconds (creates still in flight at the engine land
// late), and exits. A clean Close writes one byte first: the watchdog exits
// at once. The watchdog runs from the package's init, before main, so every
// binary that links this package can serve it.

const watchdogEnv = "ROLLOUT_SANDBOX_WATCHDOG"

func init() {
	if spec := os.Getenv(watchdogEnv); spec != "" {
		os.Exit(runWatchdog(spec))
	}
}

// watchdogSpec is what the watchdog receives in its environment.
type watchdogSpec struct {
	PID      string `json:"pid"`
	PIDStart string `json:"pid_start"`
	Boot     string `json:"boot"`
	Host     string `json:"host"`
	// SockDir is the owner's socket-channel directory (socket.go), removed
	// with its containers; "" when the channel is off.
	SockDir string `json:"sock_dir,omitempty"`
}

// watchdog is the owner's side.
type watchdog struct {
	w    *os.File
	cmd  *exec.Cmd
	done chan struct{}
}

// startWatchdog starts the watchdog of this process's containers; nil
// (logged) when it cannot.
func startWatchdog(labels map[string]string, sockDir string, log *slog.Logger) *watchdog {
	exe, err := os.Executable()
	if err != nil {
		log.Warn("no sandbox watchdog: cannot find the executable", "err", err)
		return nil
	}
	spec, _ := json.Marshal(watchdogSpec{PID: labels[LabelPID], PIDStart: labels[LabelPIDStart], Boot: labels[LabelBoot], Host: labels[LabelHost], SockDir: sockDir})
	r, w, err := os.Pipe()
	if err != nil {
		log.Warn("no sandbox watchdog", "err", err)
		return nil
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), watchdogEnv+"="+string(spec))
	cmd.ExtraFiles = []*os.File{r}
	cmd.Stderr = os.Stderr
	// Its own process group: a Ctrl-C meant for the owner must not take
	// the watchdog down before the owner has cleaned up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		log.Warn("no sandbox watchdog", "err", err)
		return nil
	}
	r.Close()
	wd := &watchdog{w: w, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(wd.done)
	}()
	return wd
}

// stop ends the watchdog of a clean shutdown.
func (wd *watchdog) stop() {
	if wd == nil {
		return
	}
	_, _ = wd.w.Write([]byte{'x'})
	wd.w.Close()
	select {
	case <-wd.done:
	case <-time.After(5 * time.Second):
		_ = wd.cmd.Process.Kill()
		<-wd.done
	}
}

func runWatchdog(specJSON string) int {
	var spec watchdogSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil || spec.PID == "" {
		fmt.Fprintln(os.Stderr, "rollout sandbox watchdog: bad spec:", specJSON)
		return 2
	}
	pipe := os.NewFile(3, "owner")
	var b [1]byte
	if n, _ := pipe.Read(b[:]); n == 1 {
		return 0 // clean shutdown: the owner removed its containers itself
	}
	// The owner died.
	if spec.SockDir != "" {
		_ = os.RemoveAll(spec.SockDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := dockerclient.New(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rollout sandbox watchdog:", err)
		return 1
	}
	defer cli.Close()
	f := make(client.Filters).Add("label", LabelManaged+"=true").Add("label", LabelPID+"="+spec.PID)
	removed := 0
	quiet := 0
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline) && quiet < 3; {
		res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
		if err != nil {
			break
		}
		n := 0
		for _, c := range res.Items {
			if c.Labels[LabelPIDStart] != spec.PIDStart || c.Labels[LabelBoot] != spec.Boot || c.Labels[LabelHost] != spec.Host {
				continue // another process that had the same pid
			}
			n++
			if _, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err == nil {
				removed++
			}
		}
		if n == 0 {
			quiet++
		} else {
			quiet = 0
		}
		time.Sleep(500 * time.Millisecond)
	}
	if removed > 0 {
		fmt.Fprintf(os.Stderr, "rollout sandbox watchdog: owner pid %s died; removed %d of its containers\n", spec.PID, removed)
	}
	return 0
}
