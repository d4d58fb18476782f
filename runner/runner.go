package runner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	rnd "math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/util/version"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/toolcontext"
	"github.com/rollout-rl/rollout/tools"
	"github.com/rollout-rl/rollout/tools/mcp"
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
	done := map[string]bool{}
	for _, s := range r.deps.Sinks {
		if res, ok := s.(Resumer); ok {
			got, err := res.CompletedGroups(ctx)
			if err != nil {
				return r.sum, fmt.Errorf("resume: %w", err)
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
	groupSlots := semaphore.NewWeighted(int64(r.cfg.Limits.GroupsInFlight))
	// Sink writes are serialised so records of one group stay together.
	var sinkMu sync.Mutex
	var sinkErr error
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
				sinkMu.Lock()
				if sinkErr == nil {
					sinkErr = fmt.Errorf("admit group %s: %w", it.Key(), err)
				}
				sinkMu.Unlock()
			}
			break
		}
		wg.Add(1)
		go func(idx int, it datasets.Item) {
			defer wg.Done()
			defer groupSlots.Release(1)
			r.log.Debug("group started", "group", it.Key())
			g := r.RunGroup(ctx, idx, it, GroupOptions{PolicyVersion: r.cfg.PolicyVersion, prepared: prepared})
			failed := func() bool {
				sinkMu.Lock()
				defer sinkMu.Unlock()
				return sinkErr != nil
			}
			if failed() {
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
				sinkMu.Lock()
				r.sum.GroupsInterrupted++
				sinkMu.Unlock()
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
					sinkMu.Lock()
					if sinkErr == nil {
						sinkErr = fmt.Errorf("write group %s: %w", g.ID, err)
					}
					sinkMu.Unlock()
					stopIntake()
					return
				}
			}
			sinkMu.Lock()
			defer sinkMu.Unlock()
			if sinkErr != nil {
				return
			}
			for _, s := range r.deps.Sinks {
				if isDurable(s) {
					continue
				}
				if err := s.WriteGroup(wctx, &r.info, g); err != nil {
					sinkErr = fmt.Errorf("write group %s: %w", g.ID, err)
					stopIntake()
					return
				}
			}
			r.count(g)
			r.log.Debug("group done", "group", g.ID, "sequence", g.Sequence, "ok", g.OK, "mean", g.Mean)
			if r.deps.Progress != nil {
				r.deps.Progress(Event{Group: g, Total: len(todo)})
			}
		}(i, it)
	}
	wg.Wait()
	r.sum.Elapsed = time.Since(start)
	if r.sum.RolloutsOK > 0 {
		r.sum.MeanReward = r.reward / float64(r.sum.RolloutsOK)
	}
	if sinkErr != nil {
		return r.sum, sinkErr
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
		} else {
			r.sum.InfraFailed++
			r.sum.FailuresByKind[ro.Failure.Kind]++
		}
	}
}

// RunGroup runs the G rollouts of one item concurrently and assembles the
// group. Run calls it for every item; trainer-driven collection calls it
// directly. idx seeds the group's toolset sampling.
func (r *Runner) RunGroup(ctx context.Context, idx int, it datasets.Item, o GroupOptions) *Group {
	return r.runBounded(ctx, idx, it, o)
}

func (r *Runner) runGroupOnce(ctx context.Context, idx int, it datasets.Item, o GroupOptions) *Group {
	g := &Group{ID: it.Key(), Item: it, Rollouts: make([]Rollout, r.cfg.GroupSize), PolicyVersion: o.PolicyVersion, RequestID: o.RequestID, Sequence: -1}
	sampling := r.cfg.Sampling
	if o.Sampling != nil {
		sampling = *o.Sampling
	}
	log := r.log.With("group", g.ID)
	ctx, span := r.startGroup(ctx, it, len(g.Rollouts))
	defer endGroup(span, g)
	gr := o.prepared
	if gr == nil || gr.item.Key() != it.Key() {
		gr = r.newGroupRun(ctx, idx, it)
	}
	gr.sampling, gr.log = sampling, log
	g.Task = gr.task
	wave := r.wave(gr)
	if gr.taskErr == nil && gr.setErr == nil && !gr.expected {
		r.expectSandboxes(ctx, gr, wave)
	}
	var eg errgroup.Group
	eg.SetLimit(max(wave, 1))
	for i := range g.Rollouts {
		eg.Go(func() error {
			g.Rollouts[i] = r.runWithRetries(ctx, gr, i)
			if r.deps.Progress != nil {
				ro := g.Rollouts[i]
				r.deps.Progress(Event{Rollout: &ro, Total: int(r.planned.Load())})
			}
			return nil
		})
	}
	_ = eg.Wait()
	assemble(g, r.cfg.Advantage)
	return g
}

