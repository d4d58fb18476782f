package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	rnd "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/util/version"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/tools"
)

// Sandboxes creates sandboxes (the Docker backend, or a pool over it).
type Sandboxes interface {
	Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error)
}

// Expecter is implemented by sandbox backends with a warm pool (sandbox.Pool):
// the runner announces the G sandboxes of a group before creating them.
type Expecter interface {
	Expect(spec sandbox.Spec, n int) error
}

// ImageBuilder builds a task image FROM a local base image and returns its
// reference (cached by content).
type ImageBuilder interface {
	BuildTask(ctx context.Context, b envs.ImageBuild) (string, error)
}

// Deps are the runner's collaborators.
type Deps struct {
	Env       envs.Env
	Policy    inference.Policy
	Sandboxes Sandboxes    // required when the env's tasks have sandboxes
	Images    ImageBuilder // required when tasks carry an image build
	Sinks     []Sink
	// Items replaces the env's dataset (e.g. a trainer-driven stream);
	// nil means cfg.Dataset or the env's own items.
	Items []datasets.Item
	// Progress receives an event per finished rollout and group (nil: none).
	Progress func(Event)
	Logger   *slog.Logger
	// RunID names the run; empty generates one.
	RunID string
	// Distiller, when set, scores each ok rollout's trained tokens with a
	// teacher (on-policy distillation; *inference.Teacher).
	Distiller Distiller
	// Gateway opens the capture sessions of harness tasks (envs.Task.Harness);
	// nil when the run has none (a harness task then fails as a task error).
	Gateway Gateway
	// Hinter, when set, rescores the turns a judge found a hint for under
	// the hint-enhanced teacher context (*inference.Teacher with hints).
	Hinter Hinter
}

// Distiller returns the teacher's top-K ids and logprobs for the positions
// of ids that want selects (nil elsewhere).
type Distiller interface {
	Score(ctx context.Context, ids []int32, want func(p int) bool) ([][]int32, [][]float32, error)
}

// Hinter judges what followed each turn of a rollout and returns the
// turns the teacher scored again under a hint (inference.HintTurns).
type Hinter interface {
	HintTurns(ctx context.Context, in inference.HintInput) ([]inference.HintedTurn, inference.HintStats, error)
}

// Event is a progress notification.
type Event struct {
	Group   *Group   // set when a group finished
	Rollout *Rollout // set when a rollout finished (last attempt)
	Total   int      // groups planned
}

// Runner executes one run.
type Runner struct {
	cfg    Config
	deps   Deps
	log    *slog.Logger
	info   RunInfo
	tools  *tools.Registry
	rolls  *semaphore.Weighted
	boxes  *semaphore.Weighted
	mu     sync.Mutex
	sum    Summary
	reward float64
	// planned is the number of groups Run will collect (0 outside Run).
	planned atomic.Int64
	// stopIntake ends intake (CancelJob without cancel_in_flight).
	stopOnce   sync.Once
	intakeStop chan struct{}
	// preflight (preflight.go): the items, resolved once.
	preMu    sync.Mutex
	preDone  bool
	preItems []datasets.Item
	// hintWarned: the first rollout whose hint judge wrote no verdict is
	// logged as a warning, later ones at debug level (the metric counts
	// them all).
	hintWarned atomic.Bool
}

// GroupOptions adjust one group in trainer-driven collection.
type GroupOptions struct {
	// PolicyVersion is stamped on the group's records.
	PolicyVersion *int64
	// Sampling replaces the run's sampling parameters when set.
	Sampling *inference.Sampling
	// RequestID is echoed on the group.
	RequestID string

	prepared *groupRun // resolved ahead by Run (prepareAhead)
}

// StopIntake stops starting new groups; groups in flight finish and are
// written. Run then returns with ErrIntakeStopped. Safe to call at any
// time, more than once.
func (r *Runner) StopIntake() { r.stopOnce.Do(func() { close(r.intakeStop) }) }

