package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox"
)

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
	spec, _ := json.Marshal(watchdogSpec{PID: labels[sandbox.LabelPID], PIDStart: labels[sandbox.LabelPIDStart], Boot: labels[sandbox.LabelBoot], Host: labels[sandbox.LabelHost], SockDir: sockDir})
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
	f := make(client.Filters).Add("label", sandbox.LabelManaged+"=true").Add("label", sandbox.LabelPID+"="+spec.PID)
	removed := 0
	quiet := 0
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline) && quiet < 3; {
		res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
		if err != nil {
			break
		}
		n := 0
		for _, c := range res.Items {
			if c.Labels[sandbox.LabelPIDStart] != spec.PIDStart || c.Labels[sandbox.LabelBoot] != spec.Boot || c.Labels[sandbox.LabelHost] != spec.Host {
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
