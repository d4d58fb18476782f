package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/agent"
	"github.com/rollout-rl/rollout/sandbox/host"
)

// runscPIDsHeadroom is added to the pids limit of runsc containers.
const runscPIDsHeadroom = 1024

// Delivery modes for the agent binary.
const (
	DeliveryAuto = ""     // bind when the engine is local, else copy
	DeliveryBind = "bind" // read-only bind mount of the host file
	DeliveryCopy = "copy" // CopyToContainer before start
)

// Options configure a Docker backend. Zero values take defaults.
type Options struct {
	// Host are the settings shared with the runc backend (instance,
	// capacity, reaper, disk watchdog, agent, logger, host admission).
	host.Options
	MaxParallelCreates int           // creates in flight at once (default 8), lowered while the daemon is slow
	SlowCreate         time.Duration // a create slower than this halves the parallelism (default 5s)
	CreateRate         float64       // creates per second (default 50)
	Delivery           string
	// Channel: ChannelAuto (default) carries calls over a unix socket
	// between host and agent when the engine is local (socket.go), with
	// the attach stream as lifetime and fallback; ChannelAttach uses the
	// attach stream only.
	Channel string
}

// Docker creates sandboxes as local Docker containers. It is safe for
// concurrent use.
type Docker struct {
	cli    *client.Client
	opts   Options
	log    *slog.Logger
	agent  sandbox.AgentBinary
	labels map[string]string
	bind   bool
	// sockRoot holds per-sandbox socket directories; "" when the socket
	// channel is off (remote engine, ChannelAttach).
	sockRoot string
	sockWarn sync.Once
	slots    *sandbox.SlotSem
	gate     *sandbox.CreateGate
	rate     *sandbox.RateLimiter
	egress   egressState
	host     host.HostState
	probe    host.HostProbe

	mu     sync.Mutex
	live   map[string]*dockerSandbox // by container id
	images map[string]imageInfo
	closed bool

	stop     context.CancelFunc
	reaper   sync.WaitGroup
	watchdog *watchdog // docker_watchdog.go
}

type imageInfo struct{ user, id string }

var _ sandbox.Backend = (*Docker)(nil)

// NewDocker connects to the engine, removes orphans of dead instances and
// starts the periodic reaper.
func New(ctx context.Context, opts Options) (*Docker, error) {
	cli, err := dockerclient.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
	}
	d, err := newDocker(cli, opts)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.stop = cancel
	sockDir := ""
	if d.sockRoot != "" {
		sockDir = filepath.Join(d.sockRoot, d.opts.Instance)
	}
	d.watchdog = startWatchdog(d.labels, sockDir, d.log)
	if d.opts.ReapInterval > 0 {
		if _, err := d.Reap(ctx, sandbox.ReapOptions{}); err != nil {
			d.log.Warn("start-up reap failed", "err", err)
		}
		d.reaper.Go(func() { d.reapLoop(rctx) })
	}
	d.reaper.Go(func() { d.diskLoop(rctx) })
	return d, nil
}

