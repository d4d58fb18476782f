// Package sandbox is the contract every sandbox backend shares: the
// Sandbox interface, Spec and Limits, the error classes, the Backend
// interface and the registry of backends, the exec-channel client that
// talks to the in-sandbox agent (sandbox/agent), warm pools with reuse
// and scopes, and create admission. The backends live in their own
// packages (sandbox/docker, sandbox/runc, sandbox/kubernetes; the ones
// linked into rollout are listed in sandbox/builtin), so this package links
// neither the Docker client nor client-go.
//
// It knows nothing about rollouts, rewards or models: callers pass labels
// and specs; the package guarantees isolation and cleanup.
package sandbox

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"time"
)

// Error classes. Callers test them with errors.Is; every error returned by a
// Sandbox wraps exactly one of them (or a context error).
var (
	// ErrUnavailable is an infrastructure failure: the daemon is unreachable,
	// the container died or was removed, the exec channel broke. The rollout
	// is an infra failure, not a model mistake.
	ErrUnavailable = errors.New("sandbox unavailable")
	// ErrInvalid is a bad request (empty command, relative path, negative
	// limit): a caller bug or bad model input, never retried.
	ErrInvalid = errors.New("invalid sandbox request")
	// ErrNotFound is a missing file or process inside the sandbox.
	ErrNotFound = errors.New("not found in sandbox")
	// ErrClosed is returned by any call after Close.
	ErrClosed = errors.New("sandbox closed")
	// ErrFailed is an operation that reached the sandbox and failed there
	// for a reason the sandbox's own state explains (permission denied, disk
	// full, pids limit reached): shown to the model, not an infra failure.
	ErrFailed = errors.New("sandbox operation failed")
)

// Network policies for Spec.Network.
const (
	NetworkNone = "none" // default: no network at all
	// NetworkBridge is egress only: public addresses, never the host, the
	// engine's bridge gateways, private ranges or other sandboxes (a
	// project-managed network plus host firewall rules; sandbox/docker/network.go).
	NetworkBridge = "bridge"
	// NetworkOpen is the engine's default bridge with no restriction: the
	// host's services and other containers are reachable. Explicit only.
	NetworkOpen = "open"
)

// OCI runtimes for Spec.Runtime.
const (
	RuntimeRunc  = "runc"  // default
	RuntimeRunsc = "runsc" // gVisor: a user-space kernel between the sandbox and the host
)

// Limits bounds a sandbox's resources. Zero values take the backend's
// defaults (see DefaultLimits).
type Limits struct {
	MemoryBytes int64   // hard limit, swap disabled
	CPUs        float64 // CPU quota in cores
	PIDs        int64   // pids cgroup limit
	// DiskBytes bounds what the sandbox may write (default 1 GiB): the
	// writable layer (a watchdog removes the sandbox past it) and, with
	// ReadOnlyRoot, the size of each writable tmpfs (the kernel refuses
	// writes past it).
	DiskBytes    int64
	ReadOnlyRoot bool // read-only root with writable tmpfs /tmp and workdir
	MaxLifetime  time.Duration
	IdleTimeout  time.Duration
}

// File is a file placed into the sandbox before first use.
type File struct {
	Path string // absolute path inside the sandbox
	Data []byte
	Mode fs.FileMode // 0 means 0o644
}

// Spec describes a sandbox to create.
type Spec struct {
	Image   string
	Workdir string            // default /workspace
	Env     map[string]string // initial environment
	User    string            // default: "agent" when the image has it, else image default
	Limits  Limits
	Network string // NetworkNone (default), NetworkBridge (egress only) or NetworkOpen
	// Runtime is the engine's OCI runtime: "" or RuntimeRunc (default),
	// RuntimeRunsc (gVisor, when the engine has it registered).
	Runtime string
	Files   []File
	Labels  map[string]string // added to the service's own labels
}

