package runc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moby/moby/client"
	seccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/agent"
	"github.com/rollout-rl/rollout/sandbox/host"
)

// The runc backend starts each sandbox as an OCI container through the
// runc binary directly, with no engine daemon in the path: no dockerd, no
// containerd, no shim process per container. A Docker sandbox's start is
// mostly the engine's own work (sandbox/README.md: ContainerStart 216 ms of
// a ~240 ms lifecycle on this VM); runc itself starts a container in ~30 ms.
// The sandbox is the same container the Docker backend makes — the same
// image, user, limits, capabilities, seccomp profile (Docker's default),
// masked paths and no-new-privileges, no network — and the same agent
// serves the same protocol, over pipes the backend holds itself. The local
// Docker engine remains the image store: each image is unpacked once per
// host (runc_rootfs.go) and is the read-only lower layer of an overlay per
// sandbox. The backend needs root (overlay mounts, cgroups) and runc on
// the host. docs/security.md ("The runc backend") has the isolation
// argument; sandbox/README.md the measurements.

// RuncOptions configure a Runc backend. Zero values take defaults.
type Options struct {
	// Host are the settings shared with the Docker backend (instance,
	// capacity, reaper, disk watchdog, agent, logger, host admission:
	// DataDir's disk must cover the sandbox's disk limit plus the reserve).
	host.Options
	// Runc is the runc executable (default: runc on PATH).
	Runc string
	// StateDir holds runc's state and the per-sandbox bundles (default
	// /run/rollout-runc, a tmpfs on most hosts: gone at reboot).
	StateDir string
	// DataDir holds the unpacked images and the sandboxes' writable layers
	// (default /var/lib/rollout/runc).
	DataDir string
}

// Runc creates sandboxes as OCI containers run by runc. It is safe for
// concurrent use.
type Runc struct {
	opts   Options
	log    *slog.Logger
	cli    *client.Client // the local engine, as image store only
	agent  sandbox.AgentBinary
	labels map[string]string
	slots  *sandbox.SlotSem
	images *rootfsCache

	mu     sync.Mutex
	live   map[string]*runcSandbox
	closed bool

	stop context.CancelFunc
	bg   sync.WaitGroup
}

var (
	_ sandbox.Backend    = (*Runc)(nil)
	_ sandbox.PoolSource = (*Runc)(nil)
)

// NewRunc checks the host (root, runc), removes the leftovers of dead
// instances and starts the reaper and the disk watchdog.
func New(ctx context.Context, opts Options) (*Runc, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: the runc backend needs root (it mounts overlays and creates cgroups); use the docker backend", sandbox.ErrInvalid)
	}
	opts.Defaults()
	if opts.Runc == "" {
		opts.Runc = "runc"
	}
	bin, err := exec.LookPath(opts.Runc)
	if err != nil {
		return nil, fmt.Errorf("%w: the runc backend needs runc on the host (Debian: apt-get install runc): %v", sandbox.ErrInvalid, err)
	}
	opts.Runc = bin
	if opts.StateDir == "" {
		opts.StateDir = "/run/rollout-runc"
	}
	if opts.DataDir == "" {
		opts.DataDir = "/var/lib/rollout/runc"
	}
	ab, err := sandbox.AgentOption(opts.Agent)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{opts.StateDir, filepath.Join(opts.StateDir, "bundles"), filepath.Join(opts.DataDir, "layers")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("%w: runc backend: %v", sandbox.ErrUnavailable, err)
		}
	}
	cli, err := dockerclient.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: the runc backend takes its images from the local engine: %w", sandbox.ErrUnavailable, err)
	}
	labels := host.OwnerLabels(opts.Instance)
	labels[sandbox.LabelBackend] = "runc"
	r := &Runc{
		opts:   opts,
		log:    opts.Logger.With("sandbox_instance", opts.Instance, "backend", "runc"),
		cli:    cli,
		agent:  ab,
		labels: labels,
		slots:  sandbox.NewSlotSem(opts.MaxContainers),
		live:   map[string]*runcSandbox{},
	}
	r.images = &rootfsCache{dir: filepath.Join(opts.DataDir, "images"), cli: cli, labels: maps.Clone(r.labels), images: map[string]runcImage{}}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.stop = cancel
	if opts.ReapInterval > 0 {
		if _, err := r.Reap(ctx, sandbox.ReapOptions{}); err != nil {
			r.log.Warn("start-up reap failed", "err", err)
		}
		r.bg.Go(func() {
			host.Every(rctx, opts.ReapInterval, func() {
				host.ExpireLimits(rctx, r.handles(), r.log)
				if _, err := r.Reap(rctx, sandbox.ReapOptions{}); err != nil && rctx.Err() == nil {
					r.log.Warn("periodic reap failed", "err", err)
				}
			})
		})
	}
	r.bg.Go(func() { host.Every(rctx, opts.DiskCheckInterval, func() { host.CheckDisks(rctx, r.handles(), r.log) }) })
	return r, nil
}

