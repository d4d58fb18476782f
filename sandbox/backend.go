package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
)

// Labels every sandbox container carries. Spec.Labels may not use the
// io.rollout.sandbox. prefix.
const (
	LabelManaged  = "io.rollout.managed"          // "true"
	LabelInstance = "io.rollout.sandbox.instance" // the Docker manager that created it
	LabelHost     = "io.rollout.sandbox.host"     // hostname of that process
	LabelPID      = "io.rollout.sandbox.pid"      // pid of that process
	LabelPIDStart = "io.rollout.sandbox.pidstart" // its start time (clock ticks), against pid reuse
	LabelBoot     = "io.rollout.sandbox.boot"     // kernel boot id of that host, against pid reuse across reboots
	LabelPool     = "io.rollout.sandbox.pool"     // spec fingerprint of a warm-pool container
	// Conventional caller labels (Spec.Labels keys).
	LabelRun     = "io.rollout.run"
	LabelRollout = "io.rollout.rollout"

	reservedPrefix = "io.rollout.sandbox."
)

// DefaultLimits apply to zero fields of Spec.Limits.
var DefaultLimits = Limits{
	MemoryBytes: 2 << 30,
	CPUs:        1,
	PIDs:        512,
	DiskBytes:   1 << 30,
}

// Backend creates sandboxes; the Docker type and Pool implement it.
type Backend interface {
	Create(ctx context.Context, spec Spec) (Sandbox, error)
}

// closeParallel is how many sandboxes a local backend's Close, and a
// pool's, remove at once.
const CloseParallel = 16

// closeAll closes sandboxes, at most par at a time, and returns their
// errors (a backend's Close).
func CloseAll[S interface{ Close(context.Context) error }](ctx context.Context, live []S, par int) []error {
	var errs []error
	var wg sync.WaitGroup
	var emu sync.Mutex
	sem := make(chan struct{}, par)
	for _, s := range live {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := s.Close(ctx); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		})
	}
	wg.Wait()
	return errs
}

func RandomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// slotMode says how a create gets its slot of the backend's slotSem.
type SlotMode int

// Slot modes of create.
const (
	SlotWait SlotMode = iota // wait for a slot under MaxContainers
	SlotHeld                 // the caller took the slot (the pool); create gives it back on failure
)

// forget removes id from a backend's live handles under mu and gives its
// slot back, once: only while id is still there.
func Forget[S any](mu *sync.Mutex, live map[string]S, id string, slots *SlotSem) {
	mu.Lock()
	defer mu.Unlock()
	if _, ok := live[id]; ok {
		delete(live, id)
		slots.Release()
	}
	MetricLive.Set(float64(len(live)))
}

// ReapOptions select what Reap removes besides orphans of dead instances on
// this host.
type ReapOptions struct {
	// All removes every container of this service, live instances'
	// included (`rollout sandbox gc --all`).
	All bool
	// OtherHosts also removes containers whose instance ran on another host
	// (a shared engine); their liveness cannot be checked from here.
	OtherHosts bool
}

// Reaped describes one removed container.
type Reaped struct {
	ID       string
	Name     string
	Instance string
	Reason   string // orphan, leaked, all, other-host
}

// LabelBackend names the backend on a runc container's annotations.
const LabelBackend = "io.rollout.sandbox.backend"

// Sandbox backends (runner config sandbox.backend).
const (
	BackendDocker     = "docker"
	BackendKubernetes = "kubernetes"
	// BackendRunc runs each sandbox with runc directly, no engine daemon
	// in the path (sandbox/runc); one host, as root.
	BackendRunc = "runc"
)
