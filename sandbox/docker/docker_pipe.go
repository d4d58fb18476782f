package docker

import (
	"context"
	"fmt"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/agent"
)

// Pipe implements Piper. ctx bounds only the start; the command lives
// until Close, its exit or the sandbox's end.
func (s *dockerSandbox) Pipe(ctx context.Context, req sandbox.ExecRequest) (sandbox.Pipe, error) {
	// The gate is held until the start request is sent: a reset in place
	// cancels a pipe already open.
	end, err := s.Begin()
	if err != nil {
		return nil, err
	}
	defer end()
	if req.Shell || req.Timeout != 0 || req.Stdin != nil || req.MergeOutput {
		return nil, fmt.Errorf("%w: a pipe takes Argv or Command only", sandbox.ErrInvalid)
	}
	spec, err := sandbox.ToSpec(req)
	if err != nil {
		return nil, err
	}
	p, err := s.Conn.Pipe(ctx, agent.Request{Op: agent.OpPipe, Exec: spec}, s.Wrap)
	if err != nil {
		return nil, s.Wrap("pipe", err)
	}
	return p, nil
}