func newDocker(cli *client.Client, opts Options) (*Docker, error) {
	opts.Defaults()
	if opts.MaxParallelCreates <= 0 {
		opts.MaxParallelCreates = 8
	}
	if opts.SlowCreate <= 0 {
		opts.SlowCreate = 5 * time.Second
	}
	if opts.CreateRate <= 0 {
		opts.CreateRate = 50
	}
	ab, err := sandbox.AgentOption(opts.Agent)
	if err != nil {
		return nil, err
	}
	bind := false
	switch opts.Delivery {
	case DeliveryBind:
		bind = true
	case DeliveryCopy:
	case DeliveryAuto:
		h := dockerclient.Host()
		bind = strings.HasPrefix(h, "unix://") || strings.HasPrefix(h, "/")
	default:
		return nil, fmt.Errorf("%w: agent delivery %q (want bind or copy)", sandbox.ErrInvalid, opts.Delivery)
	}
	var sockRoot string
	switch opts.Channel {
	case ChannelAuto:
		if bind {
			sockRoot = socketRoot()
			if err := prepareSocketRoot(sockRoot); err != nil {
				opts.Logger.Warn("socket channel off: attach stream only", "dir", sockRoot, "err", err)
				sockRoot = ""
			}
		}
	case ChannelAttach:
	default:
		return nil, fmt.Errorf("%w: channel %q (want %q or empty for auto)", sandbox.ErrInvalid, opts.Channel, ChannelAttach)
	}
	d := &Docker{
		sockRoot: sockRoot,
		cli:      cli,
		opts:     opts,
		log:      opts.Logger.With("sandbox_instance", opts.Instance),
		agent:    ab,
		labels:   host.OwnerLabels(opts.Instance),
		bind:     bind,
		slots:    sandbox.NewSlotSem(opts.MaxContainers),
		gate:     sandbox.NewCreateGate(opts.MaxParallelCreates, opts.SlowCreate),
		rate:     sandbox.NewRateLimiter(opts.CreateRate, opts.MaxParallelCreates),
		live:     map[string]*dockerSandbox{},
		images:   map[string]imageInfo{},
		probe:    host.ProcHost{},
	}
	return d, nil
}

// Instance is the id in the instance label of this backend's containers.
func (d *Docker) Instance() string { return d.opts.Instance }

// BaseLabels are the labels every container of this backend carries (for
// baselines such as MeasureDockerRun, so the reaper can find their leftovers).
func (d *Docker) BaseLabels() map[string]string { return maps.Clone(d.labels) }

// Client exposes the engine client (benchmarks, the CLI).
func (d *Docker) Client() *client.Client { return d.cli }

// Close removes every sandbox this backend still owns and stops the reaper.
func (d *Docker) Close(ctx context.Context) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	live := make([]*dockerSandbox, 0, len(d.live))
	for _, s := range d.live {
		live = append(live, s)
	}
	d.mu.Unlock()
	if d.stop != nil {
		d.stop()
	}
	d.reaper.Wait()
	errs := sandbox.CloseAll(ctx, live, sandbox.CloseParallel)
	if d.sockRoot != "" {
		_ = os.RemoveAll(filepath.Join(d.sockRoot, d.opts.Instance))
	}
	d.watchdog.stop()
	errs = append(errs, d.cli.Close())
	return errors.Join(errs...)
}

// transient reports daemon errors worth a retry.
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	return client.IsErrConnectionFailed(err) || cerrdefs.IsUnavailable(err) || cerrdefs.IsInternal(err) ||
		cerrdefs.IsDeadlineExceeded(err) || errors.Is(err, context.DeadlineExceeded)
}

// daemon runs one Engine API call with a bounded timeout, metrics and
// backoff-and-retry on transient errors. The call never sees the caller's
// cancellation: a create that the daemon completes after the client gave up
// would leak; callers check their ctx between calls instead.
func (d *Docker) daemon(ctx context.Context, op string, timeout time.Duration, fn func(ctx context.Context) error) error {
	base := context.WithoutCancel(ctx)
	var err error
	for attempt := range 4 {
		if attempt > 0 {
			back := time.Duration(100<<attempt)*time.Millisecond + time.Duration(mrand.Int64N(int64(100*time.Millisecond)))
			d.log.Warn("docker call failed, retrying", "op", op, "attempt", attempt, "backoff", back, "err", err)
			time.Sleep(back)
		}
		cctx, cancel := context.WithTimeout(base, timeout)
		start := time.Now()
		err = fn(cctx)
		sandbox.MetricDaemon.WithLabelValues(op).Observe(time.Since(start).Seconds())
		cancel()
		if !transient(err) {
			return err
		}
	}
	return err
}

// validate applies the backend-independent checks; the Docker backend builds
// everything they admit.
func (d *Docker) Validate(spec *sandbox.Spec) error { return sandbox.ValidateSpec(spec) }

