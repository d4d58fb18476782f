package assemble

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/builtin"
	"github.com/rollout-rl/rollout/gateway/capture"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/runner"
)

// jobGateway is the job's one capture gateway over its policy (harness
// envs' sessions), built on the first session so that a job without
// harness tasks never needs one: a chat-mode job runs, and only its
// harness tasks fail, with capture's reason.
type jobGateway struct {
	policy inference.Policy
	opts   capture.Options

	once sync.Once
	gw   *capture.Gateway
	err  error
}

var _ runner.Gateway = (*jobGateway)(nil)

func newJobGateway(cfg runner.Config, policy inference.Policy, log *slog.Logger) *jobGateway {
	opts := capture.Options{Parser: cfg.Parser, ReasoningParser: cfg.ReasoningParser, Sampling: cfg.Sampling,
		Doors: builtin.FrontDoors(), Logger: log}
	if cfg.Inference.Model != "" {
		opts.Models = []string{cfg.Inference.Model}
	}
	return &jobGateway{policy: policy, opts: opts}
}

func (j *jobGateway) get() (*capture.Gateway, error) {
	j.once.Do(func() {
		j.gw, j.err = capture.New(j.policy, j.opts)
		if j.err != nil {
			j.err = fmt.Errorf("%w: gateway for harness envs: %w", runner.ErrConfig, j.err)
		}
	})
	return j.gw, j.err
}

// OpenSession implements runner.Gateway.
func (j *jobGateway) OpenSession(ctx context.Context, spec inference.EpisodeSpec, maxCalls int) (runner.GatewaySession, error) {
	gw, err := j.get()
	if err != nil {
		return nil, err
	}
	// The group's sampling (the run's or a trainer's) governs the session.
	s, err := gw.OpenWith(ctx, spec, capture.SessionOptions{Sampling: &spec.Sampling, MaxCalls: maxCalls})
	if err != nil {
		return nil, err
	}
	return gatewaySession{gw: gw, s: s}, nil
}

// CallLimit implements runner.Gateway.
func (j *jobGateway) CallLimit() int { return j.opts.CallLimit() }

type gatewaySession struct {
	gw *capture.Gateway
	s  *capture.Session
}

func (g gatewaySession) Serve(l net.Listener) error { return g.gw.ServeSession(l, g.s.ID()) }

func (g gatewaySession) Close(ctx context.Context) (gateway.SessionRecord, error) {
	return g.s.Close(ctx)
}