// newGroupRun resolves a group's task and tools.
func (r *Runner) newGroupRun(ctx context.Context, idx int, it datasets.Item) *groupRun {
	gr := &groupRun{idx: uint64(idx), item: it, sampling: r.cfg.Sampling, log: r.log.With("group", it.Key())}
	gr.task, gr.taskErr = r.deps.Env.Task(ctx, it)
	gr.set, gr.setErr = r.toolSet(gr.task, uint64(idx))
	if gr.setErr == nil && gr.set != nil && gr.task.Sandbox == nil {
		gr.setErr = needsSandbox(gr.set)
	}
	gr.mcp = append(slices.Clip(r.cfg.MCPServers), gr.task.MCPServers...)
	if gr.setErr == nil && len(gr.mcp) > 0 {
		if err := mcp.Validate(gr.mcp); err != nil {
			gr.setErr = err
		} else if mcp.NeedsSandbox(gr.mcp) && gr.task.Sandbox == nil {
			gr.setErr = errors.New("mcp_servers: a command (stdio) server runs in the rollout's sandbox, and this task has none")
		}
	}
	return gr
}

// wave is how many of a group's rollouts run at once: a group larger than
// the limits runs in waves, at most as many of its rollouts running (and
// holding goroutines) as the limits allow.
func (r *Runner) wave(gr *groupRun) int {
	wave := min(r.cfg.GroupSize, r.cfg.Limits.RolloutsInFlight)
	if gr.task.Sandbox != nil {
		wave = min(wave, r.cfg.Limits.Sandboxes)
	}
	return wave
}

// prepareAhead resolves the next group while every group slot is busy and
// announces its first wave of sandboxes to a pooling backend (building its
// task image on the way), so that they are started from the run's own
// schedule while the running groups finish, instead of when the group
// starts. The pool never lets warm sandboxes block a running group: they
// count against MaxContainers and idle ones of another spec are evicted
// for a rollout that needs a slot.
func (r *Runner) prepareAhead(ctx context.Context, idx int, it datasets.Item) *groupRun {
	gr := r.newGroupRun(ctx, idx, it)
	if _, ok := r.deps.Sandboxes.(Expecter); !ok || gr.taskErr != nil || gr.setErr != nil {
		return gr
	}
	r.expectSandboxes(ctx, gr, r.wave(gr))
	gr.expected = true
	return gr
}

// toolSet resolves the tools of one group: the configured toolsets (or a
// distribution sampled once per group, so the group shares its tools) and
// the task's own tools.
func (r *Runner) toolSet(task envs.Task, groupIdx uint64) (*tools.Set, error) {
	reg := r.tools
	enabled := task.Toolsets
	if len(r.cfg.Toolsets.Enabled) > 0 {
		enabled = r.cfg.Toolsets.Enabled
	}
	if r.cfg.Toolsets.Distribution != "" {
		sets, _, err := reg.SampleToolsets(r.cfg.Toolsets.Distribution, r.cfg.Seed*1_000_003+groupIdx)
		if err != nil {
			return nil, err
		}
		enabled = sets
	}
	if len(task.Tools) > 0 || len(task.CallOnly) > 0 {
		reg = tools.NewRegistry()
		for _, t := range tools.Builtins() {
			if err := reg.Register(t); err != nil {
				return nil, err
			}
		}
		for _, t := range task.Tools {
			if err := reg.Register(t); err != nil {
				return nil, fmt.Errorf("env tool: %w", err)
			}
			enabled = appendUnique(enabled, t.Toolset)
		}
		if len(task.CallOnly) > 0 {
			enabled = nil
			for _, ot := range task.CallOnly {
				t, err := recordOnlyTool(ot)
				if err != nil {
					return nil, err
				}
				if err := reg.Register(t); err != nil {
					return nil, fmt.Errorf("call-only tool: %w", err)
				}
			}
			enabled = []string{callOnlyToolset}
		}
	}
	if len(enabled) == 0 {
		return nil, nil
	}
	set, err := reg.Resolve(enabled, r.cfg.Toolsets.Disabled)
	if err == nil {
		err = r.checkParser(set)
	}
	return set, err
}