func (d *Docker) image(ctx context.Context, ref string) (imageInfo, error) {
	d.mu.Lock()
	info, ok := d.images[ref]
	d.mu.Unlock()
	if ok {
		return info, nil
	}
	var res client.ImageInspectResult
	err := d.daemon(ctx, "image_inspect", 30*time.Second, func(ctx context.Context) (err error) {
		res, err = d.cli.ImageInspect(ctx, ref)
		return err
	})
	if cerrdefs.IsNotFound(err) {
		return imageInfo{}, fmt.Errorf("%w: image %s is not present locally (build it first, e.g. `rollout sandbox image build`)", sandbox.ErrInvalid, ref)
	}
	if err != nil {
		return imageInfo{}, fmt.Errorf("%w: inspect image %s: %v", sandbox.ErrUnavailable, ref, err)
	}
	if res.Config != nil {
		info.user = res.Config.User
	}
	info.id = res.ID
	d.mu.Lock()
	d.images[ref] = info
	d.mu.Unlock()
	return info, nil
}

// Create starts a sandbox for spec. It waits for admission (MaxContainers,
// create rate) as long as ctx allows.
func (d *Docker) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	start := time.Now()
	s, err := d.create(ctx, spec, nil, sandbox.SlotWait)
	if err != nil {
		return nil, err
	}
	sandbox.MetricAcquire.WithLabelValues("create").Observe(time.Since(start).Seconds())
	return s, nil
}

func (d *Docker) create(ctx context.Context, spec sandbox.Spec, extraLabels map[string]string, slot sandbox.SlotMode) (_ *dockerSandbox, err error) {
	// holding: this call owns a slot it must give back unless the sandbox
	// is handed out (then Close gives it back).
	holding := slot == sandbox.SlotHeld
	defer func() {
		if holding {
			d.slots.Release()
		}
	}()
	if err := d.prepare(&spec); err != nil {
		return nil, err
	}
	if err := d.takeSlot(ctx, slot); err != nil {
		return nil, err
	}
	holding = true
	if err := d.admit(ctx, spec, slot == sandbox.SlotWait); err != nil {
		return nil, err
	}
	gateStart := time.Now()
	defer func() { d.gate.Release(time.Since(gateStart), err == nil) }()

	img, err := d.image(ctx, spec.Image)
	if err != nil {
		sandbox.MetricFailures.WithLabelValues("create").Inc()
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	if spec.Network == sandbox.NetworkBridge {
		if err := d.ensureEgress(ctx); err != nil {
			sandbox.MetricFailures.WithLabelValues("create").Inc()
			return nil, fmt.Errorf("create sandbox: %w", err)
		}
	}
	name := "rollout-" + d.opts.Instance + "-" + sandbox.RandomID(6)
	sock := d.socketFor(name, spec)
	defer sock.close()
	cfg, hc := d.containerConfig(spec, img, extraLabels, sock)
	id, err := d.createContainer(ctx, spec, name, cfg, hc)
	if err != nil {
		return nil, err
	}
	log := d.log.With("container", id[:12])
	// Guard: from here every failure removes the container.
	var hj client.HijackedResponse
	hjOpen := false
	defer func() {
		if err != nil {
			if hjOpen {
				hj.Close()
			}
			d.removeContainer(ctx, id)
		}
	}()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	applied, upperDir, err := d.inspectCreated(ctx, id, spec)
	if err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id[:12], err)
	}
	if !d.bind {
		if err := d.copyAgent(ctx, id); err != nil {
			return nil, err
		}
	}
	if hj, err = d.attach(ctx, id); err != nil {
		return nil, err
	}
	hjOpen = true
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	s := &dockerSandbox{d: d, id: id, name: name, spec: spec, imageID: img.id, hj: hj, created: time.Now(), log: log, stderr: sandbox.NewTailBuffer(8 << 10),
		applied: applied, upperDir: upperDir}
	s.Bind(s.Short(), s.broken)
	s.Touch()
	// The attach stream is demultiplexed in the channel's read loop; demux
	// is closed when that loop ended.
	s.ChannelOps = sandbox.NewChannelOps(sandbox.NewConn(&demuxReader{r: hj.Reader, stderr: s.stderr}, hj.Conn), s)
	s.demux = s.Conn.Done()
	if err := d.start(ctx, s, sock); err != nil {
		hjOpen = false // start closed it
		return nil, err
	}
	holding = false
	sandbox.MetricCreates.Inc()
	if ferr := sandbox.PlaceFiles(ctx, s, spec.Files); ferr != nil {
		_ = s.Close(ctx)
		err = ferr
		return nil, fmt.Errorf("create sandbox %s: %w", id[:12], ferr)
	}
	log.Debug("sandbox started", "image", spec.Image, "user", s.Hello.User, "uid", s.Hello.UID)
	return s, nil
}

