// Package job assembles one collection run from a runner.Config: the env,
// the policy, a lazily started Docker sandbox backend, the task-image
// builder and the sinks (Parquet trajectories, plus any the caller adds).
// `rollout run|eval|demo` and the gRPC service share it, so a job means the
// same thing everywhere.
package assemble

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/internal/util/imageref"
	"github.com/rollout-rl/rollout/internal/util/version"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/sandbox/host"
	"github.com/rollout-rl/rollout/sandbox/image"
	"github.com/rollout-rl/rollout/sandbox/kubernetes"
	"github.com/rollout-rl/rollout/sandbox/kubernetes/k8sconfig"
	"github.com/rollout-rl/rollout/sandbox/runc"
	"github.com/rollout-rl/rollout/trajectory"

	// The built-in env protocols (env_server.protocol of YAML envs).
	_ "github.com/rollout-rl/rollout/envs/protocol/builtin"
)

// Modes of a job.
const (
	ModeRun     = "run"     // training collection: eval-only envs are refused
	ModeEval    = "eval"    // evaluation: eval split by default, a report at the end
	ModeCollect = "collect" // trainer-driven: groups on demand; Parquet only when output.dir is set
)

// Options are what the caller adds to the config.
type Options struct {
	Mode     string
	Logger   *slog.Logger
	Progress func(runner.Event)
	// Sandboxes, when set, is a shared backend (the server's); otherwise
	// the job starts its own Docker backend on first use and stops it at
	// the end.
	Sandboxes runner.Sandboxes
	Images    runner.ImageBuilder
	// Lock is the output dir's writer lock when the caller took it
	// already (LockOutput), because it writes there before Open; the job
	// then owns it. Nil: Open takes it.
	Lock *trajectory.DirLock
	// Sinks are added after the Parquet sink.
	Sinks []runner.Sink
	// Items replaces the dataset (trainer-driven collection).
	Items []datasets.Item
	RunID string
	// SandboxInstance names the job's own Docker backend in the instance
	// label of its containers (default: random); ignored with Sandboxes.
	SandboxInstance string
	// NoJournal turns the trajectory journal off (durability off: a crash
	// loses the groups of the open part file). For measurements only.
	NoJournal bool
}

// Job is an assembled run.
type Job struct {
	cfg     runner.Config
	opts    Options
	Env     envs.Env
	Runner  *runner.Runner
	writer  *trajectory.Writer
	backend *lazyBackend // the job's own sandbox backend; nil with a shared one
	// release gives back the job's sandboxes when it ends: its own
	// backend's Close, or a shared backend's Release (its scope).
	release func(context.Context) error
	Dir     string
	// sampler reports the run's effective sampler with the server's view
	// (inference.Client); nil for other policies.
	sampler samplerReporter
	lock    *trajectory.DirLock // the output dir's writer lock (failfast.go)
	teacher *inference.Teacher  // distillation teacher, nil without
	updater Updater             // policy versions and weight updates; nil for other policies
}

// Updater coordinates in-flight weight updates with the job's engines
// (inference.Client; docs/async-rl.md).
type Updater interface {
	BeginUpdate(ctx context.Context, mode string) (inference.UpdateStats, error)
	EndUpdate(ctx context.Context, version int64) (inference.UpdateStats, error)
	PolicyVersion() int64
	ObserveVersion(v int64)
	SetVersion(v int64)
}

// Updater returns the job's update coordinator, nil when its policy does
// not support one.
func (j *Job) Updater() Updater { return j.updater }

// samplerReporter is the policy's side of run.json "sampler".
type samplerReporter interface {
	SamplerReport(run inference.Sampling) inference.SamplerReport
}

// recordSampler rewrites run.json's sampler with the server's view of it,
// when the server reported one (llama.cpp's generation_settings).
func (j *Job) recordSampler() {
	if j.sampler == nil || j.writer == nil {
		return
	}
	rep := j.sampler.SamplerReport(j.cfg.Sampling)
	if rep.Server == nil {
		return
	}
	if b, err := json.Marshal(rep); err == nil {
		j.writer.SetSampler(b)
	}
}