const callOnlyToolset = "call-only"

// needsSandbox refuses a sandbox-less task whose tool set has a built-in
// tool: those act only through the sandbox. Host-side tools (web, HTTP
// MCP servers, call-only schemas) run without one.
func needsSandbox(set *tools.Set) error {
	builtin := map[string]bool{}
	for _, t := range tools.Builtins() {
		builtin[t.Name] = true
	}
	for _, t := range set.OpenAI() {
		if t.Function != nil && builtin[t.Function.Name] {
			return fmt.Errorf("tool %s acts on the sandbox, and this task has none (disable its toolset or give the task a sandbox)", t.Function.Name)
		}
	}
	return nil
}

// recordOnlyTool offers a schema whose calls are recorded and never
// executed (single-turn call matching); the model sees that it was not run.
func recordOnlyTool(t openai.Tool) (tools.Tool, error) {
	if t.Function == nil || t.Function.Name == "" {
		return tools.Tool{}, fmt.Errorf("call-only tool without a function name")
	}
	params, err := json.Marshal(t.Function.Parameters)
	if err != nil || string(params) == "null" {
		params = []byte(`{"type":"object","properties":{}}`)
	}
	return tools.Tool{
		Name: t.Function.Name, Description: t.Function.Description, Parameters: params,
		Toolset: callOnlyToolset, Class: tools.ReadOnly,
		Handler: func(context.Context, *tools.Runtime, tools.Args) (string, error) {
			return `{"status":"recorded","note":"this call is evaluated, not executed"}`, nil
		},
	}, nil
}

func appendUnique(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(append([]string(nil), list...), s)
}

// runWithRetries runs one rollout slot, retrying infra failures with a
// fresh sandbox and rollout id.
// groupRun is what the rollouts of one group share: the item, its task and
// tool set (or why they could not be made), the sampling parameters, and
// the task's sandbox spec, computed once for the group.
type groupRun struct {
	idx      uint64
	mcp      []mcp.Server // run config's and task's MCP servers
	item     datasets.Item
	task     envs.Task
	taskErr  error
	set      *tools.Set
	setErr   error
	sampling inference.Sampling
	log      *slog.Logger

	specMu sync.Mutex
	spec   *sandbox.Spec // nil until computed; failures are not kept

	expected bool // its sandboxes were announced ahead (prepareAhead)
}

// sandboxSpec is the group's sandbox spec. The first rollout computes it
// (building the task image, which hashes the whole build context) and the
// others reuse it; a failure is not kept, so a retry tries again.
func (gr *groupRun) sandboxSpec(ctx context.Context, r *Runner) (sandbox.Spec, string, error) {
	gr.specMu.Lock()
	defer gr.specMu.Unlock()
	if gr.spec != nil {
		return *gr.spec, "", nil
	}
	spec, kind, err := r.sandboxSpec(ctx, gr.task)
	if err != nil {
		return spec, kind, err
	}
	gr.spec = &spec
	return spec, "", nil
}

