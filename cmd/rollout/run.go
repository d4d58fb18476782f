package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/atropos"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

func init() {
	register(func() *cobra.Command { return newCollectCmd(assemble.ModeRun) })
	register(func() *cobra.Command { return newCollectCmd(assemble.ModeEval) })
}

// runFlags are the config overrides shared by run and eval.
type runFlags struct {
	config      string
	out         string
	groups      int
	groupSize   int
	endpoints   []string
	backend     string
	model       string
	parser      string
	reasoning   string
	maxTurns    int
	seed        uint64
	k           int
	allowEvalOn bool
	image       string
	atroposURL  string
	tracing     tracingFlags
}

func (f *runFlags) add(cmd *cobra.Command, mode string) {
	fl := cmd.Flags()
	fl.StringVarP(&f.config, "config", "c", "", "run config YAML (required; see docs/config.md)")
	fl.StringVar(&f.out, "out", "", "output run directory (overrides output.dir; re-running resumes)")
	fl.IntVar(&f.groups, "groups", -1, "number of items/groups (overrides groups; 0 = all)")
	fl.IntVar(&f.groupSize, "group-size", 0, "rollouts per group (overrides group_size)")
	fl.StringSliceVar(&f.endpoints, "endpoint", nil, "inference base URL, repeatable (overrides inference.endpoints)")
	fl.StringVar(&f.backend, "backend", "", "inference backend: chat, vllm, vllm-generate, sglang, atropos")
	fl.StringVar(&f.model, "model", "", "served model name (overrides inference.model)")
	fl.StringVar(&f.parser, "parser", "", "tool-call parser (vLLM --tool-call-parser name)")
	fl.StringVar(&f.reasoning, "reasoning-parser", "", "reasoning parser")
	fl.IntVar(&f.maxTurns, "max-turns", 0, "turn limit per rollout (overrides max_turns)")
	fl.Uint64Var(&f.seed, "seed", 0, "seed (overrides seed when non-zero)")
	fl.StringVar(&f.image, "image", "", "sandbox image for every rollout (overrides sandbox.image)")
	f.tracing.add(fl)
	if mode == assemble.ModeEval {
		fl.IntVar(&f.k, "k", 0, "k of pass@k (overrides eval.k; default group size)")
	} else {
		fl.BoolVar(&f.allowEvalOn, "allow-eval-only", false, "run an eval-only env for collection")
		fl.StringVar(&f.atroposURL, "atropos-url", "", "also feed the groups to this Atropos API (run-api) as an Atropos env (overrides atropos.url; docs/atropos.md)")
	}
}

func (f *runFlags) apply(cmd *cobra.Command, cfg *runner.Config) {
	ch := cmd.Flags().Changed
	if f.out != "" {
		cfg.Output.Dir = f.out
	}
	if ch("groups") {
		cfg.Groups = f.groups
	}
	if f.groupSize > 0 {
		cfg.GroupSize = f.groupSize
	}
	if len(f.endpoints) > 0 {
		cfg.Inference.Endpoints = f.endpoints
	}
	if f.backend != "" {
		cfg.Inference.Backend = f.backend
	}
	if f.model != "" {
		cfg.Inference.Model = f.model
	}
	if f.parser != "" {
		cfg.Parser = f.parser
	}
	if f.reasoning != "" {
		cfg.ReasoningParser = f.reasoning
	}
	if f.maxTurns > 0 {
		cfg.MaxTurns = f.maxTurns
	}
	if f.seed != 0 {
		cfg.Seed = f.seed
	}
	if f.k > 0 {
		cfg.Eval.K = f.k
	}
	if f.allowEvalOn {
		cfg.AllowEvalOnly = true
	}
	if f.image != "" {
		cfg.Sandbox.Image = f.image
	}
	if f.atroposURL != "" {
		cfg.Atropos.URL, cfg.Atropos.Disabled = f.atroposURL, false
	}
}