// start starts the created container, awaits the agent's hello, moves the
// calls to the socket channel when there is one, and registers the
// sandbox. On failure it has closed the channel and waited for its read
// loop, so the caller only removes the container.
func (d *Docker) start(ctx context.Context, s *dockerSandbox, sock *sockListener) (err error) {
	defer func() {
		if err != nil {
			s.hj.Close()
			s.closeSocket()
			<-s.demux
		}
	}()
	err = d.daemon(ctx, "container_start", 60*time.Second, func(cctx context.Context) error {
		_, err := d.cli.ContainerStart(cctx, s.id, client.ContainerStartOptions{})
		return err
	})
	if err != nil {
		sandbox.MetricFailures.WithLabelValues("start").Inc()
		return fmt.Errorf("create sandbox %s: start: %w: %v", s.Short(), sandbox.ErrUnavailable, err)
	}
	hello, err := s.handshake(ctx)
	if err != nil {
		sandbox.MetricFailures.WithLabelValues("handshake").Inc()
		return fmt.Errorf("create sandbox %s: %w", s.Short(), err)
	}
	s.Hello = hello
	if sock != nil {
		if err := s.takeSocket(ctx, sock); err != nil {
			return err
		}
	}
	return d.register(s)
}

// socketFor is the socket channel's listener for container name, nil when
// the sandbox stays on the attach stream: no local socket directory, a
// runtime other than runc (gVisor refuses a connect to a host socket on a
// bind mount, EPERM), or a listen that failed (warned once).
func (d *Docker) socketFor(name string, spec sandbox.Spec) *sockListener {
	if d.sockRoot == "" || spec.Runtime != sandbox.RuntimeRunc {
		return nil
	}
	sock, err := d.listen(name)
	if err != nil {
		d.sockWarn.Do(func() { d.log.Warn("socket channel: cannot listen, using the attach stream", "err", err) })
		return nil
	}
	return sock
}

// prepare copies the spec's maps (the caller keeps its own), validates it
// and refuses a create on a closed backend.
func (d *Docker) prepare(spec *sandbox.Spec) error {
	spec.Labels = maps.Clone(spec.Labels)
	spec.Env = maps.Clone(spec.Env)
	if err := d.Validate(spec); err != nil {
		return fmt.Errorf("create sandbox: %w: %v", sandbox.ErrInvalid, err)
	}
	if spec.Limits.ReadOnlyRoot && !d.bind {
		// The engine refuses CopyToContainer into a read-only root.
		return fmt.Errorf("create sandbox: %w: a read-only root needs the bind-mounted agent (local engine); not implemented yet for copy delivery", sandbox.ErrInvalid)
	}
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return fmt.Errorf("create sandbox: %w: backend closed", sandbox.ErrClosed)
	}
	return nil
}

// takeSlot is admission under MaxContainers: a slot held until Close,
// waited for (SlotWait) or already held by the caller (SlotHeld).
func (d *Docker) takeSlot(ctx context.Context, slot sandbox.SlotMode) error {
	switch slot {
	case sandbox.SlotWait:
		if err := d.slots.Acquire(ctx); err != nil {
			return fmt.Errorf("create sandbox: waiting for a free slot (%d in use): %w", d.slots.Cap, err)
		}
	case sandbox.SlotHeld:
	default:
		return fmt.Errorf("create sandbox: %w: unknown slot mode %d", sandbox.ErrInvalid, slot)
	}
	return nil
}