func (r *Runner) runWithRetries(ctx context.Context, gr *groupRun, idx int) Rollout {
	log := gr.log
	var ro Rollout
	for attempt := 1; ; attempt++ {
		actx, span := r.startRollout(ctx, gr.item.Key(), idx, attempt)
		ro = r.attempt(actx, gr, idx)
		ro.Attempts = attempt
		endRollout(span, &ro)
		if ro.Status == StatusOK || attempt > max(r.cfg.Retries, 0) || ctx.Err() != nil || !retryable(ro.Failure.Kind) || ro.deterministic {
			return ro
		}
		log.Warn("rollout infra failure, retrying", "rollout", ro.ID, "kind", ro.Failure.Kind, "error", ro.Failure.Message, "attempt", attempt)
		select {
		case <-ctx.Done():
			return ro
		case <-time.After(backoff(attempt)):
		}
	}
}

// retryable: a failure that another attempt may not meet again. A
// rejected request (inference_rejected: the server refused what we sent,
// e.g. a 4xx, or a 5xx the inference package classes as caused by the
// request's content) is not: the same conversation would be refused again.
func retryable(kind string) bool {
	switch kind {
	case FailTask, FailCancelled, FailPanic, FailRejected:
		return false
	}
	return true
}

func backoff(attempt int) time.Duration {
	d := time.Duration(200*math.Pow(2, float64(attempt-1))) * time.Millisecond
	return min(d, 5*time.Second) + time.Duration(rnd.Int64N(int64(100*time.Millisecond)))
}