func newCollectCmd(mode string) *cobra.Command {
	f := &runFlags{}
	short := "Collect scored GRPO groups into a run directory (Parquet)"
	if mode == assemble.ModeEval {
		short = "Evaluate a policy on an env's eval split: pass@k, per-category metrics, samples"
	}
	cmd := &cobra.Command{
		Use:   mode + " -c CONFIG.yaml",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.config == "" {
				return usageError(cmd, errors.New("--config is required"))
			}
			cfg, err := runner.LoadConfig(f.config)
			if err != nil {
				return withExitCode(2, err)
			}
			f.apply(cmd, &cfg)
			stopTracing, err := f.tracing.start(cmd.Context(), newLogger(os.Stderr))
			if err != nil {
				return withExitCode(2, err)
			}
			defer stopTracing()
			return collect(cmd, cfg, mode)
		},
	}
	f.add(cmd, mode)
	return cmd
}

// collect runs one job with a progress display and prints the summary.
func collect(cmd *cobra.Command, cfg runner.Config, mode string) error {
	ctx := cmd.Context()
	log := newLogger(os.Stderr)
	prog := newProgress(os.Stderr, log)
	// The output dir's writer lock before anything writes there (the
	// bridge's spool): a second writer is refused naming the holder.
	var lock *trajectory.DirLock
	if cfg.Output.Dir != "" && cfg.Validate() == nil {
		l, err := assemble.LockOutput(cfg.Output.Dir, "rollout "+mode)
		if err != nil {
			return err
		}
		lock = l
	}
	// The Atropos bridge, when the config or --atropos-url asks for one.
	bridge, err := atropos.OpenRun(ctx, cfg, atropos.RunSetup{Mode: mode, Logger: log})
	if err != nil {
		_ = lock.Unlock()
		return exitStatus(err)
	}
	var sinks []runner.Sink
	if bridge != nil {
		sinks = append(sinks, bridge)
	}
	j, err := assemble.Open(ctx, cfg, assemble.Options{Mode: mode, Logger: log, Progress: prog.event, Sinks: sinks, Lock: lock})
	if err != nil {
		if bridge != nil {
			done, cancel := context.WithCancel(ctx)
			cancel() // the run never started: release the bridge, wait for nothing
			err = bridge.Finish(done, err)
		}
		return exitStatus(err)
	}
	stopped := boundStop(ctx, log)
	sum, err := j.Run(ctx)
	stopped()
	prog.done()
	if bridge != nil {
		err = finishBridge(ctx, bridge, err)
	}
	printSummary(cmd.OutOrStdout(), j.Dir, sum)
	if bridge != nil {
		st := bridge.Bridge().Stats()
		fmt.Fprintf(cmd.OutOrStdout(), "atropos:     %d groups delivered, %d skipped (equal scores or no ok rollout), %d rejected, %d still spooled\n",
			st.Delivered, st.Skipped, st.Rejected, st.Pending)
	}
	if mode == assemble.ModeEval && (err == nil || errors.Is(err, assemble.ErrRunFailed)) {
		fmt.Fprintf(cmd.OutOrStdout(), "eval report: %s/eval/metrics.json\n", j.Dir)
	}
	return exitStatus(err)
}

// finishBridge ends a run's Atropos bridge: it waits up to 2 minutes for
// the spooled groups to reach the API, 5 seconds after an interrupted run,
// and Ctrl-C during the wait ends it. What is left stays in the spool for
// the next run on the output dir, and makes the command fail.
func finishBridge(ctx context.Context, b *atropos.RunBridge, runErr error) error {
	d := 2 * time.Minute
	if ctx.Err() != nil {
		d = 5 * time.Second
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	if ctx.Err() == nil {
		defer context.AfterFunc(ctx, cancel)()
	}
	return b.Finish(cctx, runErr)
}

// newLogger logs text on a terminal and JSON otherwise, at the level of
// $ROLLOUT_LOG_LEVEL (debug, info, warn, error; default info).
func newLogger(w *os.File) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(os.Getenv("ROLLOUT_LOG_LEVEL"))); err != nil {
		level = slog.LevelInfo
	}
	if isTerminal(w) {
		return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}