// handles are the live sandboxes, for the housekeeping.
func (r *Runc) handles() []host.LiveHandle {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]host.LiveHandle, 0, len(r.live))
	for _, s := range r.live {
		out = append(out, s)
	}
	return out
}

// Instance is the id in the instance annotation of this backend's containers.
func (r *Runc) Instance() string { return r.opts.Instance }

// Close removes every sandbox this backend still owns and stops the reaper.
func (r *Runc) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	live := make([]*runcSandbox, 0, len(r.live))
	for _, s := range r.live {
		live = append(live, s)
	}
	r.mu.Unlock()
	r.stop()
	r.bg.Wait()
	errs := sandbox.CloseAll(ctx, live, sandbox.CloseParallel)
	errs = append(errs, r.cli.Close())
	return errors.Join(errs...)
}

func (r *Runc) Logger() *slog.Logger { return r.log }

func (r *Runc) SlotSem() *sandbox.SlotSem { return r.slots }

// validate applies the backend-independent checks and refuses what this
// backend does not build.
func (r *Runc) Validate(spec *sandbox.Spec) error {
	if err := sandbox.ValidateSpec(spec); err != nil {
		return err
	}
	if spec.Network != sandbox.NetworkNone {
		return fmt.Errorf("network %q: not implemented in the runc backend (its sandboxes have no network; use the docker backend)", spec.Network)
	}
	if spec.Runtime != sandbox.RuntimeRunc {
		return fmt.Errorf("runtime %q: not implemented in the runc backend (use the docker backend with the runtime registered)", spec.Runtime)
	}
	return nil
}

// Create starts a sandbox for spec, waiting for a slot under MaxContainers
// as long as ctx allows.
func (r *Runc) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	start := time.Now()
	s, err := r.create(ctx, spec, nil, sandbox.SlotWait, true)
	if err != nil {
		return nil, err
	}
	sandbox.MetricAcquire.WithLabelValues("create").Observe(time.Since(start).Seconds())
	return s, nil
}