// attempt is one try of one rollout. It never panics: a panic becomes a
// FailPanic record.
func (r *Runner) attempt(ctx context.Context, gr *groupRun, idx int) (ro Rollout) {
	task, set, sampling := gr.task, gr.set, gr.sampling
	start := time.Now()
	ro = Rollout{ID: newID("ro"), Index: idx, Status: StatusOK, Created: start}
	log := gr.log.With("rollout", ro.ID, "index", idx)
	defer func() {
		if p := recover(); p != nil {
			log.Error("rollout panicked", "panic", p, "stack", string(debug.Stack()))
			ro.fail(FailPanic, fmt.Errorf("panic: %v", p))
		}
		ro.Timings.Total = time.Since(start)
	}()
	if gr.taskErr != nil {
		ro.fail(FailTask, gr.taskErr)
		return ro
	}
	if gr.setErr != nil {
		ro.fail(FailTask, fmt.Errorf("tools: %w", gr.setErr))
		return ro
	}
	if set != nil {
		ro.Tools = set.OpenAI()
	}
	if err := r.rolls.Acquire(ctx, 1); err != nil {
		ro.fail(FailCancelled, err)
		return ro
	}
	defer r.rolls.Release(1)

	var sb sandbox.Sandbox
	if task.Sandbox != nil {
		var err error
		var kind string
		sctx, span := startSandbox(ctx)
		sb, kind, err = r.openSandbox(sctx, gr, &ro)
		endSandbox(span, &ro, err)
		if err != nil {
			ro.fail(kind, err)
			return ro
		}
		defer r.boxes.Release(1)
		defer func() {
			// Teardown happens after the reward, even on error, panic or
			// cancellation.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if err := sb.Close(cctx); err != nil {
				log.Warn("sandbox close", "error", err)
			}
		}()
	}

	if len(gr.mcp) > 0 {
		// MCP servers are per rollout (a stdio server runs in this
		// rollout's sandbox): open them, list their tools and offer them
		// beside the group's tools. A server that cannot be opened is an
		// infrastructure failure (sandbox kind), like one that dies later.
		sessions, err := mcp.Open(ctx, gr.mcp, sb, log)
		if err != nil {
			kind := FailTask // a configuration the servers cannot satisfy
			switch {
			case errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrClosed):
				kind = FailSandbox
			case ctx.Err() != nil:
				kind = FailCancelled
			}
			ro.fail(kind, err)
			return ro
		}
		defer func() {
			if err := sessions.Close(); err != nil {
				log.Debug("mcp close", "error", err)
			}
		}()
		t := task
		t.Tools = append(slices.Clip(task.Tools), sessions.Tools()...)
		if set, err = r.toolSet(t, gr.idx); err != nil {
			ro.fail(FailTask, fmt.Errorf("tools: %w", err))
			return ro
		}
		ro.Tools = set.OpenAI()
	}

	lcfg := agentloop.Config{
		ID: ro.ID, Messages: task.Messages, Tools: set, Model: r.cfg.Inference.Model,
		Sampling: sampling, Parser: r.cfg.Parser, ReasoningParser: r.cfg.ReasoningParser,
		MaxTurns: r.cfg.MaxTurns, Timeout: time.Duration(r.cfg.RolloutTimeout),
		MaxConsecutiveInvalid: r.cfg.MaxConsecutiveInvalid,
		OnTruncation:          r.cfg.Loop.OnTruncation, BudgetWarnings: r.cfg.Loop.BudgetWarnings,
		GraceTurn: r.cfg.Loop.GraceTurn, EmptyReplyNudges: r.cfg.Loop.EmptyReplyNudges,
		RepairToolNames: r.cfg.Loop.RepairToolNames, MaxCallsPerTurn: r.cfg.Loop.MaxCallsPerTurn,
	}
	if task.MaxTurns > 0 {
		lcfg.MaxTurns = task.MaxTurns
	}
	lcfg.Responder = envs.ResponderOf(r.deps.Env, gr.item)
	if v, ok := sampling.ChatTemplateKwargs["enable_thinking"].(bool); ok && !v {
		lcfg.ReasoningOptions.ThinkingDisabled = true
	}
	deps := agentloop.Deps{Policy: r.deps.Policy, Logger: log}
	switch {
	case sb != nil:
		deps.Runtime = tools.NewRuntime(sb, ro.ID)
		deps.Runtime.Logger = log
	case set != nil:
		// Call-only tools (recorded, never executed) and host-side tools
		// (web_search, web_extract) need a tool runtime but no
		// sandbox.
		deps.Runtime = tools.NewRuntime(nil, ro.ID)
		deps.Runtime.Logger = log
	}
	res, err := agentloop.Run(ctx, lcfg, deps)
	ro.Result = res
	for _, t := range res.Turns {
		ro.Timings.Generation += t.Generation
		ro.Timings.Tools += t.Tools
	}
	if err != nil || res.StopReason.Failed() {
		if err == nil {
			err = errors.New(res.Error)
		}
		ro.fail(loopFailure(res.StopReason, err), err)
		return ro
	}
	if err := r.checkSequence(res); err != nil {
		kind := FailInference
		if errors.Is(err, inference.ErrRequest) {
			kind = FailRejected // not retried: the same prompt would not fit again
		}
		ro.fail(kind, err)
		return ro
	}
	if r.deps.Distiller != nil {
		if err := r.distill(ctx, &ro, len(task.Messages), sampling.ChatTemplateKwargs); err != nil {
			kind := FailDistill
			if ctx.Err() != nil {
				kind = FailCancelled
			}
			ro.fail(kind, err)
			return ro
		}
	}

	rstart := time.Now()
	rctx, cancel := context.WithTimeout(ctx, time.Duration(r.cfg.RewardTimeout))
	defer cancel()
	out := envs.Outcome{Messages: res.Messages, Final: finalContent(res), Turns: res.TurnsUsed,
		FinishedNaturally: res.FinishedNaturally, StopReason: string(res.StopReason), TurnRewards: res.TurnRewards}
	var box envs.Sandbox
	if sb != nil {
		box = sb
		tc, err := toolcontext.New(deps.Runtime, set)
		if err != nil {
			ro.fail(FailReward, err)
			return ro
		}
		// Nothing the agent left running may change what the reward
		// reads (a background process rewriting a report, say).
		if err := tc.KillProcesses(rctx); err != nil {
			log.Warn("stop the agent's background processes before the reward", "error", err)
		}
		out.Tools = tc
	}
	sctx, span := startReward(rctx)
	score, err := r.deps.Env.Reward(sctx, gr.item, out, box)
	endReward(span, score.Value, err)
	ro.Timings.Reward = time.Since(rstart)
	if err != nil {
		kind := FailReward
		if errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrClosed) {
			// The sandbox died under the reward (killed, OOM, past its
			// disk limit): infrastructure, not the reward's logic.
			kind = FailSandbox
		} else if errors.Is(rctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			kind = FailRewardTimout
		} else if ctx.Err() != nil {
			kind = FailCancelled
		}
		ro.fail(kind, err)
		return ro
	}
	if math.IsNaN(score.Value) || math.IsInf(score.Value, 0) {
		ro.fail(FailReward, fmt.Errorf("reward is %v", score.Value))
		return ro
	}
	ro.Score = score
	return ro
}

