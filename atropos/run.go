package atropos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

// SpoolSubdir is the spool's directory inside a run directory: a resumed
// run (the same output.dir) replays what an earlier process left there.
const SpoolSubdir = "atropos-spool"

// ErrUndelivered is wrapped by RunBridge.Finish when groups are still in
// the spool at the end of a run (the API was down, or slower than the
// caller's deadline). They are not lost: the next run on the same output
// directory sends them first.
var ErrUndelivered = errors.New("groups not delivered to the Atropos API")

// RunSetup says how OpenRun builds the bridge of one run.
type RunSetup struct {
	// Mode is the run's job mode (assemble). Only assemble.ModeRun feeds a
	// trainer; assemble refuses an explicit atropos.url in the others.
	Mode string
	// DefaultURL applies when the run config names no atropos.url (the
	// server's --atropos-url).
	DefaultURL string
	// Logger receives the bridge's logs (slog.Default()).
	Logger *slog.Logger
}

// RunBridge is the bridge of one run as `rollout run` and the server's
// jobs use it: a runner.Sink and runner.Admitter to pass in
// assemble.Options.Sinks, ended by Finish once the run returned.
type RunBridge struct {
	b   *Bridge
	url string

	mu      sync.Mutex
	stopped error // the runner.ErrIntakeStopped that Admit returned
}

var (
	_ runner.Sink     = (*RunBridge)(nil)
	_ runner.Admitter = (*RunBridge)(nil)
)

