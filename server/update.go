package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rollout-rl/rollout/assemble"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/inference"
)

// updater finds the update coordinator of a job or a CollectGroups stream.
func (s *Server) updater(ctx context.Context, id string) (assemble.Updater, error) {
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "job_id: empty (a StartJob job id, or a CollectGroups stream_id)")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if jr, ok := s.jobs[id]; ok && s.owns(ctx, jr.st.Client) {
		jr.mu.Lock()
		u, running := jr.updater, jr.runner != nil
		jr.mu.Unlock()
		if !running {
			return nil, status.Errorf(codes.FailedPrecondition, "job %s is not running", id)
		}
		if u == nil {
			return nil, status.Errorf(codes.FailedPrecondition, "job %s: its policy does not support policy updates", id)
		}
		return u, nil
	}
	for c := range s.collectors {
		if c.id == id && c.j != nil && s.owns(ctx, c.tenant) {
			if u := c.j.Updater(); u != nil {
				return u, nil
			}
			return nil, status.Errorf(codes.FailedPrecondition, "stream %s: its policy does not support policy updates", id)
		}
	}
	return nil, status.Errorf(codes.NotFound, "no running job or open CollectGroups stream %q", id)
}

func updateStatus(err error) error {
	switch {
	case errors.Is(err, inference.ErrUpdate) && errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, inference.ErrUpdate):
		var ie *inference.Error
		if errors.As(err, &ie) {
			return status.Error(codes.Unavailable, err.Error())
		}
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return toStatus(err)
}

// BeginPolicyUpdate implements RolloutServiceServer.
func (s *Server) BeginPolicyUpdate(ctx context.Context, req *rolloutv1.BeginPolicyUpdateRequest) (*rolloutv1.BeginPolicyUpdateResponse, error) {
	u, err := s.updater(ctx, req.JobId)
	if err != nil {
		return nil, err
	}
	mode := req.Mode
	if mode == "" {
		mode = inference.PauseAbort
	}
	if !slices.Contains(inference.PauseModes(), mode) {
		return nil, status.Errorf(codes.InvalidArgument, "mode: %q, want one of %s", mode, strings.Join(inference.PauseModes(), ", "))
	}
	cur := u.PolicyVersion()
	if req.Version < cur {
		return nil, status.Errorf(codes.InvalidArgument, "version: %d is older than the current version %d", req.Version, cur)
	}
	st, err := u.BeginUpdate(ctx, mode)
	if err != nil {
		return nil, updateStatus(fmt.Errorf("begin policy update of %s to version %d: %w", req.JobId, req.Version, err))
	}
	metricUpdates.WithLabelValues(mode, fmt.Sprint(st.Fallback)).Inc()
	metricPauseSeconds.Observe(st.PauseTook.Seconds())
	s.log.Info("policy update begun", "job", req.JobId, "version", req.Version, "mode", mode, "fallback", st.Fallback, "in_flight", st.InFlight, "pause", st.PauseTook)
	return &rolloutv1.BeginPolicyUpdateResponse{Fallback: st.Fallback, InFlight: int32(st.InFlight), PauseMs: st.PauseTook.Milliseconds(), CurrentVersion: cur}, nil
}

// EndPolicyUpdate implements RolloutServiceServer.
func (s *Server) EndPolicyUpdate(ctx context.Context, req *rolloutv1.EndPolicyUpdateRequest) (*rolloutv1.EndPolicyUpdateResponse, error) {
	u, err := s.updater(ctx, req.JobId)
	if err != nil {
		return nil, err
	}
	st, err := u.EndUpdate(ctx, req.Version)
	if err != nil {
		return nil, updateStatus(fmt.Errorf("end policy update of %s to version %d: %w", req.JobId, req.Version, err))
	}
	metricResumeSeconds.Observe(st.ResumeTook.Seconds())
	s.log.Info("policy update ended", "job", req.JobId, "version", req.Version, "resume", st.ResumeTook)
	return &rolloutv1.EndPolicyUpdateResponse{Version: u.PolicyVersion(), ResumeMs: st.ResumeTook.Milliseconds()}, nil
}