// OpenEnv builds the env a config names: a registered name, or the path of
// a YAML env file.
func OpenEnv(cfg runner.Config) (envs.Env, error) {
	if strings.HasSuffix(cfg.Env, ".yaml") || strings.HasSuffix(cfg.Env, ".yml") {
		return envs.LoadFile(cfg.Env)
	}
	var node = &cfg.EnvConfig
	if node.Kind == 0 {
		node = nil
	}
	return envs.New(cfg.Env, node)
}

// open assembles the job (Open, in failfast.go, adds the output lock and
// the preflight). Nothing is started until Run.
func open(ctx context.Context, cfg runner.Config, opts Options) (*Job, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Mode == "" {
		opts.Mode = ModeRun
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	env, err := OpenEnv(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: env: %w", runner.ErrConfig, err)
	}
	if err := checkMode(&cfg, env, opts.Mode); err != nil {
		return nil, err
	}
	icfg := cfg.Inference
	icfg.Logger = opts.Logger
	policy, err := inference.New(icfg)
	if err != nil {
		return nil, fmt.Errorf("%w: inference: %w", runner.ErrConfig, err)
	}
	j := &Job{cfg: cfg, opts: opts, Env: env, Dir: cfg.Output.Dir}
	j.bindPolicy(policy)
	sbs, imgs, err := j.openSandboxes()
	if err != nil {
		return nil, err
	}
	sinks := opts.Sinks
	runID := opts.RunID
	if cfg.Output.Dir != "" {
		w, id, err := openWriter(ctx, cfg, opts, env.Name())
		if err != nil {
			return nil, err
		}
		j.writer, runID = w, id
		sinks = append([]runner.Sink{&parquetSink{w: w}}, sinks...)
	}
	if runID == "" {
		runID = newRunID()
	}
	deps := runner.Deps{
		Env: env, Policy: policy, Sandboxes: sbs, Images: imgs, Sinks: sinks,
		Items: opts.Items, Progress: opts.Progress, Logger: opts.Logger, RunID: runID,
		Gateway: newJobGateway(cfg, policy, opts.Logger),
	}
	if err := j.openTeacher(&deps); err != nil {
		j.closeWriter(ctx)
		return nil, fmt.Errorf("%w: %w", runner.ErrConfig, err)
	}
	r, err := runner.New(cfg, deps)
	if err != nil {
		j.closeWriter(ctx)
		return nil, err
	}
	j.Runner = r
	return j, nil
}

// checkMode refuses a config its mode cannot run, and gives an eval run
// the eval split when it names no split or dataset.
func checkMode(cfg *runner.Config, env envs.Env, mode string) error {
	if mode == ModeRun && env.Defaults().EvalOnly && !cfg.AllowEvalOnly {
		return fmt.Errorf("%w: env %s is eval-only: use `rollout eval`, or set allow_eval_only: true", runner.ErrConfig, env.Name())
	}
	// The bridge itself is the caller's sink (package atropos); a config
	// asking for it where no trainer should see the groups is refused, not
	// ignored.
	if cfg.Atropos.URL != "" && !cfg.Atropos.Disabled && mode != ModeRun {
		why := "evaluation groups must not reach a trainer"
		if mode == ModeCollect {
			why = "trainer-driven collection returns its groups on the stream"
		}
		return fmt.Errorf("%w: atropos.url: only collection runs (rollout run, run jobs) feed an Atropos trainer; %s", runner.ErrConfig, why)
	}
	if mode == ModeEval && cfg.Split == "" && cfg.Dataset.Path == "" {
		cfg.Split = "eval"
	}
	if cfg.Output.Dir == "" && mode != ModeCollect {
		return fmt.Errorf("%w: output.dir: required (the run directory; re-running with it resumes)", runner.ErrConfig)
	}
	return nil
}

// bindPolicy keeps what the job exposes of its policy: the sampler report
// and the update gate (set to the config's starting version).
func (j *Job) bindPolicy(policy inference.Policy) {
	if sr, ok := policy.(samplerReporter); ok {
		j.sampler = sr
	}
	if u, ok := policy.(Updater); ok {
		j.updater = u
		if j.cfg.PolicyVersion != nil {
			u.SetVersion(*j.cfg.PolicyVersion)
		}
	}
}

// openSandboxes is where the job's sandboxes and task images come from:
// the caller's (a server's shared backends, chosen by the config's
// sandbox.backend), or the job's own lazily started backend.
func (j *Job) openSandboxes() (runner.Sandboxes, runner.ImageBuilder, error) {
	cfg, opts := j.cfg, j.opts
	sbs, imgs := opts.Sandboxes, opts.Images
	if sel, ok := sbs.(BackendSelector); ok {
		var err error
		if sbs, imgs, err = sel.For(cfg); err != nil {
			return nil, nil, fmt.Errorf("%w: sandbox: %w", runner.ErrConfig, err)
		}
		if r, ok := sbs.(releaser); ok {
			j.release = r.Release
		}
	}
	if sbs == nil {
		// The job's own backend holds at most limits.sandboxes containers,
		// warm ones included: the run's bound holds at every moment.
		limit := sandboxLimit(cfg)
		j.backend = &lazyBackend{log: opts.Logger, instance: opts.SandboxInstance, warm: min(warmPoolSize(cfg), limit), maxContainers: limit,
			reuse: cfg.Sandbox.Reuse}
		j.backend.runc = cfg.Sandbox.Backend == sandbox.BackendRunc
		if cfg.Sandbox.Backend == sandbox.BackendKubernetes {
			kc := k8sconfig.Config{}
			if cfg.Sandbox.Kubernetes != nil {
				kc = *cfg.Sandbox.Kubernetes
			}
			if limit > 0 && (kc.MaxPods <= 0 || kc.MaxPods > limit) {
				kc.MaxPods = limit // limits.sandboxes bounds the pods too
			}
			j.backend.kube = &kc
		}
		sbs = j.backend
		j.release = j.backend.Close
	}
	if imgs == nil {
		imgs = &taskImages{backend: j.backend}
	}
	return sbs, imgs, nil
}

// openTeacher adds the distillation teacher (and its hint judge) to deps
// when the config or the env asks for one.
func (j *Job) openTeacher(deps *runner.Deps) error {
	cfg, env := j.cfg, j.Env
	teacher, err := teacherConfig(cfg, env)
	if err != nil || teacher == nil {
		return err
	}
	if h, ok := env.(envs.Harnessed); ok && h.RunsHarness() && teacher.Hints != nil {
		// The teacher scores every branch of a harness rollout's session;
		// hints judge the own loop's turns (what followed each tool call),
		// which a session does not have.
		return fmt.Errorf("distill hints: not implemented for harness envs (env %s runs an outside harness; the teacher scores its sessions' branches, but hints judge the own agent loop's turns): remove distill.hints", env.Name())
	}
	t, err := inference.NewTeacher(*teacher)
	if err != nil {
		return err
	}
	if cfg.Distill == nil && cfg.Inference.Backend == inference.BackendChat && !cfg.Inference.ChatTokenIDs {
		return fmt.Errorf("env %s: its teacher scores the student's token ids: use a tokens-mode backend, or chat with inference.chat_token_ids", env.Name())
	}
	deps.Distiller, j.teacher = t, t
	if t.Hints() {
		deps.Hinter = t
	}
	return nil
}

// closeWriter closes the run directory's writer of a job that failed to
// open.
func (j *Job) closeWriter(ctx context.Context) {
	if j.writer != nil {
		_ = j.writer.Close(context.WithoutCancel(ctx))
	}
}

// teacherConfig is the distillation teacher: the run config's distill
// block, else the env's own; an env that asks for hints (agentic-opd's
// hints: true) gets them on either, with default settings unless the
// teacher config has its own.
func teacherConfig(cfg runner.Config, env envs.Env) (*inference.TeacherConfig, error) {
	teacher := cfg.Distill
	if d, ok := env.(envs.Distilled); ok && teacher == nil {
		teacher = d.Teacher()
	}
	if h, ok := env.(envs.Hinted); ok && h.DistillHints() {
		if teacher == nil {
			return nil, fmt.Errorf("env %s: hints: true needs a teacher (env_config.teacher or a distill block)", env.Name())
		}
		if teacher.Hints == nil {
			c := *teacher
			c.Hints = &inference.HintConfig{}
			teacher = &c
		}
	}
	return teacher, nil
}

func newRunID() string {
	return "run_" + time.Now().UTC().Format("20060102T150405") + "_" + randomHex(4)
}

// openWriter opens the run directory; a resumed run keeps its id.
func openWriter(ctx context.Context, cfg runner.Config, opts Options, env string) (*trajectory.Writer, string, error) {
	cfgJSON, _ := json.Marshal(cfg)
	runID := opts.RunID
	prior, err := trajectory.ReadManifest(cfg.Output.Dir)
	if err == nil {
		if err := sameRun(prior.Config, cfg); err != nil {
			return nil, "", fmt.Errorf("%w: output.dir %s: %w", runner.ErrConfig, cfg.Output.Dir, err)
		}
	}
	if runID == "" {
		if err == nil && prior.RunID != "" {
			runID = prior.RunID
		} else {
			runID = newRunID()
		}
	}
	// The sampler every request states (neutral where the config is
	// silent); the server's view is added when the run ends.
	samplerJSON, err := json.Marshal(inference.EffectiveSampling(cfg.Inference, cfg.Sampling))
	if err != nil {
		return nil, "", fmt.Errorf("encode sampler: %w", err)
	}
	w, err := trajectory.NewWriter(ctx, cfg.Output.Dir, trajectory.WriterOptions{
		RunID: runID, Config: cfgJSON, Sampler: samplerJSON, MaxRowsPerFile: cfg.Output.MaxRowsPerFile, Logger: opts.Logger, NoJournal: opts.NoJournal,
		Versions: map[string]string{"service": version.Get().Version, "commit": version.Get().Commit, "env": env, "mode": opts.Mode},
	})
	if err != nil {
		return nil, "", fmt.Errorf("open output %s: %w", cfg.Output.Dir, err)
	}
	return w, runID, nil
}

// sameRun refuses to resume a run directory with a config that defines a
// different data set of groups (another env, G, split, dataset or item
// order): its groups would mix silently with the earlier ones. Knobs that
// do not change what a group is (limits, endpoints, timeouts) may change.
func sameRun(priorJSON json.RawMessage, cfg runner.Config) error {
	if len(priorJSON) == 0 {
		return nil
	}
	var prior runner.Config
	if err := json.Unmarshal(priorJSON, &prior); err != nil {
		return fmt.Errorf("the run.json there holds an unreadable config: %w", err)
	}
	diffs := []struct {
		field      string
		was, isNow any
	}{
		{"env", prior.Env, cfg.Env},
		{"group_size", prior.GroupSize, cfg.GroupSize},
		{"split", prior.Split, cfg.Split},
		{"dataset.path", prior.Dataset.Path, cfg.Dataset.Path},
		{"seed", prior.Seed, cfg.Seed},
		{"shuffle", prior.Shuffle, cfg.Shuffle},
	}
	for _, d := range diffs {
		if d.was != d.isNow {
			return fmt.Errorf("it holds a run with %s %v, this config has %v: resuming would mix the two; use another output.dir", d.field, d.was, d.isNow)
		}
	}
	return nil
}

// Close releases what Open acquired without running (the output and the
// sandbox backend); Run does it itself.
func (j *Job) Close(ctx context.Context) error {
	var err error
	if j.writer != nil {
		j.recordSampler()
		err = j.writer.Close(ctx)
	}
	if j.release != nil {
		err = errors.Join(err, j.release(ctx))
	}
	if j.teacher != nil {
		_ = j.teacher.Close()
	}
	return errors.Join(err, j.lock.Unlock())
}

// run collects every group, then closes the output and the sandbox
// backend (even when the run failed or was cancelled). In eval mode it
// also writes the eval report into the run directory. Run (failfast.go)
// wraps it with the endpoint checks and the exit policy.
func (j *Job) run(ctx context.Context) (runner.Summary, error) {
	sum, runErr := j.Runner.Run(ctx)
	if j.teacher != nil {
		_ = j.teacher.Close()
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	var closeErr error
	if j.writer != nil {
		j.recordSampler()
		closeErr = j.writer.Close(cctx)
	}
	if j.release != nil {
		if err := j.release(cctx); err != nil {
			j.opts.Logger.Warn("close sandbox backend", "error", err)
		}
	}
	if runErr != nil {
		return sum, runErr
	}
	if closeErr != nil {
		return sum, fmt.Errorf("close output: %w", closeErr)
	}
	if j.opts.Mode == ModeEval && j.writer != nil {
		if err := j.writeEval(ctx); err != nil {
			return sum, err
		}
	}
	return sum, nil
}

func (j *Job) writeEval(ctx context.Context) error {
	run, err := trajectory.Open(j.Dir)
	if err != nil {
		return fmt.Errorf("eval report: %w", err)
	}
	recs, err := run.ReadAll(ctx)
	if err != nil {
		return fmt.Errorf("eval report: %w", err)
	}
	cfg := j.Runner.Config()
	thr := cfg.Eval.PassThreshold
	ks := []int{1}
	if cfg.Eval.K > 1 {
		ks = append(ks, cfg.Eval.K)
	}
	opts := trajectory.EvalOptions{Ks: ks, PassThreshold: &thr}
	if em, ok := j.Env.(envs.EvalMetricser); ok {
		var ros []envs.ScoredRollout
		for i := range recs {
			if r := &recs[i]; r.Status == trajectory.StatusOK {
				ros = append(ros, envs.ScoredRollout{ItemID: r.ItemID, Category: r.Category, Reward: r.Reward,
					Components: r.RewardComponents, Turns: int(r.Turns)})
			}
		}
		if ms := em.EvalMetrics(ros); len(ms) > 0 {
			opts.EnvMetrics = map[string]map[string]float64{j.Env.Name(): ms}
		}
	}
	_, err = trajectory.WriteEvalReport(filepath.Join(j.Dir, "eval"), recs, opts)
	if err != nil {
		return fmt.Errorf("eval report: %w", err)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// releaser is a shared backend's view for one job (BackendSelector.For),
// released when the job ends; the backend itself stays up.
type releaser interface {
	Release(ctx context.Context) error
}

// lazyBackend starts the sandbox backend (Docker; runc when runc is set;
// Kubernetes when kube is set) on the first sandbox request, so runs
// without sandboxes need no Docker daemon or cluster.
type lazyBackend struct {
	kube     *k8sconfig.Config
	k        *kubernetes.Kubernetes
	runc     bool // the runc backend instead of Docker (sandbox.backend runc)
	r        *runc.Runc
	log      *slog.Logger
	instance string
	opts     *docker.Options // full backend options (Shared); nil: log and instance only
	// warm caps the started-but-unused sandboxes of the warm pool that
	// starts a group's G sandboxes as soon as the runner announces them
	// (runner.Expecter); warm <= 0 creates every sandbox on demand.
	warm int
	// reuse resets used sandboxes in place for the next rollout
	// (sandbox.reuse; the Docker and runc backends' pools).
	reuse bool
	// maxContainers is the backend's MaxContainers when it starts with
	// log and instance only (0: the backend's default).
	maxContainers int
	// started gates the backend's start; d, k and pool are set once it
	// succeeds (a failed start is tried again: startGate).
	started startGate
	d       *docker.Docker
	pool    *sandbox.Pool

	// daemon is the local Docker daemon that builds and pushes task images
	// for the Kubernetes backend (image_registry set); opened on first use.
	daemonGate startGate
	daemon     *client.Client
}

var (
	_ runner.Sandboxes = (*lazyBackend)(nil)
	_ runner.Expecter  = (*lazyBackend)(nil)
)

// sandboxLimit is limits.sandboxes with its default.
func sandboxLimit(cfg runner.Config) int {
	if n := cfg.Limits.Sandboxes; n > 0 {
		return n
	}
	return 32
}

// warmPoolSize is sandbox.warm_pool: 0 means four groups' worth.
func warmPoolSize(cfg runner.Config) int {
	if n := cfg.Sandbox.WarmPool; n != 0 {
		return n
	}
	return 4 * max(cfg.GroupSize, 1)
}

// imageDaemon returns the Docker daemon that builds task images and the
// registry they are pushed to afterwards ("" for none). With Docker
// sandboxes it is the backend's own daemon. With Kubernetes it is the local
// daemon when sandbox.kubernetes.image_registry is set (the nodes pull the
// pushed image from there); without a registry the nodes could not get the
// image, which is a clear error.
func (l *lazyBackend) imageDaemon(ctx context.Context) (*client.Client, string, error) {
	if l.kube == nil {
		if err := l.start(ctx); err != nil {
			return nil, "", err
		}
		if l.r != nil {
			return l.r.Client(), "", nil
		}
		return l.d.Client(), "", nil
	}
	if l.kube.ImageRegistry == "" {
		return nil, "", fmt.Errorf("%w: with sandbox.backend kubernetes, task images are built by the local Docker engine and pushed to sandbox.kubernetes.image_registry, which is not set: set it, or build the image beforehand and load it into the nodes (docs/kubernetes.md, \"Images\")", sandbox.ErrInvalid)
	}
	if err := imageref.CheckRegistry(l.kube.ImageRegistry); err != nil {
		return nil, "", fmt.Errorf("%w: sandbox.kubernetes.image_registry: %w", sandbox.ErrInvalid, err)
	}
	err := l.daemonGate.do(func() error {
		c, err := dockerclient.New(ctx)
		if err == nil {
			l.daemon = c
		}
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("task images for kubernetes are built by the local Docker engine: %w", err)
	}
	return l.daemon, l.kube.ImageRegistry, nil
}

func (l *lazyBackend) start(ctx context.Context) error {
	return l.started.do(func() error {
		if l.kube != nil {
			k, err := kubernetes.New(context.WithoutCancel(ctx), kubernetes.Options{Config: *l.kube, Logger: l.log, Instance: l.instance})
			if err != nil {
				return err
			}
			l.k = k
			if l.warm > 0 {
				l.pool = sandbox.NewPool(k, sandbox.PoolOptions{MaxIdle: l.warm})
			}
			return nil
		}
		if l.runc {
			r, err := runc.New(context.WithoutCancel(ctx), runc.Options{Options: host.Options{Logger: l.log, Instance: l.instance, MaxContainers: l.maxContainers}})
			if err != nil {
				return err
			}
			l.r = r
			if l.warm > 0 {
				l.pool = sandbox.NewPool(r, sandbox.PoolOptions{MaxIdle: l.warm, Reuse: l.reuse})
			}
			return nil
		}
		opts := docker.Options{Options: host.Options{Logger: l.log, Instance: l.instance, MaxContainers: l.maxContainers}}
		if l.opts != nil {
			opts = *l.opts
		}
		d, err := docker.New(context.WithoutCancel(ctx), opts)
		if err != nil {
			return err
		}
		l.d = d
		if l.warm > 0 {
			l.pool = sandbox.NewPool(d, sandbox.PoolOptions{MaxIdle: l.warm, Reuse: l.reuse})
		}
		return nil
	})
}

// poolIfStarted is the warm pool, nil before the backend has started or
// without one.
func (l *lazyBackend) poolIfStarted() *sandbox.Pool {
	release := l.started.hold()
	defer release()
	return l.pool
}

// Create implements runner.Sandboxes.
func (l *lazyBackend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if err := l.start(ctx); err != nil {
		return nil, err
	}
	if l.pool != nil {
		return l.pool.Acquire(ctx, spec)
	}
	if l.k != nil {
		return l.k.Create(ctx, spec)
	}
	if l.r != nil {
		return l.r.Create(ctx, spec)
	}
	return l.d.Create(ctx, spec)
}

// Expect implements runner.Expecter.
func (l *lazyBackend) Expect(spec sandbox.Spec, n int) error {
	if err := l.start(context.Background()); err != nil {
		return err
	}
	if l.pool == nil {
		return nil
	}
	return l.pool.Expect(spec, n)
}

// Close stops the backend if it was started, removing its containers
// (the pool's unused ones first).
func (l *lazyBackend) Close(ctx context.Context) error {
	defer l.daemonGate.hold()()
	defer l.started.hold()()
	if l.daemon != nil {
		_ = l.daemon.Close()
	}
	if l.d == nil && l.k == nil && l.r == nil {
		return nil
	}
	var errs []error
	if l.pool != nil {
		errs = append(errs, l.pool.Close(ctx))
	}
	switch {
	case l.k != nil:
		errs = append(errs, l.k.Close(ctx))
	case l.r != nil:
		errs = append(errs, l.r.Close(ctx))
	default:
		errs = append(errs, l.d.Close(ctx))
	}
	return errors.Join(errs...)
}

// taskImages builds env task images with one shared TaskBuilder; contexts
// given as bytes are written to a content-addressed file first. With a
// registry (Kubernetes), each image is pushed there once after its build.
type taskImages struct {
	backend  *lazyBackend
	ready    startGate // builder, engine and registry are set once it succeeds
	builder  *image.TaskBuilder
	daemon   *client.Client
	registry string
	pushMu   sync.Mutex
	pushed   map[string]bool
}

// BuildTask implements runner.ImageBuilder.
func (t *taskImages) BuildTask(ctx context.Context, b envs.ImageBuild) (string, error) {
	err := t.ready.do(func() error {
		if t.backend == nil {
			return errors.New("no Docker engine for task images")
		}
		daemon, registry, err := t.backend.imageDaemon(ctx)
		if err != nil {
			return err
		}
		t.daemon, t.registry, t.builder = daemon, registry, image.NewTaskBuilder(daemon)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("task image: %w", err)
	}
	spec := image.TaskSpec{Context: b.Dir, DockerfilePath: b.Dockerfile}
	if len(b.ContextTar) > 0 {
		sum := sha256.Sum256(b.ContextTar)
		p := filepath.Join(os.TempDir(), "rollout-context-"+hex.EncodeToString(sum[:8])+".tar")
		if _, err := os.Stat(p); err != nil {
			tmp := p + ".tmp" + hex.EncodeToString(sum[8:12])
			if err := os.WriteFile(tmp, b.ContextTar, 0o600); err != nil {
				return "", fmt.Errorf("task image context: %w", err)
			}
			if err := os.Rename(tmp, p); err != nil {
				return "", fmt.Errorf("task image context: %w", err)
			}
		}
		spec.Context = p
	}
	res, err := t.builder.Build(ctx, spec)
	if err != nil {
		return "", err
	}
	if t.registry != "" {
		if err := t.push(ctx, res.Ref); err != nil {
			return "", fmt.Errorf("task image: %w", err)
		}
	}
	// The Kubernetes backend names it in the registry (image_registry).
	return res.Ref, nil
}

// push pushes ref to the registry once per process (the same ref is the
// same content: task image tags are content hashes).
func (t *taskImages) push(ctx context.Context, ref string) error {
	t.pushMu.Lock()
	defer t.pushMu.Unlock()
	if t.pushed[ref] {
		return nil
	}
	if _, err := image.Push(ctx, t.daemon, t.registry, ref); err != nil {
		return err
	}
	if t.pushed == nil {
		t.pushed = map[string]bool{}
	}
	t.pushed[ref] = true
	return nil
}

// Deliver hands a group run outside Runner.Run (trainer-driven collection)
// to the job's Parquet output, when it has one, and counts it.
func (j *Job) Deliver(ctx context.Context, g *runner.Group) error {
	if j.writer != nil {
		if err := (&parquetSink{w: j.writer}).WriteGroup(ctx, j.Runner.Info(), g); err != nil {
			return err
		}
	}
	j.Runner.Count(g)
	return nil
}