// ErrIntakeStopped is returned by Run after StopIntake.
var ErrIntakeStopped = errors.New("intake stopped")

// New validates cfg and prepares a run.
func New(cfg Config, deps Deps) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Env == nil || deps.Policy == nil {
		return nil, fmt.Errorf("%w: runner needs an env and a policy", ErrConfig)
	}
	cfg = cfg.withDefaults()
	d := deps.Env.Defaults()
	if cfg.GroupSize == 0 {
		cfg.GroupSize = max(d.GroupSize, 1)
	}
	if cfg.MaxTurns == 0 {
		cfg.MaxTurns = max(d.MaxTurns, 1)
	}
	if cfg.Eval.K == 0 {
		cfg.Eval.K = cfg.GroupSize
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	if deps.RunID == "" {
		deps.RunID = newID("run")
	}
	sampling, _ := json.Marshal(cfg.Sampling)
	r := &Runner{
		cfg:   cfg,
		deps:  deps,
		log:   deps.Logger.With("run", deps.RunID, "env", deps.Env.Name()),
		tools: tools.Default(),
		rolls: semaphore.NewWeighted(int64(cfg.Limits.RolloutsInFlight)),
		boxes: semaphore.NewWeighted(int64(cfg.Limits.Sandboxes)),
		info: RunInfo{
			RunID: deps.RunID, Env: deps.Env.Name(), Model: cfg.Inference.Model, Parser: cfg.Parser,
			ServiceVersion: version.Get().Version, ConfigHash: cfg.Hash(), SamplingJSON: string(sampling),
			PolicyVersion: cfg.PolicyVersion, RolloutTimeout: time.Duration(cfg.RolloutTimeout),
			ToolTimeout: tools.DefaultTerminalTimeout, PassThreshold: cfg.Eval.PassThreshold,
		},
	}
	r.sum.FailuresByKind = map[string]int{}
	r.sum.StopReasons = map[string]int{}
	r.intakeStop = make(chan struct{})
	return r, nil
}

// Config returns the effective config (defaults applied).
func (r *Runner) Config() Config { return r.cfg }

// Info returns the run-level information given to sinks.
func (r *Runner) Info() *RunInfo { return &r.info }

// Items resolves the items of this run: Deps.Items, else the configured
// dataset, else the env's own split; then shuffle/limit.
func (r *Runner) Items(ctx context.Context) ([]datasets.Item, error) {
	items := r.deps.Items
	var err error
	switch {
	case items != nil:
	case r.cfg.Dataset.Path != "":
		items, err = datasets.Load(ctx, r.cfg.Dataset)
	default:
		split := r.cfg.Split
		if split == "" {
			split = "train"
		}
		items, err = r.deps.Env.Items(ctx, split)
	}
	if err != nil {
		return nil, fmt.Errorf("items of %s: %w", r.deps.Env.Name(), err)
	}
	if r.cfg.Shuffle {
		out := append([]datasets.Item(nil), items...)
		rng := rnd.New(rnd.NewPCG(r.cfg.Seed, 0x5eed))
		rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		items = out
	}
	if r.cfg.Groups > 0 && len(items) > r.cfg.Groups {
		items = items[:r.cfg.Groups]
	}
	return items, nil
}