// expectSandboxes tells a pooling backend that a group is about to create
// n sandboxes of the task's spec, so it starts them all at once while the
// group sets up. Errors are left to the rollouts, which meet them again
// and record them.
func (r *Runner) expectSandboxes(ctx context.Context, gr *groupRun, n int) {
	ex, ok := r.deps.Sandboxes.(Expecter)
	if !ok || gr.task.Sandbox == nil {
		return
	}
	spec, _, err := gr.sandboxSpec(ctx, r)
	if err != nil {
		return
	}
	if err := ex.Expect(spec, n); err != nil {
		r.log.Debug("warm pool: expect failed", "err", err)
	}
}

// sandboxSpec is the spec of the task's sandbox with the run's overrides,
// building the task image when needed.
func (r *Runner) sandboxSpec(ctx context.Context, task envs.Task) (sandbox.Spec, string, error) {
	spec := *task.Sandbox
	if task.Build != nil {
		if r.deps.Images == nil {
			return spec, FailImageBuild, errors.New("this task needs an image build and the runner has no image builder")
		}
		img, err := r.deps.Images.BuildTask(ctx, *task.Build)
		if err != nil {
			return spec, FailImageBuild, err
		}
		spec.Image = img
	}
	c := r.cfg.Sandbox
	if c.Image != "" && task.Build == nil {
		spec.Image = c.Image
	}
	if c.Network != "" {
		spec.Network = c.Network
	}
	if c.MemoryMB > 0 {
		spec.Limits.MemoryBytes = c.MemoryMB << 20
	}
	if c.CPUs > 0 {
		spec.Limits.CPUs = c.CPUs
	}
	if c.PIDs > 0 {
		spec.Limits.PIDs = c.PIDs
	}
	if c.DiskMB > 0 {
		spec.Limits.DiskBytes = c.DiskMB << 20
	}
	if c.ReadOnlyRoot {
		spec.Limits.ReadOnlyRoot = true
	}
	if c.Runtime != "" {
		spec.Runtime = c.Runtime
	}
	if spec.Image == "" {
		return spec, FailTask, errors.New("no sandbox image: set sandbox.image in the run config or the env's image")
	}
	return spec, "", nil
}

// openSandbox creates the rollout's sandbox under the sandbox limit.
func (r *Runner) openSandbox(ctx context.Context, gr *groupRun, ro *Rollout) (sandbox.Sandbox, string, error) {
	if r.deps.Sandboxes == nil {
		return nil, FailSandbox, errors.New("this task needs a sandbox and the runner has no sandbox backend")
	}
	spec, kind, err := gr.sandboxSpec(ctx, r)
	if err != nil {
		return nil, kind, err
	}
	spec.Labels = map[string]string{sandbox.LabelRun: r.info.RunID, sandbox.LabelRollout: ro.ID}
	ro.Image, ro.Limits, ro.Network, ro.Runtime = spec.Image, spec.Limits, spec.Network, spec.Runtime
	if err := r.boxes.Acquire(ctx, 1); err != nil {
		return nil, FailCancelled, err
	}
	t0 := time.Now()
	sb, err := r.deps.Sandboxes.Create(ctx, spec)
	ro.Timings.SandboxStart = time.Since(t0)
	if err != nil {
		r.boxes.Release(1)
		if ctx.Err() != nil {
			return nil, FailCancelled, err
		}
		// A bad spec (a missing image, impossible limits) fails the same
		// way every time: never retried.
		ro.deterministic = errors.Is(err, sandbox.ErrInvalid)
		return nil, FailSandbox, err
	}
	if im, ok := sb.(sandbox.ImageIdentifier); ok {
		ro.ImageID = im.ImageID()
	}
	// The manifest records what the container got, not what was asked.
	if lr, ok := sb.(sandbox.LimitsReporter); ok {
		a := lr.Applied()
		ro.Limits.MemoryBytes, ro.Limits.CPUs, ro.Limits.PIDs = a.MemoryBytes, a.CPUs, a.PIDs
		ro.Limits.DiskBytes, ro.Limits.ReadOnlyRoot = a.DiskBytes, a.ReadOnlyRoot
		ro.Network, ro.Runtime, ro.Backend = a.Network, a.Runtime, a.Backend
	}
	return sb, "", nil
}