// createWarm is create for a Pool; block=false fails at once when the host
// has no room (a warm fill never waits).
func (r *Runc) CreateWarm(ctx context.Context, spec sandbox.Spec, extra map[string]string, slot sandbox.SlotMode, block bool) (sandbox.Warmable, error) {
	s, err := r.create(ctx, spec, extra, slot, block)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// runcPaths are one sandbox's places on the host.
type runcPaths struct {
	bundle string // StateDir/bundles/<id>: config.json, pid file, runc's log, the overlay's mount point
	layer  string // DataDir/layers/<id>: the overlay's upper and work dirs
}

func (r *Runc) paths(id string) runcPaths {
	return runcPaths{bundle: filepath.Join(r.opts.StateDir, "bundles", id), layer: filepath.Join(r.opts.DataDir, "layers", id)}
}

func (p runcPaths) rootfs() string { return filepath.Join(p.bundle, "rootfs") }
func (p runcPaths) upper() string  { return filepath.Join(p.layer, "upper") }

func (r *Runc) create(ctx context.Context, spec sandbox.Spec, extraLabels map[string]string, slot sandbox.SlotMode, block bool) (_ *runcSandbox, err error) {
	holding := slot == sandbox.SlotHeld
	defer func() {
		if holding {
			r.slots.Release()
		}
	}()
	spec.Labels = maps.Clone(spec.Labels)
	spec.Env = maps.Clone(spec.Env)
	if err := r.Validate(&spec); err != nil {
		return nil, fmt.Errorf("create sandbox: %w: %v", sandbox.ErrInvalid, err)
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("create sandbox: %w: backend closed", sandbox.ErrClosed)
	}
	switch slot {
	case sandbox.SlotWait:
		if err := r.slots.Acquire(ctx); err != nil {
			return nil, fmt.Errorf("create sandbox: waiting for a free slot (%d in use): %w", r.slots.Cap, err)
		}
		holding = true
	case sandbox.SlotHeld:
	default:
		return nil, fmt.Errorf("create sandbox: %w: unknown slot mode %d", sandbox.ErrInvalid, slot)
	}
	if r.opts.HostMemoryReserve >= 0 {
		if err := host.AdmitHost(ctx, host.ProcHost{}, r.log, spec, r.opts.DataDir, r.opts.HostMemoryReserve, r.opts.HostDiskReserve, block); err != nil {
			return nil, fmt.Errorf("create sandbox: %w", err)
		}
	}
	img, err := r.images.get(ctx, spec.Image)
	if err != nil {
		sandbox.MetricFailures.WithLabelValues("create").Inc()
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	id := "rollout-" + r.opts.Instance + "-" + sandbox.RandomID(6)
	p := r.paths(id)
	// From here every failure takes down whatever was made.
	var s *runcSandbox
	defer func() {
		if err != nil {
			sandbox.MetricFailures.WithLabelValues("create").Inc()
			r.destroy(id)
			if s != nil && s.pidfd != nil {
				_ = s.pidfd.Close()
			}
		}
	}()
	if err := r.prepareRoot(p, img); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w: %v", id, sandbox.ErrUnavailable, err)
	}
	labels := maps.Clone(r.labels)
	maps.Copy(labels, spec.Labels)
	maps.Copy(labels, extraLabels)
	if err := writeEtc(p, id); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w: %v", id, sandbox.ErrUnavailable, err)
	}
	cfg, err := r.ociSpec(id, spec, img, labels)
	if err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w: %v", id, sandbox.ErrInvalid, err)
	}
	if err := os.WriteFile(filepath.Join(p.bundle, "config.json"), cfg, 0o600); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w: %v", id, sandbox.ErrUnavailable, err)
	}
	s, err = r.start(ctx, id, p, spec, img)
	if err != nil {
		return nil, fmt.Errorf("create sandbox %s from %s: %w", id, spec.Image, err)
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		s.stopChannel()
		return nil, fmt.Errorf("create sandbox: %w: backend closed", sandbox.ErrClosed)
	}
	r.live[id] = s
	sandbox.MetricLive.Set(float64(len(r.live)))
	r.mu.Unlock()
	holding = false
	sandbox.MetricCreates.Inc()
	if ferr := sandbox.PlaceFiles(ctx, s, spec.Files); ferr != nil {
		_ = s.Close(ctx)
		return nil, fmt.Errorf("create sandbox %s: %w", id, ferr)
	}
	s.log.Debug("sandbox started", "image", spec.Image, "user", s.Hello.User, "uid", s.Hello.UID)
	return s, nil
}

