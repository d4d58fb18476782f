package assemble

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/builtin"
	"github.com/rollout-rl/rollout/gateway/capture"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/util/version"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/tools"
	"github.com/rollout-rl/rollout/trajectory"
)

// StandaloneEnv is the env name a standalone gateway's rows carry: the
// caller's harness and reward are outside rollout.
const StandaloneEnv = "gateway"

// StandaloneOptions are what `rollout gateway` adds to the run config.
type StandaloneOptions struct {
	Logger *slog.Logger
	// IdleTimeout and MaxSessions are capture.Options'.
	IdleTimeout time.Duration
	MaxSessions int
	// OnExpire receives each session the idle expiry closed.
	OnExpire func(s *capture.Session, rec gateway.SessionRecord, err error)
}

// Standalone is a standalone gateway's run: a capture gateway over the
// config's policy (its parser, reasoning parser and sampling), the run
// directory its groups are written to and the run info they carry. The
// caller (server's GatewayService) owns sessions and groups.
type Standalone struct {
	Gateway *capture.Gateway
	cfg     runner.Config
	info    runner.RunInfo
	writer  *trajectory.Writer
	lock    *trajectory.DirLock
	policy  inference.Policy
	teacher *inference.Teacher // distill: scores every ok session's branches
}

// OpenStandalone validates cfg for a standalone gateway and assembles it.
// The config's env, dataset and sandbox keys do not apply (the harnesses
// run elsewhere; an env is ignored); output.dir is required: every
// finished group is written there, and it is locked until Close.
func OpenStandalone(ctx context.Context, cfg runner.Config, opts StandaloneOptions) (*Standalone, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Env != "" {
		log.Info("the run config's env is not used by a standalone gateway (its caller runs the harnesses and posts the rewards)", "env", cfg.Env)
	}
	cfg.Env = StandaloneEnv
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Output.Dir == "" {
		return nil, fmt.Errorf("%w: output.dir: required (the run directory every finished group is written to)", runner.ErrConfig)
	}
	if cfg.Parser == "" {
		return nil, fmt.Errorf("%w: parser: required (the gateway parses tool calls with rollout's parsers)", runner.ErrConfig)
	}
	if cfg.GroupSize == 0 {
		cfg.GroupSize = 1
	}
	if cfg.Advantage.Mode == "" {
		cfg.Advantage.Mode = runner.AdvantageGRPO
	}
	icfg := cfg.Inference
	icfg.Logger = log
	policy, err := inference.New(icfg)
	if err != nil {
		return nil, fmt.Errorf("%w: inference: %w", runner.ErrConfig, err)
	}
	// The checks a run makes before its first rollout: a wrong model,
	// key or template would otherwise fail every session's first call.
	for _, c := range policyChecks(policy, cfg.Sampling) {
		if err := c.check(ctx); err != nil {
			closePolicy(policy)
			return nil, startError(err)
		}
	}
	var teacher *inference.Teacher
	if cfg.Distill != nil {
		if cfg.Distill.Hints != nil {
			closePolicy(policy)
			return nil, fmt.Errorf("%w: distill.hints: not implemented for a standalone gateway (the teacher scores its sessions' branches, but hints judge the own agent loop's turns): remove distill.hints", runner.ErrConfig)
		}
		if teacher, err = inference.NewTeacher(*cfg.Distill); err != nil {
			closePolicy(policy)
			return nil, fmt.Errorf("%w: distill: %w", runner.ErrConfig, err)
		}
		// The teacher scores every finished session: a wrong model or key
		// would fail them all after the harnesses' work.
		if err := teacher.Ready(ctx, cfg.Inference.ReadyTimeout); err != nil {
			closePolicy(policy)
			_ = teacher.Close()
			return nil, startError(fmt.Errorf("the distillation start check: %w", err))
		}
	}
	closeAll := func() {
		closePolicy(policy)
		if teacher != nil {
			_ = teacher.Close()
		}
	}
	copts := capture.Options{Parser: cfg.Parser, ReasoningParser: cfg.ReasoningParser, Sampling: cfg.Sampling,
		Doors: builtin.FrontDoors(), Logger: log, IdleTimeout: opts.IdleTimeout, MaxSessions: opts.MaxSessions, OnExpire: opts.OnExpire}
	if cfg.Inference.Model != "" {
		copts.Models = []string{cfg.Inference.Model}
	}
	gw, err := capture.New(policy, copts)
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("%w: %w", runner.ErrConfig, err)
	}
	lock, err := LockOutput(cfg.Output.Dir, "rollout gateway")
	if err != nil {
		closeAll()
		return nil, err
	}
	w, runID, err := openWriter(ctx, cfg, Options{Mode: "gateway", Logger: log}, StandaloneEnv)
	if err != nil {
		closeAll()
		_ = lock.Unlock()
		return nil, err
	}
	sampling, _ := json.Marshal(cfg.Sampling)
	s := &Standalone{Gateway: gw, cfg: cfg, writer: w, lock: lock, policy: policy, teacher: teacher, info: runner.RunInfo{
		RunID: runID, Env: StandaloneEnv, Model: cfg.Inference.Model, Parser: cfg.Parser,
		ServiceVersion: version.Get().Version, ConfigHash: cfg.Hash(), SamplingJSON: string(sampling),
		PolicyVersion: cfg.PolicyVersion, RolloutTimeout: time.Duration(cfg.RolloutTimeout),
		ToolTimeout: tools.DefaultTerminalTimeout, PassThreshold: cfg.Eval.PassThreshold,
	}}
	return s, nil
}

func closePolicy(p inference.Policy) {
	if c, ok := p.(interface{ Close() error }); ok {
		_ = c.Close()
	}
}

// Config is the run config as the gateway uses it (group_size at least 1,
// the advantage mode set).
func (s *Standalone) Config() runner.Config { return s.cfg }

// Info is the run info every group is recorded with.
func (s *Standalone) Info() *runner.RunInfo { return &s.info }

// Dir is the run directory.
func (s *Standalone) Dir() string { return s.writer.Dir() }

// WriteGroup writes a finished group to the run directory as the runner's
// Parquet sink does (assemble.Records' rows, one unit; durable when it
// returns) and sets its Sequence.
func (s *Standalone) WriteGroup(ctx context.Context, g *runner.Group) error {
	return (&parquetSink{w: s.writer}).WriteGroup(ctx, &s.info, g)
}

// Distiller is the distillation teacher (the config's distill block), or
// nil: the caller scores each ok session's branches with it
// (runner.DistillBranches) before the group is assembled.
func (s *Standalone) Distiller() runner.Distiller {
	if s.teacher == nil {
		return nil
	}
	return s.teacher
}

// Close flushes and closes the run directory, releases its lock and the
// policy's and teacher's connections. Open sessions are the caller's to
// close first.
func (s *Standalone) Close(ctx context.Context) error {
	err := s.writer.Close(ctx)
	closePolicy(s.policy)
	if s.teacher != nil {
		_ = s.teacher.Close()
	}
	return errors.Join(err, s.lock.Unlock())
}