// admit waits for the host's room, the create rate and a create turn; on
// success the caller holds the create gate and must release it.
func (d *Docker) admit(ctx context.Context, spec sandbox.Spec, wait bool) error {
	if err := d.admitHost(ctx, spec, wait); err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	if err := d.rate.Wait(ctx); err != nil {
		return fmt.Errorf("create sandbox: waiting for the create rate limit: %w", err)
	}
	if err := d.gate.Acquire(ctx); err != nil {
		return fmt.Errorf("create sandbox: waiting for a create turn: %w", err)
	}
	return nil
}

// createContainer creates the container name and returns its id. A failed
// create is classed (an unknown runtime or a bad argument is ErrInvalid,
// anything else ErrUnavailable) and whatever the daemon may have made is
// removed.
func (d *Docker) createContainer(ctx context.Context, spec sandbox.Spec, name string, cfg *container.Config, hc *container.HostConfig) (string, error) {
	var id string
	err := d.daemon(ctx, "container_create", 60*time.Second, func(cctx context.Context) error {
		res, err := d.cli.ContainerCreate(cctx, client.ContainerCreateOptions{Config: cfg, HostConfig: hc, Name: name})
		if cerrdefs.IsConflict(err) && id == "" {
			// An earlier attempt reached the daemon although its answer was lost.
			ins, ierr := d.cli.ContainerInspect(cctx, name, client.ContainerInspectOptions{})
			if ierr == nil {
				id = ins.Container.ID
				return nil
			}
		}
		if err == nil {
			id = res.ID
		}
		return err
	})
	if err == nil {
		return id, nil
	}
	sandbox.MetricFailures.WithLabelValues("create").Inc()
	// The create may still have happened on the daemon; remove by name.
	d.removeContainer(ctx, name)
	if spec.Runtime != sandbox.RuntimeRunc && strings.Contains(strings.ToLower(err.Error()), "runtime") {
		return "", fmt.Errorf("create sandbox from %s: %w: runtime %s: %v (register it with the engine: scripts/ensure-runsc.sh)", spec.Image, sandbox.ErrInvalid, spec.Runtime, err)
	}
	if cerrdefs.IsInvalidArgument(err) {
		return "", fmt.Errorf("create sandbox from %s: %w: %v", spec.Image, sandbox.ErrInvalid, err)
	}
	return "", fmt.Errorf("create sandbox from %s: %w: %v", spec.Image, sandbox.ErrUnavailable, err)
}

// copyAgent puts the agent binary into the created container when it
// cannot be bind-mounted (a remote engine).
func (d *Docker) copyAgent(ctx context.Context, id string) error {
	tarball, err := agentTar(d.agent.Path)
	if err != nil {
		return fmt.Errorf("create sandbox: %w: %v", sandbox.ErrInvalid, err)
	}
	err = d.daemon(ctx, "copy_to_container", 60*time.Second, func(cctx context.Context) error {
		_, err := d.cli.CopyToContainer(cctx, id, client.CopyToContainerOptions{DestinationPath: "/", Content: bytes.NewReader(tarball)})
		return err
	})
	if err != nil {
		sandbox.MetricFailures.WithLabelValues("create").Inc()
		return fmt.Errorf("create sandbox %s: copy agent: %w: %v", id[:12], sandbox.ErrUnavailable, err)
	}
	return nil
}