// prepareRoot makes the bundle and layer directories and mounts the
// sandbox's root: an overlay of the unpacked image under a writable layer
// of its own (read-only for ReadOnlyRoot through the OCI config, which
// also gives such sandboxes their tmpfs /tmp and workdir).
func (r *Runc) prepareRoot(p runcPaths, img runcImage) error {
	for _, d := range []string{p.rootfs(), p.upper(), filepath.Join(p.layer, "work")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := os.Chmod(p.upper(), 0o755); err != nil {
		return err
	}
	data := "lowerdir=" + img.rootfs + ",upperdir=" + p.upper() + ",workdir=" + filepath.Join(p.layer, "work")
	if err := unix.Mount("overlay", p.rootfs(), "overlay", 0, data); err != nil {
		return fmt.Errorf("mount the sandbox's overlay root: %w", err)
	}
	return nil
}

// start runs the container with the agent on pipes of ours and waits for
// the agent's hello. A returned sandbox with an error has a running
// container the caller must destroy.
func (r *Runc) start(ctx context.Context, id string, p runcPaths, spec sandbox.Spec, img runcImage) (*runcSandbox, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrUnavailable, err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("%w: %v", sandbox.ErrUnavailable, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("%w: %v", sandbox.ErrUnavailable, err)
	}
	pidFile := filepath.Join(p.bundle, "pid")
	logFile := filepath.Join(p.bundle, "runc.log")
	// runc hands these pipes to the container's process and exits once it
	// runs; a cancelled ctx must not kill runc halfway (a half-made
	// container), so the run has its own bound.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	cmd := exec.CommandContext(rctx, r.opts.Runc, "--root", r.runcRoot(), "--log", logFile, "--log-format", "json",
		"run", "--detach", "--bundle", p.bundle, "--pid-file", pidFile, id)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	started := time.Now()
	runErr := cmd.Run()
	cancel()
	sandbox.MetricDaemon.WithLabelValues("runc_run").Observe(time.Since(started).Seconds())
	inR.Close()
	outW.Close()
	errW.Close()
	s := &runcSandbox{r: r, id: id, paths: p, spec: spec, imageID: img.id, created: time.Now(),
		log: r.log.With("container", id), stderr: sandbox.NewTailBuffer(8 << 10), stdin: inW, stdout: outR, stderrPipe: errR,
		stderrDone: make(chan struct{}),
		applied: sandbox.Applied{MemoryBytes: spec.Limits.MemoryBytes, CPUs: spec.Limits.CPUs, PIDs: spec.Limits.PIDs, DiskBytes: spec.Limits.DiskBytes,
			ReadOnlyRoot: spec.Limits.ReadOnlyRoot, Network: spec.Network, Runtime: sandbox.RuntimeRunc, Backend: sandbox.BackendRunc}}
	go func() {
		defer close(s.stderrDone)
		_, _ = io.Copy(s.stderr, errR)
	}()
	s.Bind(s.id, s.broken)
	s.Touch()
	s.ChannelOps = sandbox.NewChannelOps(sandbox.NewConn(bufio.NewReaderSize(outR, 64<<10), inW), s)
	if pb, err := os.ReadFile(pidFile); err == nil {
		s.pid, _ = strconv.Atoi(strings.TrimSpace(string(pb)))
	}
	if runErr != nil || s.pid <= 0 {
		s.stopChannel()
		msg, _ := os.ReadFile(logFile)
		sandbox.MetricFailures.WithLabelValues("start").Inc()
		return s, fmt.Errorf("%w: runc run: %v: %s", sandbox.ErrUnavailable, runErr, runcLogMessage(msg))
	}
	if fd, err := unix.PidfdOpen(s.pid, 0); err == nil {
		s.pidfd = os.NewFile(uintptr(fd), "pidfd")
	}
	hello, err := sandbox.AwaitHello(ctx, s.Conn, s.stderr)
	if err != nil {
		sandbox.MetricFailures.WithLabelValues("handshake").Inc()
		s.stopChannel()
		return s, err
	}
	s.Hello = hello
	return s, nil
}

// runcRoot is runc's --root: its state directory for this backend.
func (r *Runc) runcRoot() string { return filepath.Join(r.opts.StateDir, "runc") }

// runcLogMessage extracts the messages of runc's JSON log.
func runcLogMessage(b []byte) string {
	var msgs []string
	for line := range bytes.SplitSeq(bytes.TrimSpace(b), []byte("\n")) {
		var e struct {
			Msg   string `json:"msg"`
			Level string `json:"level"`
		}
		if json.Unmarshal(line, &e) == nil && e.Msg != "" {
			if e.Level == "error" || e.Level == "fatal" || e.Level == "warning" {
				msgs = append(msgs, e.Msg)
			}
		} else if len(line) > 0 {
			msgs = append(msgs, string(line))
		}
	}
	if len(msgs) == 0 {
		return "(runc logged nothing)"
	}
	return strings.Join(msgs, "; ")
}

