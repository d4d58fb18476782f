package host

import (
	"errors"
	"fmt"
	"github.com/rollout-rl/rollout/sandbox"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
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
//   - The reaper (sandbox/docker/reaper.go) remains the second line for what the engine
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
func OwnerLabels(instance string) map[string]string {
	host, _ := os.Hostname()
	return map[string]string{
		sandbox.LabelManaged:  "true",
		sandbox.LabelInstance: instance,
		sandbox.LabelHost:     host,
		sandbox.LabelPID:      strconv.Itoa(os.Getpid()),
		sandbox.LabelPIDStart: PidStart(os.Getpid()),
		sandbox.LabelBoot:     BootID(),
	}
}

// bootID is the kernel's boot id ("" where /proc does not have it).
func BootID() string { return bootOnce() }

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

// pidStart reads the start time of pid from /proc (field 22 of stat).
func PidStart(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return ""
	}
	return fields[19]
}

// reapReason says why a sandbox container with these labels, created at
// created, is to be removed ("" keeps it): every one with opts.All; other
// hosts' with opts.OtherHosts; the calling backend's own (self: its
// instance, pid and pid start labels) when it does not track it and it is
// older than grace; any other whose creating process is gone.
func ReapReason(labels map[string]string, isTracked bool, created time.Time, self map[string]string, grace time.Duration, opts sandbox.ReapOptions, host string) string {
	switch {
	case opts.All:
		return "all"
	case labels[sandbox.LabelHost] != host:
		if opts.OtherHosts {
			return "other-host"
		}
	case self != nil && labels[sandbox.LabelInstance] == self[sandbox.LabelInstance] && labels[sandbox.LabelPID] == self[sandbox.LabelPID] && labels[sandbox.LabelPIDStart] == self[sandbox.LabelPIDStart]:
		if !isTracked && time.Since(created) > grace {
			return "leaked"
		}
	case !Alive(labels[sandbox.LabelPID], labels[sandbox.LabelPIDStart], labels[sandbox.LabelBoot]):
		return "orphan"
	}
	return ""
}

// alive reports whether the process that labelled a container still runs
// (same boot, same pid and same start time, so a recycled pid does not
// count). Containers without a boot label (older releases) are judged by
// pid and start time alone.
func Alive(pidLabel, startLabel, bootLabel string) bool {
	if bootLabel != "" {
		if b := BootID(); b != "" && b != bootLabel {
			return false
		}
	}
	pid, err := strconv.Atoi(pidLabel)
	if err != nil || pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	return startLabel == "" || PidStart(pid) == startLabel
}

// AgentInCtr is where the agent binary sits inside a host-run sandbox.
const AgentInCtr = "/.rollout/agent"