// tokensExpected reports whether the run's backend promises token ids: a
// tokens-mode backend, or the chat backend with chat_token_ids. An empty
// backend name (a library caller's own Policy) promises nothing.
func (r *Runner) tokensExpected() bool {
	b := r.cfg.Inference.Backend
	return b != "" && (b != inference.BackendChat || r.cfg.Inference.ChatTokenIDs)
}

// checkSequence refuses a silent empty: when token ids are expected, an
// episode the model finished must come with a sequence whose tokens, mask
// and logprobs are aligned, and with trained (sampled) tokens when a
// generation succeeded. A server that does not return ids (llama.cpp's
// chat endpoint without logprobs, say) must fail the rollout, never pass
// as ok with nothing a trainer could use.
func (r *Runner) checkSequence(res agentloop.Result) error {
	if !r.tokensExpected() {
		return nil
	}
	if len(res.ReasoningPerTurn) == 0 && res.StopReason == agentloop.StopContextLength {
		// Not the server failing to return ids: the task's first prompt
		// alone does not fit the context, so nothing was generated.
		return fmt.Errorf("%w: the first prompt does not fit the model's context (stop reason context_length before any generation); nothing to train on", inference.ErrRequest)
	}
	seq := res.Sequence
	n := len(seq.Tokens)
	switch {
	case n == 0:
		return fmt.Errorf("%w: server returned no token ids (backend %s expects them; %d generations)", inference.ErrInfra, r.cfg.Inference.Backend, len(res.ReasoningPerTurn))
	case len(seq.Mask) != n || len(seq.Logprobs) != n:
		return fmt.Errorf("%w: misaligned token sequence: %d tokens, %d mask entries, %d logprobs", inference.ErrInfra, n, len(seq.Mask), len(seq.Logprobs))
	}
	if len(res.ReasoningPerTurn) > 0 && !slices.Contains(seq.Mask, 1) {
		return fmt.Errorf("%w: server returned no ids for the sampled tokens: %d tokens, none trained after %d generations", inference.ErrInfra, n, len(res.ReasoningPerTurn))
	}
	return nil
}

func loopFailure(reason agentloop.StopReason, err error) string {
	switch {
	case reason == agentloop.StopSandboxErr || errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrClosed):
		return FailSandbox
	case reason == agentloop.StopRequestErr || errors.Is(err, inference.ErrRequest):
		return FailRejected
	case reason == agentloop.StopCancelled || errors.Is(err, context.Canceled):
		return FailCancelled
	case errors.Is(err, agentloop.ErrConfig):
		return FailTask
	case reason == agentloop.StopEnvErr && errors.Is(err, datasets.ErrInvalid):
		return FailTask // the item does not fit the responder's templates
	case reason == agentloop.StopEnvErr:
		return FailEnvFeedback
	}
	return FailInference
}

func (ro *Rollout) fail(kind string, err error) {
	ro.Status = StatusInfraFailed
	msg := "unknown error"
	if err != nil {
		msg = err.Error()
	}
	ro.Failure = &Failure{Kind: kind, Message: msg}
}