// ociSpec is the container's OCI runtime config: what `docker run` of the
// Docker backend's container config would hand to runc, written here.
func (r *Runc) ociSpec(id string, spec sandbox.Spec, img runcImage, labels map[string]string) ([]byte, error) {
	user, optional := spec.User, false
	if user == "" {
		user, optional = "agent", true
	}
	args := append([]string{host.AgentInCtr}, r.agent.Args...)
	args = append(args, "-supervise", "-user", user, "-workdir", spec.Workdir)
	if optional {
		args = append(args, "-optional-user", "-fallback-user", img.user)
	}
	env := mergeEnv(img.env, spec.Env)
	env = append(env, "HOSTNAME="+id[len(id)-12:])
	// Only the root agent holds these: it switches to the sandbox user
	// (SETUID/SETGID), prepares the workdir (CHOWN) and kills process
	// groups of that user (KILL). Commands run without capabilities.
	caps := []string{"CAP_CHOWN", "CAP_SETUID", "CAP_SETGID", "CAP_KILL"}
	pids := spec.Limits.PIDs
	swap := spec.Limits.MemoryBytes
	period := uint64(100000)
	quota := int64(spec.Limits.CPUs * float64(period))
	ro := []string{"nosuid", "noexec", "nodev", "ro"}
	// Docker's containers get the engine's own open-files limit; these get
	// this process's (raising it past that needs CAP_SYS_RESOURCE).
	nofile := uint64(1 << 20)
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil {
		nofile = min(nofile, rl.Max)
	}
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User:            specs.User{UID: 0, GID: 0},
			Args:            args,
			Env:             env,
			Cwd:             "/",
			NoNewPrivileges: true,
			Capabilities:    &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile}},
		},
		Root:     &specs.Root{Path: "rootfs", Readonly: spec.Limits.ReadOnlyRoot},
		Hostname: id[len(id)-12:],
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: ro},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: append([]string{"relatime"}, ro...)},
			{Destination: host.AgentInCtr, Type: "bind", Source: r.agent.Path, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
			// As Docker does for its containers (the image's own are
			// empty mount points left by the engine's export).
			{Destination: "/etc/hosts", Type: "bind", Source: filepath.Join(r.paths(id).bundle, "hosts"), Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
			{Destination: "/etc/hostname", Type: "bind", Source: filepath.Join(r.paths(id).bundle, "hostname"), Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
		},
		Annotations: labels,
		Linux: &specs.Linux{
			CgroupsPath: "/rollout-runc/" + id,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: &spec.Limits.MemoryBytes, Swap: &swap},
				CPU:     &specs.LinuxCPU{Period: &period, Quota: &quota},
				Pids:    &specs.LinuxPids{Limit: &pids},
			},
			MaskedPaths: []string{"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
	if spec.Limits.ReadOnlyRoot {
		s.Mounts = append(s.Mounts,
			specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs",
				Options: []string{"rw", "nosuid", "nodev", "mode=1777", "size=" + strconv.FormatInt(min(spec.Limits.DiskBytes, 512<<20), 10)}},
			specs.Mount{Destination: spec.Workdir, Type: "tmpfs", Source: "tmpfs",
				Options: []string{"rw", "exec", "nosuid", "nodev", "mode=755", "size=" + strconv.FormatInt(spec.Limits.DiskBytes, 10)}})
	}
	s.Process.ApparmorProfile = apparmorProfile()
	prof, err := seccomp.GetDefaultProfile(s)
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: %v", err)
	}
	s.Linux.Seccomp = prof
	return json.Marshal(s)
}

// writeEtc writes the sandbox's /etc/hosts and /etc/hostname into its
// bundle (bind-mounted read-only): loopback names as Docker writes them for
// a container without network.
func writeEtc(p runcPaths, id string) error {
	host := id[len(id)-12:]
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
	if err := os.WriteFile(filepath.Join(p.bundle, "hosts"), []byte(hosts), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(p.bundle, "hostname"), []byte(host+"\n"), 0o644)
}

// apparmorProfile is Docker's docker-default when the host enforces
// AppArmor and the engine has loaded it (as Docker's containers get it),
// else none.
var apparmorProfile = sync.OnceValue(func() string {
	b, err := os.ReadFile("/sys/kernel/security/apparmor/profiles")
	if err == nil && strings.Contains(string(b), "docker-default (enforce)") {
		return "docker-default"
	}
	return ""
})