// Run collects every group. Intake stops at the first sink error or when
// ctx is cancelled; in-flight groups then finish (their rollouts see the
// cancellation) and are still handed to the sinks when possible.
func (r *Runner) Run(ctx context.Context) (Summary, error) {
	start := time.Now()
	items, err := r.runItems(ctx)
	if err != nil {
		return r.sum, err
	}
	todo, err := r.resumeTodo(ctx, items)
	if err != nil {
		return r.sum, err
	}
	groupSlots := semaphore.NewWeighted(int64(r.cfg.Limits.GroupsInFlight))
	var sinks sinkState
	intake, stopIntake := context.WithCancel(ctx)
	defer stopIntake()
	go func() {
		select {
		case <-r.intakeStop:
			stopIntake()
		case <-intake.Done():
		}
	}()
	var wg sync.WaitGroup
	for i, it := range todo {
		// Back-pressure: wait for a group slot; never cancel running work.
		// While waiting, the group is prepared and its sandboxes are
		// started ahead of demand.
		var prepared *groupRun
		if !groupSlots.TryAcquire(1) {
			prepared = r.prepareAhead(intake, i, it)
			if err := groupSlots.Acquire(intake, 1); err != nil {
				break
			}
		}
		if err := r.admit(intake); err != nil {
			groupSlots.Release(1)
			switch {
			case errors.Is(err, ErrIntakeStopped):
				r.log.Info("a sink stopped intake", "reason", err)
				r.StopIntake()
			case intake.Err() == nil:
				sinks.fail(fmt.Errorf("admit group %s: %w", it.Key(), err))
			}
			break
		}
		wg.Add(1)
		go func(idx int, it datasets.Item) {
			defer wg.Done()
			defer groupSlots.Release(1)
			r.log.Debug("group started", "group", it.Key())
			g := r.RunGroup(ctx, idx, it, GroupOptions{PolicyVersion: r.cfg.PolicyVersion, prepared: prepared})
			r.deliver(ctx, g, it, &sinks, stopIntake, len(todo))
		}(i, it)
	}
	wg.Wait()
	r.sum.Elapsed = time.Since(start)
	if r.sum.RolloutsOK > 0 {
		r.sum.MeanReward = r.reward / float64(r.sum.RolloutsOK)
	}
	if err := sinks.firstErr(); err != nil {
		return r.sum, err
	}
	if err := ctx.Err(); err != nil {
		return r.sum, fmt.Errorf("run cancelled: %w", err)
	}
	select {
	case <-r.intakeStop:
		if r.sum.Groups+r.sum.GroupsSkipped < len(items) {
			return r.sum, ErrIntakeStopped
		}
	default:
	}
	return r.sum, nil
}

// resumeTodo is items without the groups the sinks already hold (a
// resumed run), counted as skipped.
func (r *Runner) resumeTodo(ctx context.Context, items []datasets.Item) ([]datasets.Item, error) {
	done := map[string]bool{}
	for _, s := range r.deps.Sinks {
		if res, ok := s.(Resumer); ok {
			got, err := res.CompletedGroups(ctx)
			if err != nil {
				return nil, fmt.Errorf("resume: %w", err)
			}
			for k := range got {
				done[k] = true
			}
		}
	}
	todo := make([]datasets.Item, 0, len(items))
	for _, it := range items {
		if done[it.Key()] {
			r.sum.GroupsSkipped++
			continue
		}
		todo = append(todo, it)
	}
	r.planned.Store(int64(len(todo)))
	if r.sum.GroupsSkipped > 0 {
		r.log.Info("resuming", "completed_groups", r.sum.GroupsSkipped, "remaining", len(todo))
	}
	return todo, nil
}

// sinkState is what a run's groups share about its sinks: the first error
// (it stops intake), and the lock that serialises the non-durable writes
// so that the records of one group stay together.
type sinkState struct {
	mu  sync.Mutex
	err error
}

// fail records err unless an earlier error was recorded.
func (s *sinkState) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

