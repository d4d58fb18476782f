package sandbox

import (
	"os"
	"strings"
	"sync"
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

// bootID is the kernel's boot id ("" where /proc does not have it).
func bootID() string { return bootOnce() }