// mergeEnv is the image's environment with spec's on top, sorted by name.
func mergeEnv(image []string, spec map[string]string) []string {
	m := map[string]string{}
	for _, kv := range image {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	maps.Copy(m, spec)
	if _, ok := m["PATH"]; !ok {
		m["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// runc runs one runc command against this backend's state, bounded in time.
func (r *Runc) runc(ctx context.Context, args ...string) ([]byte, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, r.opts.Runc, append([]string{"--root", r.runcRoot()}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("runc %s: %v: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// destroy removes every trace of container id: its processes (SIGKILL to
// the namespace's init takes all of them), runc's state and cgroups, the
// overlay and the directories. Safe to call for a container that never
// started or is gone.
func (r *Runc) destroy(id string) error {
	ctx := context.Background()
	p := r.paths(id)
	var errs []error
	if _, err := os.Stat(filepath.Join(r.runcRoot(), id)); err == nil {
		if _, err := r.runc(ctx, "delete", "--force", id); err != nil {
			// Already gone between the stat and the delete counts as done.
			if _, serr := os.Stat(filepath.Join(r.runcRoot(), id)); serr == nil {
				errs = append(errs, err)
			}
		}
	}
	if err := unix.Unmount(p.rootfs(), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("unmount %s: %w", p.rootfs(), err))
	}
	for _, d := range []string{p.bundle, p.layer} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		sandbox.MetricFailures.WithLabelValues("remove").Inc()
		return fmt.Errorf("%w: remove sandbox %s: %w", sandbox.ErrUnavailable, id, errors.Join(errs...))
	}
	return nil
}

// runcState is what `runc list --format json` says of one container.
type runcState struct {
	ID          string            `json:"id"`
	Created     time.Time         `json:"created"`
	Annotations map[string]string `json:"annotations"`
}

// Reap removes the runc containers of this backend's state directory that
// no live instance owns, with their layers and bundles, by the Docker
// reaper's rules (reapReason; opts as for `rollout sandbox gc`); and layer
// directories no container owns, left by a create that died before runc
// ran, once older than LeakGrace.
func (r *Runc) Reap(ctx context.Context, opts sandbox.ReapOptions) ([]sandbox.Reaped, error) {
	out, err := r.runc(ctx, "list", "--format", "json")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrUnavailable, err)
	}
	var states []runcState
	if t := bytes.TrimSpace(out); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		if err := json.Unmarshal(t, &states); err != nil {
			return nil, fmt.Errorf("%w: runc list: %v", sandbox.ErrUnavailable, err)
		}
	}
	r.mu.Lock()
	tracked := make(map[string]bool, len(r.live))
	for id := range r.live {
		tracked[id] = true
	}
	r.mu.Unlock()
	self := map[string]string{sandbox.LabelInstance: r.opts.Instance, sandbox.LabelPID: r.labels[sandbox.LabelPID], sandbox.LabelPIDStart: r.labels[sandbox.LabelPIDStart]}
	known := map[string]bool{}
	var reaped []sandbox.Reaped
	var errs []error
	for _, st := range states {
		known[st.ID] = true
		a := st.Annotations
		if a[sandbox.LabelManaged] != "true" || a[sandbox.LabelBackend] != "runc" || tracked[st.ID] {
			continue
		}
		why := host.ReapReason(a, false, st.Created, self, r.opts.LeakGrace, opts, r.labels[sandbox.LabelHost])
		if why == "" {
			continue
		}
		if err := r.destroy(st.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		sandbox.MetricReaped.WithLabelValues(why).Inc()
		reaped = append(reaped, sandbox.Reaped{ID: st.ID, Instance: a[sandbox.LabelInstance], Reason: why})
	}
	ents, _ := os.ReadDir(filepath.Join(r.opts.DataDir, "layers"))
	for _, e := range ents {
		id := e.Name()
		if known[id] || tracked[id] || !strings.HasPrefix(id, "rollout-") {
			continue
		}
		info, err := e.Info()
		if err != nil || (!opts.All && time.Since(info.ModTime()) < r.opts.LeakGrace) {
			continue
		}
		if err := r.destroy(id); err != nil {
			errs = append(errs, err)
		}
	}
	return reaped, errors.Join(errs...)
}

// GC is Reap of the runc backend's default directories (or those of
// opts) for `rollout sandbox gc --runc`, then the removal of unpacked
// images the engine no longer has (rootfsCache.prune), reported with reason
// "image".
func GC(ctx context.Context, ro Options, opts sandbox.ReapOptions) ([]sandbox.Reaped, error) {
	ro.ReapInterval, ro.Instance = -1, "gc-"+sandbox.RandomID(8)
	r, err := New(ctx, ro)
	if err != nil {
		return nil, err
	}
	defer r.Close(context.WithoutCancel(ctx))
	reaped, err := r.Reap(ctx, opts)
	pruned, perr := r.images.prune(ctx)
	for _, id := range pruned {
		reaped = append(reaped, sandbox.Reaped{ID: id, Reason: "image"})
	}
	return reaped, errors.Join(err, perr)
}

// runcSandbox is one container run by runc.
type runcSandbox struct {
	r       *Runc
	id      string
	paths   runcPaths
	spec    sandbox.Spec
	imageID string
	pid     int      // the container's init (the agent's supervisor), host pid namespace
	pidfd   *os.File // open on pid from the start: no pid reuse can redirect a kill
	sandbox.ChannelOps
	stdin      *os.File
	stdout     *os.File
	stderrPipe *os.File
	stderrDone chan struct{}
	stderr     *sandbox.TailBuffer
	Hello      agent.Hello
	created    time.Time
	log        *slog.Logger
	applied    sandbox.Applied

	sandbox.Handle
	diskUsed atomic.Int64
	// recycle, when set (a pool that reuses sandboxes), runs first in
	// Close; true means the container was reset for a new holder.
	recycle    func(ctx context.Context) bool
	resetCount int
}

var (
	_ sandbox.Resetter        = (*runcSandbox)(nil)
	_ sandbox.Sandbox         = (*runcSandbox)(nil)
	_ sandbox.Warmable        = (*runcSandbox)(nil)
	_ sandbox.ImageIdentifier = (*runcSandbox)(nil)
	_ sandbox.LimitsReporter  = (*runcSandbox)(nil)
	_ sandbox.Labeler         = (*runcSandbox)(nil)
	_ sandbox.Quiescer        = (*runcSandbox)(nil)
)

func (s *runcSandbox) ID() string                    { return s.id }
func (s *runcSandbox) ImageID() string               { return s.imageID }
func (s *runcSandbox) Applied() sandbox.Applied      { return s.applied }
func (s *runcSandbox) Labels() map[string]string     { return maps.Clone(s.spec.Labels) }
func (s *runcSandbox) Broken() error                 { return s.Conn.Broken() }
func (s *runcSandbox) SetLabels(l map[string]string) { s.spec.Labels = l }
func (s *runcSandbox) Short() string                 { return s.id[len(s.id)-6:] }

// broken is the Handle's hook for a broken channel: it is counted, and the
// error says what happened to the container.
func (s *runcSandbox) broken(err error) error {
	sandbox.MetricFailures.WithLabelValues("channel").Inc()
	return fmt.Errorf("%w (%s)", err, s.state())
}

// state describes the container after the channel broke.
func (s *runcSandbox) state() string {
	msg := "container state unknown"
	if s.pidfd != nil {
		if err := unix.PidfdSendSignal(int(s.pidfd.Fd()), 0, nil, 0); errors.Is(err, unix.ESRCH) {
			msg = "container exited"
		} else if err == nil {
			msg = "container running"
		}
	}
	if oom := s.oomKills(); oom > 0 {
		msg += ", OOM-killed"
	}
	if e := s.stderr.String(); e != "" {
		msg += ", agent: " + e
	}
	return msg
}

// oomKills reads the memory cgroup's OOM kill count (cgroup v1 and v2).
func (s *runcSandbox) oomKills() int {
	for _, f := range []string{"/sys/fs/cgroup/memory/rollout-runc/" + s.id + "/memory.oom_control", "/sys/fs/cgroup/rollout-runc/" + s.id + "/memory.events"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				n, _ := strconv.Atoi(strings.TrimSpace(v))
				return n
			}
		}
	}
	return 0
}

// stopChannel ends the agent's channel: with stdin closed the agent exits,
// and its supervisor (the container's init) with it. It waits for the
// read loops.
func (s *runcSandbox) stopChannel() {
	_ = s.stdin.Close()
	_ = s.stdout.Close()
	<-s.Conn.Done()
	_ = s.stderrPipe.Close()
	<-s.stderrDone
}

// Close removes the container, its cgroups, its writable layer and its
// state. It is idempotent and works with a cancelled ctx.
func (s *runcSandbox) Close(ctx context.Context) error {
	return s.CloseOnce(func() error {
		if s.recycle != nil && s.recycle(ctx) {
			return nil
		}
		if s.pidfd != nil {
			// The namespace's init first: the kernel then kills every
			// process in the sandbox, so nothing of it runs while runc
			// cleans up.
			_ = unix.PidfdSendSignal(int(s.pidfd.Fd()), unix.SIGKILL, nil, 0)
		}
		// Until the init has exited, runc would still find the container
		// running and poll for it in 100 ms steps.
		waitExit(s.pidfd, 5*time.Second)
		s.stopChannel()
		err := s.r.destroy(s.id)
		// The init was orphaned when runc exited: where this process is
		// the pid namespace's init (rollout in a container) or a
		// subreaper, it is this process's child now and its zombie ours
		// to reap. Anywhere else this finds no child of ours.
		if s.pid > 0 {
			_, _ = unix.Wait4(s.pid, nil, unix.WNOHANG, nil)
		}
		if s.pidfd != nil {
			_ = s.pidfd.Close()
		}
		sandbox.Forget(&s.r.mu, s.r.live, s.id, s.r.slots)
		return err
	})
}

func (s *runcSandbox) DiskTarget() (string, int64) { return s.paths.upper(), s.spec.Limits.DiskBytes }
func (s *runcSandbox) Expiry(now time.Time) string {
	return host.Expiry(s.spec.Limits, now, s.created, s.LastUsed.Load(), s.Pooled.Load())
}
func (s *runcSandbox) SetDiskUsed(n int64) { s.diskUsed.Store(n) }
func (s *runcSandbox) Evict(ctx context.Context, why string) error {
	s.Reason.Store(why)
	return s.Close(ctx)
}

// waitExit waits up to d for the process behind pidfd (nil: none) to exit.
func waitExit(pidfd *os.File, d time.Duration) {
	if pidfd == nil {
		return
	}
	fds := []unix.PollFd{{Fd: int32(pidfd.Fd()), Events: unix.POLLIN}}
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		n, err := unix.Poll(fds, int(left/time.Millisecond)+1)
		if n > 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
			return
		}
	}
}