func (s *sinkState) firstErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// deliver hands a finished group to the sinks and counts it, unless a sink
// already failed, the group was dropped as stale, or cancellation cut it
// short. total is the number of groups the run plans (for Progress).
func (r *Runner) deliver(ctx context.Context, g *Group, it datasets.Item, sinks *sinkState, stopIntake func(), total int) {
	if sinks.firstErr() != nil {
		return
	}
	if g.StaleDropped {
		r.countStale(g)
		r.log.Info("group outside async.max_staleness dropped", "group_id", g.ID, "lag", g.Versions.Lag, "regenerated", g.Regenerated)
		return
	}
	// A group cut short by cancellation is incomplete: writing it
	// would let a resumed run treat the item as done and leave a
	// permanent gap. It is dropped here and collected again whole.
	if ctx.Err() != nil && interrupted(g) {
		sinks.mu.Lock()
		r.sum.GroupsInterrupted++
		sinks.mu.Unlock()
		r.log.Info("group interrupted by cancellation; not written, a resumed run collects it again",
			"group_id", g.ID, "item", it.Key())
		return
	}
	// Groups that finished are written even when ctx was cancelled
	// meanwhile, so that the work done is not lost.
	wctx := context.WithoutCancel(ctx)
	// Durable sinks first, outside the lock: groups finishing
	// together share their fsyncs. Nothing below announces the
	// group before they returned.
	for _, s := range r.deps.Sinks {
		if !isDurable(s) {
			continue
		}
		if err := s.WriteGroup(wctx, &r.info, g); err != nil {
			sinks.fail(fmt.Errorf("write group %s: %w", g.ID, err))
			stopIntake()
			return
		}
	}
	sinks.mu.Lock()
	defer sinks.mu.Unlock()
	if sinks.err != nil {
		return
	}
	for _, s := range r.deps.Sinks {
		if isDurable(s) {
			continue
		}
		if err := s.WriteGroup(wctx, &r.info, g); err != nil {
			sinks.err = fmt.Errorf("write group %s: %w", g.ID, err)
			stopIntake()
			return
		}
	}
	r.count(g)
	r.log.Debug("group done", "group", g.ID, "sequence", g.Sequence, "ok", g.OK, "mean", g.Mean)
	if r.deps.Progress != nil {
		r.deps.Progress(Event{Group: g, Total: total})
	}
}

// isDurable reports whether s is a Durable sink.
func isDurable(s Sink) bool {
	d, ok := s.(Durable)
	return ok && d.DurableWrites()
}

// interrupted reports whether cancellation cut one of g's rollouts short.
func interrupted(g *Group) bool {
	for i := range g.Rollouts {
		if f := g.Rollouts[i].Failure; f != nil && f.Kind == FailCancelled {
			return true
		}
	}
	return false
}

// admit asks every Admitter sink whether another group may start; it
// blocks while one of them pauses intake.
func (r *Runner) admit(ctx context.Context) error {
	for _, s := range r.deps.Sinks {
		if a, ok := s.(Admitter); ok {
			if err := a.Admit(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// Count adds a group delivered outside Run (trainer-driven collection) to
// the summary.
func (r *Runner) Count(g *Group) { r.count(g) }

// Summary returns the counters so far.
func (r *Runner) Summary() Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sum
	s.FailuresByKind = maps.Clone(r.sum.FailuresByKind)
	s.StopReasons = maps.Clone(r.sum.StopReasons)
	if s.RolloutsOK > 0 {
		s.MeanReward = r.reward / float64(s.RolloutsOK)
	}
	return s
}

func (r *Runner) count(g *Group) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sum.Groups++
	if g.Dropped {
		r.sum.GroupsDropped++
	}
	r.sum.GroupsStaleRegenerated += g.Regenerated
	if g.Stale {
		r.sum.GroupsStaleMarked++
	}
	for _, ro := range g.Rollouts {
		r.sum.Rollouts++
		r.sum.Retries += ro.Attempts - 1
		if ro.Status == StatusOK {
			r.sum.RolloutsOK++
			r.sum.StopReasons[string(ro.Result.StopReason)]++
			r.reward += ro.Score.Value
			for _, seq := range ro.Sequences() {
				r.sum.UnscoredTokens += seq.Unscored
				r.sum.SampledTokens += seq.Unscored
				for _, m := range seq.Mask {
					if m == 1 {
						r.sum.SampledTokens++
					}
				}
			}
		} else {
			r.sum.InfraFailed++
			r.sum.FailuresByKind[ro.Failure.Kind]++
		}
	}
}