// attach opens the container's attach stream. It runs before the start so
// no byte of the agent's output is missed.
func (d *Docker) attach(ctx context.Context, id string) (client.HijackedResponse, error) {
	var hj client.HijackedResponse
	err := d.daemon(ctx, "container_attach", 30*time.Second, func(cctx context.Context) error {
		res, err := d.cli.ContainerAttach(cctx, id, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
		if err == nil {
			hj = res.HijackedResponse
		}
		return err
	})
	if err != nil {
		sandbox.MetricFailures.WithLabelValues("start").Inc()
		return client.HijackedResponse{}, fmt.Errorf("create sandbox %s: attach: %w: %v", id[:12], sandbox.ErrUnavailable, err)
	}
	return hj, nil
}

// takeSocket moves the sandbox's calls to the socket channel when the
// agent connected to it; the attach stream stays as lifetime and fallback.
// The agent not connecting is no error (the attach stream serves), only
// ctx ending while it is awaited.
func (s *dockerSandbox) takeSocket(ctx context.Context, sock *sockListener) error {
	d, hello := s.d, s.Hello
	if !hello.Socket {
		d.sockWarn.Do(func() {
			d.log.Warn("socket channel: the agent could not connect, using the attach stream", "err", hello.SocketErr)
		})
		return nil
	}
	sc, raw, err := sock.accept(ctx, hello)
	switch {
	case err == nil:
		s.attach, s.sock = s.Conn, raw
		s.ChannelOps.Conn = sc
	case ctx.Err() != nil:
		return fmt.Errorf("create sandbox: %w", ctx.Err())
	default:
		d.sockWarn.Do(func() {
			d.log.Warn("socket channel: no connection from the agent, using the attach stream", "err", err)
		})
	}
	return nil
}

// register makes s one of the backend's live sandboxes, unless the backend
// closed meanwhile.
func (d *Docker) register(s *dockerSandbox) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("create sandbox: %w: backend closed", sandbox.ErrClosed)
	}
	d.live[s.id] = s
	sandbox.MetricLive.Set(float64(len(d.live)))
	return nil
}

func (d *Docker) containerConfig(spec sandbox.Spec, img imageInfo, extraLabels map[string]string, sock *sockListener) (*container.Config, *container.HostConfig) {
	labels := maps.Clone(d.labels)
	maps.Copy(labels, spec.Labels)
	maps.Copy(labels, extraLabels)
	env := make([]string, 0, len(spec.Env))
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	user, optional := spec.User, false
	if user == "" {
		user, optional = "agent", true
	}
	cmd := append(append([]string(nil), d.agent.Args...), "-user", user, "-workdir", spec.Workdir)
	if optional {
		cmd = append(cmd, "-optional-user", "-fallback-user", img.user)
	}
	if sock != nil {
		cmd = append(cmd, "-socket", sockInCtr+"/"+sockName)
	}
	// StdinOnce + AutoRemove bind the container to its owner (sandbox/host/owner.go).
	cfg := &container.Config{
		Image:        spec.Image,
		User:         "0:0",
		Env:          env,
		Labels:       labels,
		Entrypoint:   []string{host.AgentInCtr},
		Cmd:          cmd,
		WorkingDir:   "/",
		OpenStdin:    true,
		StdinOnce:    true,
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
	}
	init := true
	pids := spec.Limits.PIDs
	if spec.Runtime == sandbox.RuntimeRunsc {
		// Under gVisor the container's pids cgroup holds the sentry (a Go
		// program whose host threads grow with the sandbox's activity),
		// not the sandbox's processes: the limit gets headroom for it, or
		// the sentry itself dies. The sandbox's processes are tasks inside
		// the sentry, bounded by its memory limit.
		pids += runscPIDsHeadroom
	}
	netMode := spec.Network
	switch spec.Network {
	case sandbox.NetworkBridge:
		netMode = EgressNetwork
	case sandbox.NetworkOpen:
		netMode = "bridge"
	}
	runtime := ""
	if spec.Runtime != sandbox.RuntimeRunc {
		runtime = spec.Runtime
	}
	hc := &container.HostConfig{
		NetworkMode: container.NetworkMode(netMode),
		Runtime:     runtime,
		// Only the root agent holds these: it switches to the sandbox user
		// (SETUID/SETGID), prepares the workdir (CHOWN) and kills process
		// groups of that user (KILL). Commands run without capabilities.
		CapDrop:        []string{"ALL"},
		CapAdd:         []string{"CHOWN", "SETUID", "SETGID", "KILL"},
		SecurityOpt:    []string{"no-new-privileges"},
		Init:           &init,
		AutoRemove:     true,
		ReadonlyRootfs: spec.Limits.ReadOnlyRoot,
		// The protocol runs over stdout; a log driver would copy every
		// transferred byte to the daemon's disk.
		LogConfig: container.LogConfig{Type: "none"},
		Resources: container.Resources{
			Memory:     spec.Limits.MemoryBytes,
			MemorySwap: spec.Limits.MemoryBytes,
			NanoCPUs:   int64(spec.Limits.CPUs * 1e9),
			PidsLimit:  &pids,
		},
	}
	if spec.Runtime == sandbox.RuntimeRunsc {
		// The pids cgroup does not see gVisor's tasks (above); the sentry
		// enforces RLIMIT_NPROC per user of its own kernel, which holds
		// only this sandbox, so the sandbox user's processes are bounded
		// by the configured limit there (docs/security.md, "Limits on every
		// backend"). The root agent is exempt, as from any RLIMIT_NPROC.
		hc.Ulimits = append(hc.Ulimits, &container.Ulimit{Name: "nproc", Soft: spec.Limits.PIDs, Hard: spec.Limits.PIDs})
	}
	if spec.Limits.ReadOnlyRoot {
		hc.Tmpfs = map[string]string{
			"/tmp":       "rw,nosuid,nodev,size=" + strconv.FormatInt(min(spec.Limits.DiskBytes, 512<<20), 10),
			spec.Workdir: "rw,exec,nosuid,nodev,size=" + strconv.FormatInt(spec.Limits.DiskBytes, 10),
		}
	}
	if d.bind {
		hc.Mounts = []mount.Mount{{Type: mount.TypeBind, Source: d.agent.Path, Target: host.AgentInCtr, ReadOnly: true}}
	}
	if sock != nil {
		// Read-only: the agent connects to the host's socket (connect needs
		// no write access to the mount), and nothing in the container can
		// create files in the host directory.
		hc.Mounts = append(hc.Mounts, mount.Mount{Type: mount.TypeBind, Source: sock.dir, Target: sockInCtr, ReadOnly: true})
	}
	return cfg, hc
}