// OpenRun starts the bridge a run config asks for, or returns nil when it
// asks for none: atropos.url (else setup.DefaultURL) names the API, the
// spool is <output.dir>/atropos-spool, G is group_size or the env's
// default, the registered name atropos.name or the env's name, and the
// other atropos keys map to Options. It validates cfg first, so a bad run
// config fails before anything is registered; configuration errors wrap
// runner.ErrConfig. The bridge's background work is detached from ctx's
// cancellation: Finish bounds it.
func OpenRun(ctx context.Context, cfg runner.Config, setup RunSetup) (*RunBridge, error) {
	a := cfg.Atropos
	url := a.URL
	if url == "" {
		url = setup.DefaultURL
	}
	if url == "" || a.Disabled || setup.Mode != assemble.ModeRun {
		return nil, nil
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Checked now rather than at the first group, after its compute.
	if cfg.Inference.Backend == inference.BackendChat && !cfg.Inference.ChatTokenIDs {
		return nil, fmt.Errorf("%w: atropos: the chat backend returns no token ids, which a trainer needs: use a tokens-mode backend (vllm, vllm-generate, sglang, atropos) or inference.chat_token_ids", runner.ErrConfig)
	}
	if cfg.Output.Dir == "" {
		return nil, fmt.Errorf("%w: output.dir: required with the Atropos bridge (its spool is <output.dir>/%s)", runner.ErrConfig, SpoolSubdir)
	}
	env, err := assemble.OpenEnv(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: env: %w", runner.ErrConfig, err)
	}
	g := cfg.GroupSize
	if g == 0 { // as the runner resolves it
		g = max(env.Defaults().GroupSize, 1)
	}
	knobs := a.AtroposKnobs
	if knobs.Name == "" {
		knobs.Name = env.Name()
	}
	spoolDir := filepath.Join(cfg.Output.Dir, SpoolSubdir)
	b, err := New(context.WithoutCancel(ctx), Options{
		URL: url, SpoolDir: spoolDir, GroupSize: g, AtroposKnobs: knobs, Logger: setup.Logger,
	})
	if errors.Is(err, ErrConfig) {
		return nil, fmt.Errorf("%w: %w", runner.ErrConfig, err)
	}
	if err != nil {
		return nil, err
	}
	if err := b.reconcile(ctx, cfg.Output.Dir); err != nil {
		_ = b.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return &RunBridge{b: b, url: url}, nil
}

// reconcile closes the crash window between the run directory and the
// spool: the runner hands a group to the bridge only after it is durable in
// the run directory, so a crash in between leaves groups there that the
// bridge never saw, and the resumed run counts them as done. Every group of
// the run directory from the spool's since.json on that the spool does not
// know (pending, or in handed.log: delivered, refused or skipped) is
// converted from its records and spooled now. A spool without since.json
// (new, or from an older release) gets one at the run directory's current
// group count: groups written before the bridge existed are not its own.
func (b *Bridge) reconcile(ctx context.Context, runDir string) error {
	sincePath := filepath.Join(b.opts.SpoolDir, sinceName)
	count := func() (int64, error) {
		run, err := trajectory.Open(runDir)
		if errors.Is(err, trajectory.ErrNoManifest) || errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		var n int64
		err = run.EachGroup(ctx, func(int64, []trajectory.Record) error { n++; return nil })
		return n, err
	}
	raw, err := os.ReadFile(sincePath)
	if errors.Is(err, os.ErrNotExist) {
		n, err := count()
		if err != nil {
			return fmt.Errorf("atropos: reconcile with the run directory: %w", err)
		}
		data, _ := json.Marshal(map[string]int64{"from_sequence": n})
		if err := os.WriteFile(sincePath, data, 0o644); err != nil {
			return fmt.Errorf("atropos: %w", err)
		}
		return syncDir(b.opts.SpoolDir)
	}
	if err != nil {
		return fmt.Errorf("atropos: %w", err)
	}
	var since struct {
		From int64 `json:"from_sequence"`
	}
	if err := json.Unmarshal(raw, &since); err != nil {
		return fmt.Errorf("atropos: %s: %w", sincePath, err)
	}
	known, err := b.spool.known()
	if err != nil {
		return err
	}
	run, err := trajectory.Open(runDir)
	if errors.Is(err, trajectory.ErrNoManifest) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("atropos: reconcile with the run directory: %w", err)
	}
	spooled := 0
	err = run.EachGroup(ctx, func(seq int64, recs []trajectory.Record) error {
		id := recs[0].GroupID
		if seq < since.From || known[id] {
			return nil
		}
		e, skip, err := b.convertRecords(id, recs[0].RunID, recs)
		if err != nil {
			return err
		}
		if skip != "" {
			b.mu.Lock()
			b.st.skipped++
			b.mu.Unlock()
			return b.spool.markHanded([]string{id})
		}
		if err := b.spool.append(e); err != nil {
			return fmt.Errorf("atropos: spool group %s: %w", id, err)
		}
		spooled++
		return nil
	})
	if err != nil {
		return fmt.Errorf("atropos: reconcile with the run directory: %w", err)
	}
	if spooled > 0 {
		b.log.Info("spooled groups the previous run made durable but never handed to the bridge", "groups", spooled)
		b.mu.Lock()
		b.notify()
		b.mu.Unlock()
	}
	return nil
}

// Bridge returns the underlying bridge (for Stats).
func (r *RunBridge) Bridge() *Bridge { return r.b }

// Admit implements runner.Admitter (Bridge.Admit), remembering an intake
// stop so that Finish can tell it from a failure.
func (r *RunBridge) Admit(ctx context.Context) error {
	err := r.b.Admit(ctx)
	if errors.Is(err, runner.ErrIntakeStopped) {
		r.mu.Lock()
		if r.stopped == nil {
			r.stopped = err
		}
		r.mu.Unlock()
	}
	return err
}

// WriteGroup implements runner.Sink (Bridge.WriteGroup).
func (r *RunBridge) WriteGroup(ctx context.Context, run *runner.RunInfo, g *runner.Group) error {
	return r.b.WriteGroup(ctx, run, g)
}

// Finish ends the bridge of a run that returned runErr (or that could not
// start: pass the error and a ctx that is already done, and nothing is
// awaited). It closes the bridge, delivering spooled groups until ctx ends,
// and returns the run's outcome:
//   - runErr, except that runner.ErrIntakeStopped caused by the bridge
//     (the trainer reached its step budget) is success;
//   - joined with what the run did not report itself: the failure that
//     stopped the bridge after the runner's last call, and groups left in
//     the spool (ErrUndelivered, naming the spool).
func (r *RunBridge) Finish(ctx context.Context, runErr error) error {
	log := r.b.log
	if n := r.b.Stats().Pending; n > 0 && ctx.Err() == nil {
		log.Info("delivering the spooled groups before closing", "pending", n)
	}
	closeErr := r.b.Close(ctx)
	st := r.b.Stats()
	r.mu.Lock()
	stopped := r.stopped
	r.mu.Unlock()
	if stopped != nil && errors.Is(runErr, runner.ErrIntakeStopped) {
		log.Info("the run ended because the trainer has what it needs", "reason", stopped.Error())
		runErr = nil
	}
	var errs []error
	if fatal := r.b.Err(); fatal != nil && !errors.Is(runErr, fatal) {
		errs = append(errs, fatal)
	}
	if st.Pending > 0 {
		errs = append(errs, fmt.Errorf("%w: %d groups for %s are still in %s; the next run on this output dir sends them first",
			ErrUndelivered, st.Pending, r.url, r.b.opts.SpoolDir))
	}
	if closeErr != nil {
		errs = append(errs, closeErr)
	}
	if len(errs) == 0 {
		return runErr
	}
	return errors.Join(append([]error{runErr}, errs...)...)
}

// CheckURL reports whether url can be a bridge's Options.URL (an
// ErrConfig naming the problem otherwise), for flags checked at startup.
func CheckURL(url string) error {
	o := Options{URL: url, SpoolDir: ".", GroupSize: 1}
	o.defaults()
	return o.validate()
}