// ExecRequest is one command. Exactly one of Command (run by /bin/sh -c, or
// by the persistent shell when Shell is set) and Argv (no shell; works in any
// image) must be set.
type ExecRequest struct {
	Command string
	Argv    []string
	// Shell runs Command in the sandbox's stateful shell session: the cwd and
	// exported variables left by the previous Shell command are kept.
	Shell   bool
	Cwd     string            // default: the session cwd (Shell) or the workdir
	Env     map[string]string // added to the environment of this command only
	Stdin   []byte
	Timeout time.Duration // 0 = no timeout beyond ctx; expiry kills the process group, exit 124
	// OutputCap bounds kept bytes per stream (head and tail kept, middle
	// dropped); 0 = backend default (1 MiB).
	OutputCap int
	// MergeOutput sends stderr into Stdout in arrival order (terminal tool).
	MergeOutput bool
}

// ExecResult is the outcome of a command that ran. A non-zero exit code or a
// timeout is a result, not an error.
type ExecResult struct {
	ExitCode        int
	Stdout          []byte
	Stderr          []byte
	StdoutTotal     int64 // bytes produced, including dropped ones
	StderrTotal     int64
	StdoutTruncated bool
	StderrTruncated bool
	TimedOut        bool // the timeout fired; ExitCode is 124
	Duration        time.Duration
}

// ProcessInfo describes a background process (the process tool).
type ProcessInfo struct {
	ID          string
	Command     string
	PID         int
	Running     bool
	ExitCode    int // valid when !Running
	StartedAt   time.Time
	Output      []byte // output read so far by Poll/Log (bounded)
	OutputTotal int64
}

// ImageIdentifier is implemented by sandboxes that know the
// content-addressed id of their image (the Docker backend's do).
type ImageIdentifier interface {
	ImageID() string
}

// Quiescer is implemented by sandboxes that can stop every process the
// sandbox user started — background jobs, daemons, setsid'd children —
// leaving only the sandbox's own machinery. Rewards run after it, so
// nothing the agent left behind can change what they read.
type Quiescer interface {
	KillAll(ctx context.Context) (killed int, err error)
}

// Sandbox is one isolated environment. Implementations are safe for
// concurrent use; Close is idempotent and removes every trace of the
// sandbox even when ctx is already cancelled.
type Sandbox interface {
	ID() string
	Exec(ctx context.Context, req ExecRequest) (ExecResult, error)

	WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error
	ReadFile(ctx context.Context, path string) ([]byte, error)
	// Upload writes a tar stream (paths relative to dir) into dir;
	// Download produces one of dir. Modes are kept; any size, binary-safe.
	Upload(ctx context.Context, dir string, tarStream io.Reader) error
	Download(ctx context.Context, dir string, w io.Writer) error

	// Background processes.
	Start(ctx context.Context, req ExecRequest) (ProcessInfo, error)
	Poll(ctx context.Context, id string) (ProcessInfo, error)
	Wait(ctx context.Context, id string, timeout time.Duration) (ProcessInfo, error)
	Kill(ctx context.Context, id string) error
	WriteStdin(ctx context.Context, id string, data []byte) error
	Processes(ctx context.Context) ([]ProcessInfo, error)

	Close(ctx context.Context) error
}

// StdinCloser is implemented by sandboxes that can close a background
// process's stdin (the process tool's "submit"/EOF).
type StdinCloser interface {
	CloseStdin(ctx context.Context, id string) error
}

// Labeler exposes the caller labels a sandbox was acquired with.
type Labeler interface {
	Labels() map[string]string
}

// Applied are the limits a sandbox's container was actually created with,
// read back from the engine (ContainerInspect), for manifests.
type Applied struct {
	MemoryBytes int64
	CPUs        float64
	PIDs        int64
	// DiskBytes is the writable-layer and tmpfs bound; the project enforces
	// it (tmpfs size, disk watchdog), not the engine.
	DiskBytes    int64
	ReadOnlyRoot bool
	Network      string // the policy: none, bridge (egress only) or open
	Runtime      string // OCI runtime: runc, runsc
	// Backend is the backend that made the sandbox: BackendDocker,
	// BackendRunc or BackendKubernetes (the first two both run runc).
	Backend string
}

// LimitsReporter is implemented by sandboxes that know the limits their
// container was created with (the Docker, runc and Kubernetes backends'
// do).
type LimitsReporter interface {
	Applied() Applied
}