// agentTar wraps the agent binary for CopyToContainer.
func agentTar(p string) ([]byte, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("read agent: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: ".rollout/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(host.AgentInCtr, "/"), Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data))})
	_, _ = tw.Write(data)
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// removeContainer force-removes a container, also after the caller's ctx
// was cancelled. A missing container counts as removed.
func (d *Docker) removeContainer(ctx context.Context, id string) error {
	err := d.daemon(ctx, "container_remove", 60*time.Second, func(cctx context.Context) error {
		_, err := d.cli.ContainerRemove(cctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		return err
	})
	if err == nil || cerrdefs.IsNotFound(err) {
		return nil
	}
	if strings.Contains(err.Error(), "already in progress") {
		// The engine is removing it already (AutoRemove after the agent
		// exited): Close promises the container is gone, so wait for that.
		return d.waitRemoved(ctx, id)
	}
	sandbox.MetricFailures.WithLabelValues("remove").Inc()
	return fmt.Errorf("remove container %s: %w: %v", id, sandbox.ErrUnavailable, err)
}

// waitRemoved polls until the container is gone (bounded by 30 s).
func (d *Docker) waitRemoved(ctx context.Context, id string) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for {
		_, err := d.cli.ContainerInspect(cctx, id, client.ContainerInspectOptions{})
		if cerrdefs.IsNotFound(err) {
			return nil
		}
		if cctx.Err() != nil {
			return fmt.Errorf("remove container %s: %w: still present after 30s", id, sandbox.ErrUnavailable)
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-t.C:
		case <-cctx.Done():
			t.Stop()
		}
	}
}

var (
	_ sandbox.Quiescer    = (*dockerSandbox)(nil)
	_ sandbox.Sandbox     = (*dockerSandbox)(nil)
	_ sandbox.StdinCloser = (*dockerSandbox)(nil)
	_ sandbox.Labeler     = (*dockerSandbox)(nil)
)

