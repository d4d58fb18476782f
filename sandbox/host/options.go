package host

import (
	"log/slog"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
)

// Options are the settings the backends that run sandboxes on this host
// (docker, runc) share; each backend's Options embeds them. Zero values
// take defaults (Defaults).
type Options struct {
	Instance          string               // service instance id (default: random)
	MaxContainers     int                  // concurrent sandboxes, warm ones included (default 512)
	ReapInterval      time.Duration        // periodic reaper (default 30s; < 0 disables, start-up reap too)
	LeakGrace         time.Duration        // own untracked containers younger than this are left alone (default 2m)
	DiskCheckInterval time.Duration        // disk watchdog period (default 1s; hostdisk.go)
	Agent             *sandbox.AgentBinary // default sandbox.ResolveAgent()
	Logger            *slog.Logger
	// HostMemoryReserve is kept free on the host beyond a new sandbox's
	// memory limit: a create waits until MemAvailable >= limit + reserve
	// (default 512 MiB; negative disables host admission).
	HostMemoryReserve int64
	// HostDiskReserve is kept free on the backend's data root beyond a new
	// sandbox's disk limit (default 2 GiB).
	HostDiskReserve int64
}

// Defaults fills the zero settings, the same way for every host backend.
func (o *Options) Defaults() {
	if o.Instance == "" {
		o.Instance = sandbox.RandomID(8)
	}
	if o.MaxContainers <= 0 {
		o.MaxContainers = 512
	}
	if o.ReapInterval == 0 {
		o.ReapInterval = 30 * time.Second
	}
	if o.LeakGrace <= 0 {
		o.LeakGrace = 2 * time.Minute
	}
	if o.DiskCheckInterval <= 0 {
		o.DiskCheckInterval = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.HostMemoryReserve == 0 {
		o.HostMemoryReserve = 512 << 20
	}
	if o.HostDiskReserve <= 0 {
		o.HostDiskReserve = 2 << 30
	}
}