// Client is the local engine the backend takes its images from (task
// images are built there).
func (r *Runc) Client() *client.Client { return r.cli }

func (s *runcSandbox) OnClose(fn func(ctx context.Context) bool) { s.recycle = fn }

func (s *runcSandbox) Resets() int { return s.resetCount }

// ResetInPlace is the Docker sandbox's (sandbox/docker/docker_reuse.go) for a runc container: the
// agent empties the writable mounts of a read-only root, and the new handle
// takes over the container, its pipes and its slot.
func (s *runcSandbox) ResetInPlace(ctx context.Context, spec sandbox.Spec) (sandbox.Warmable, error) {
	if !s.spec.Limits.ReadOnlyRoot {
		return nil, fmt.Errorf("reset sandbox %s: %w: only a read-only root can be reset in place", s.id, sandbox.ErrInvalid)
	}
	res, err := sandbox.ResetAgent(ctx, &s.ChannelOps, s.id, []string{"/tmp", s.Hello.Workdir, "/dev/shm", "/dev/mqueue"})
	if err != nil {
		return nil, err
	}
	ns := &runcSandbox{r: s.r, id: s.id, paths: s.paths, spec: spec, imageID: s.imageID, pid: s.pid, pidfd: s.pidfd,
		stdin: s.stdin, stdout: s.stdout, stderrPipe: s.stderrPipe, stderrDone: s.stderrDone, stderr: s.stderr,
		Hello: s.Hello, created: time.Now(), log: s.log, applied: s.applied, resetCount: s.resetCount + 1}
	ns.Bind(ns.id, ns.broken)
	ns.ChannelOps = sandbox.NewChannelOps(s.Conn, ns)
	ns.Touch()
	s.r.mu.Lock()
	if s.r.closed {
		s.r.mu.Unlock()
		return nil, fmt.Errorf("reset sandbox %s: %w: backend closed", s.id, sandbox.ErrClosed)
	}
	// From here the new handle owns the container and its slot.
	s.r.live[s.id] = ns
	s.r.mu.Unlock()
	sandbox.LogReset(s.log, ns.resetCount, res)
	return ns, nil
}