func finalContent(res agentloop.Result) string {
	for i := len(res.Messages) - 1; i >= 0; i-- {
		if res.Messages[i].Role == "assistant" {
			return res.Messages[i].Content
		}
	}
	return ""
}

// assemble computes the group statistics and advantages over ok rollouts.
func assemble(g *Group, a Advantage) {
	var sum float64
	for _, ro := range g.Rollouts {
		if ro.Status == StatusOK {
			g.OK++
			sum += ro.Score.Value
		}
	}
	if g.OK == 0 {
		return
	}
	g.Mean = sum / float64(g.OK)
	var ss float64
	equal := true
	for _, ro := range g.Rollouts {
		if ro.Status == StatusOK {
			d := ro.Score.Value - g.Mean
			ss += d * d
			if math.Abs(d) > 1e-12 {
				equal = false
			}
		}
	}
	g.Std = math.Sqrt(ss / float64(g.OK))
	g.Dropped = a.DropEqual && equal
	if a.Mode == AdvantageNone {
		return
	}
	for i := range g.Rollouts {
		ro := &g.Rollouts[i]
		if ro.Status != StatusOK {
			continue
		}
		adv := ro.Score.Value - g.Mean
		if a.Mode == AdvantageGRPO {
			adv /= g.Std + 1e-6
		}
		ro.Advantage = &adv
	}
}

func newID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + strings.ToLower(hex.EncodeToString(b[:]))
}

// distill asks the teacher for its top-K logprobs at every trained
// position of the rollout's sequence (the student's exact ids), then, with
// a Hinter, replaces the turns it found a hint for with their scores under
// the hint-enhanced context and records each hint as a loop event.
func (r *Runner) distill(ctx context.Context, ro *Rollout, first int, kwargs map[string]any) error {
	seq := ro.Result.Sequence
	if len(seq.Tokens) == 0 || !slices.Contains(seq.Mask, 1) {
		return nil
	}
	last := len(seq.Mask) - 1
	for seq.Mask[last] == 0 {
		last--
	}
	t0 := time.Now()
	defer func() { ro.Timings.Distill = time.Since(t0) }()
	ids, lps, err := r.deps.Distiller.Score(ctx, seq.Tokens[:last+1], func(p int) bool { return seq.Mask[p] == 1 })
	if err != nil {
		return fmt.Errorf("distill: %w", err)
	}
	for len(ids) < len(seq.Tokens) {
		ids, lps = append(ids, nil), append(lps, nil)
	}
	if r.deps.Hinter != nil {
		hinted, st, err := r.deps.Hinter.HintTurns(ctx, inference.HintInput{
			Messages: ro.Result.Messages, First: first, Tools: ro.Tools, ChatTemplateKwargs: kwargs, Sequence: seq,
		})
		if err != nil {
			return fmt.Errorf("distill hints: %w", err)
		}
		if st.Unreadable > 0 {
			level := slog.LevelDebug
			if r.hintWarned.CompareAndSwap(false, true) {
				level = slog.LevelWarn
			}
			r.log.Log(ctx, level, "hint judge replies without a verdict (\\boxed{1} or \\boxed{-1}) count for no hint; rollout_distill_hint_votes_total{verdict=\"unreadable\"} counts them",
				"rollout", ro.ID, "unreadable", st.Unreadable, "turns_judged", st.Judged)
		}
		for _, h := range hinted {
			for j := range h.IDs {
				if h.IDs[j] != nil {
					ids[h.Start+j], lps[h.Start+j] = h.IDs[j], h.Logprobs[j]
				}
			}
			ro.Result.Events = append(ro.Result.Events, agentloop.Event{
				Turn: h.Turn + 1, Kind: agentloop.EventDistillHint, Message: h.Message,
				Detail: h.Hint, Original: fmt.Sprintf("%d of %d votes", h.Positive, h.Votes),
			})
		}
		slices.SortStableFunc(ro.Result.Events, func(a, b agentloop.Event) int { return a.Turn - b.Turn })
	}
	ro.DistillTokenIDs, ro.DistillLogprobs = ids, lps
	return nil
}