type dockerSandbox struct {
	d       *Docker
	id      string
	name    string
	spec    sandbox.Spec
	imageID string // the image's content-addressed id (sha256:…)
	hj      client.HijackedResponse
	sandbox.ChannelOps
	demux   <-chan struct{}
	attach  *sandbox.Conn // the attach stream's channel when calls go over the socket (else nil: conn is it)
	sock    net.Conn      // the socket channel's connection, nil on the attach stream
	stderr  *sandbox.TailBuffer
	Hello   agent.Hello
	created time.Time
	log     *slog.Logger

	sandbox.Handle
	applied  sandbox.Applied // limits read back from the created container
	upperDir string          // host path of the writable layer ("" unknown)
	diskUsed atomic.Int64    // last measured by the disk watchdog
	// recycle, when set (a pool that reuses sandboxes), runs first in
	// Close; true means the container was reset for a new holder.
	recycle    func(ctx context.Context) bool
	resetCount int // resets in place before this handle (docker_reuse.go)
}

func (s *dockerSandbox) Broken() error                 { return s.Conn.Broken() }
func (s *dockerSandbox) SetLabels(l map[string]string) { s.spec.Labels = l }

func (d *Docker) Logger() *slog.Logger { return d.log }

func (d *Docker) SlotSem() *sandbox.SlotSem { return d.slots }

// createWarm is create for a Pool; block is not needed here: the slot
// (MaxContainers) is the Docker backend's admission.
func (d *Docker) CreateWarm(ctx context.Context, spec sandbox.Spec, extra map[string]string, slot sandbox.SlotMode, _ bool) (sandbox.Warmable, error) {
	s, err := d.create(ctx, spec, extra, slot)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (s *dockerSandbox) handshake(ctx context.Context) (agent.Hello, error) {
	return sandbox.AwaitHello(ctx, s.Conn, s.stderr)
}

// ID is the container id.
func (s *dockerSandbox) ID() string { return s.id }

// Transport says which channel carries the sandbox's calls: "socket" or
// "attach".
func (s *dockerSandbox) Transport() string {
	if s.sock != nil {
		return "socket"
	}
	return "attach"
}

// closeSocket ends the socket channel (its read loop sees the close).
func (s *dockerSandbox) closeSocket() {
	if s.sock != nil {
		_ = s.sock.Close()
	}
}

// ImageID is the content-addressed id of the image the sandbox runs
// (ImageIdentifier), for reproducibility manifests.
func (s *dockerSandbox) ImageID() string { return s.imageID }

var _ sandbox.ImageIdentifier = (*dockerSandbox)(nil)

// Labels returns the caller labels of the spec (for pooled sandboxes they
// exist only here, not on the container).
func (s *dockerSandbox) Labels() map[string]string { return maps.Clone(s.spec.Labels) }

func (s *dockerSandbox) Short() string { return s.id[:12] }

// broken is the Handle's hook for a broken channel: it is counted, and the
// error says what happened to the container.
func (s *dockerSandbox) broken(err error) error {
	sandbox.MetricFailures.WithLabelValues("channel").Inc()
	return fmt.Errorf("%w (%s)", err, s.state())
}

// state describes the container after the channel broke.
func (s *dockerSandbox) state() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := s.d.cli.ContainerInspect(ctx, s.id, client.ContainerInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return "container was removed"
	}
	if err != nil || res.Container.State == nil {
		return "container state unknown"
	}
	st := res.Container.State
	msg := fmt.Sprintf("container %s, exit code %d", st.Status, st.ExitCode)
	if st.OOMKilled {
		msg += ", OOM-killed"
	}
	if e := s.stderr.String(); e != "" {
		msg += ", agent: " + e
	}
	return msg
}

// Close removes the container, or hands it back to a pool that resets it in
// place for its next holder (PoolOptions.Reuse). It is idempotent and works
// with a cancelled ctx (removal runs detached, bounded by its own timeout).
func (s *dockerSandbox) Close(ctx context.Context) error {
	return s.CloseOnce(func() error {
		if s.recycle != nil && s.recycle(ctx) {
			return nil
		}
		s.hj.Close()
		s.closeSocket()
		err := s.d.removeContainer(ctx, s.id)
		<-s.demux
		<-s.Conn.Done()
		sandbox.Forget(&s.d.mu, s.d.live, s.id, s.d.slots)
		return err
	})
}
