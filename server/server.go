package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/internal/dockerclient"
	"github.com/rollout-rl/rollout/internal/version"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/sandbox"
)

// Options configure a Server.
type Options struct {
	// StateDir keeps job states so jobs resume after a restart; empty
	// disables persistence.
	StateDir string
	// DataDir is where relative paths of job configs (output.dir,
	// dataset.path, env files) resolve. Absolute paths must lie under
	// DataDir or one of AllowedPaths.
	DataDir      string
	AllowedPaths []string
	// Sandboxes and Images are shared by all jobs (required for jobs whose
	// tasks need sandboxes).
	Sandboxes runner.Sandboxes
	Images    runner.ImageBuilder
	Logger    *slog.Logger
}

// Server implements rolloutv1.RolloutServiceServer.
type Server struct {
	rolloutv1.UnimplementedRolloutServiceServer
	opts      Options
	log       *slog.Logger
	store     *store
	sandboxes runner.Sandboxes
	images    runner.ImageBuilder

	mu   sync.Mutex
	jobs map[string]*jobRun

	wg           sync.WaitGroup
	shuttingDown atomic.Bool
}

var _ rolloutv1.RolloutServiceServer = (*Server)(nil)

// New creates a server and resumes the jobs a previous server left running.
func New(ctx context.Context, opts Options) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DataDir == "" {
		opts.DataDir = "."
	}
	abs, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, err
	}
	opts.DataDir = abs
	s := &Server{opts: opts, log: opts.Logger, store: &store{dir: opts.StateDir}, sandboxes: opts.Sandboxes,
		images: opts.Images, jobs: map[string]*jobRun{}}
	if err := s.resumeJobs(ctx); err != nil {
		return nil, fmt.Errorf("resume jobs: %w", err)
	}
	return s, nil
}

// Register adds the service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { rolloutv1.RegisterRolloutServiceServer(g, s) }

// Shutdown stops intake of every job; with cancelInFlight running rollouts
// are cancelled too. It waits for the jobs to flush their outputs (or ctx).
// Jobs interrupted here stay RUNNING on disk and resume on the next start.
func (s *Server) Shutdown(ctx context.Context, cancelInFlight bool) error {
	s.shuttingDown.Store(true)
	s.mu.Lock()
	for _, jr := range s.jobs {
		if jr.runner != nil {
			jr.runner.StopIntake()
		}
		if cancelInFlight && jr.cancel != nil {
			jr.cancel()
		}
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for _, jr := range s.jobs {
			if jr.cancel != nil {
				jr.cancel()
			}
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}

func (s *Server) addJob(jr *jobRun) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jobs[jr.st.ID] = jr
}

func (s *Server) job(id string) (*jobRun, error) {
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "job_id: required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	jr, ok := s.jobs[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "job_id: no job %q", id)
	}
	return jr, nil
}

// GetVersion implements RolloutServiceServer.
func (s *Server) GetVersion(ctx context.Context, _ *rolloutv1.GetVersionRequest) (*rolloutv1.GetVersionResponse, error) {
	v := version.Get()
	out := &rolloutv1.GetVersionResponse{Version: v.Version, Commit: v.Commit, GoVersion: v.GoVersion}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if cli, err := dockerclient.New(cctx); err == nil {
		out.DockerApiVersion = cli.ClientVersion()
		cli.Close()
	}
	return out, nil
}

// StartJob implements RolloutServiceServer.
func (s *Server) StartJob(ctx context.Context, req *rolloutv1.StartJobRequest) (*rolloutv1.StartJobResponse, error) {
	var text string
	switch c := req.GetConfig().(type) {
	case *rolloutv1.StartJobRequest_ConfigYaml:
		text = c.ConfigYaml
	case *rolloutv1.StartJobRequest_ConfigPath:
		p, err := s.resolvePath("config_path", c.ConfigPath)
		if err != nil {
			return nil, err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "config_path: %v", err)
		}
		text = string(b)
	default:
		return nil, status.Error(codes.InvalidArgument, "config: one of config_yaml or config_path is required")
	}
	if strings.TrimSpace(text) == "" {
		return nil, status.Error(codes.InvalidArgument, "config_yaml: empty")
	}
	if req.JobId != "" {
		if jr, err := s.job(req.JobId); err == nil {
			return &rolloutv1.StartJobResponse{Job: jr.proto()}, nil
		}
		if !validID(req.JobId) {
			return nil, status.Error(codes.InvalidArgument, "job_id: use letters, digits, '-' and '_' (at most 64)")
		}
	}
	switch req.Mode {
	case rolloutv1.JobMode_JOB_MODE_UNSPECIFIED:
		req.Mode = rolloutv1.JobMode_JOB_MODE_RUN
	case rolloutv1.JobMode_JOB_MODE_RUN, rolloutv1.JobMode_JOB_MODE_EVAL:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "mode: unknown value %d", req.Mode)
	}
	id := req.JobId
	if id == "" {
		id = newJobID()
	}
	st := jobState{ID: id, Mode: req.Mode, ConfigYAML: text, CreatedAt: time.Now().UTC()}
	jr, err := s.startJob(ctx, st)
	if err != nil {
		return nil, toStatus(err)
	}
	s.addJob(jr)
	s.log.Info("job started", "job", id, "env", jr.st.Env, "output", jr.st.OutputDir)
	return &rolloutv1.StartJobResponse{Job: jr.proto()}, nil
}

// GetJob implements RolloutServiceServer.
func (s *Server) GetJob(_ context.Context, req *rolloutv1.GetJobRequest) (*rolloutv1.GetJobResponse, error) {
	jr, err := s.job(req.JobId)
	if err != nil {
		return nil, err
	}
	return &rolloutv1.GetJobResponse{Job: jr.proto()}, nil
}

// ListJobs implements RolloutServiceServer.
func (s *Server) ListJobs(context.Context, *rolloutv1.ListJobsRequest) (*rolloutv1.ListJobsResponse, error) {
	s.mu.Lock()
	list := make([]*jobRun, 0, len(s.jobs))
	for _, jr := range s.jobs {
		list = append(list, jr)
	}
	s.mu.Unlock()
	out := make([]*rolloutv1.Job, len(list))
	for i, jr := range list {
		out[i] = jr.proto()
	}
	sort.Slice(out, func(i, k int) bool { return out[i].CreatedAt.AsTime().After(out[k].CreatedAt.AsTime()) })
	return &rolloutv1.ListJobsResponse{Jobs: out}, nil
}

// CancelJob implements RolloutServiceServer.
func (s *Server) CancelJob(_ context.Context, req *rolloutv1.CancelJobRequest) (*rolloutv1.CancelJobResponse, error) {
	jr, err := s.job(req.JobId)
	if err != nil {
		return nil, err
	}
	jr.mu.Lock()
	running := jr.st.State == rolloutv1.JobState_JOB_STATE_RUNNING && jr.runner != nil
	if running {
		jr.stopped = true
	}
	jr.mu.Unlock()
	if running {
		jr.runner.StopIntake()
		if req.CancelInFlight {
			jr.cancel()
		}
	}
	return &rolloutv1.CancelJobResponse{Job: jr.proto()}, nil
}

// WatchJob implements RolloutServiceServer.
func (s *Server) WatchJob(req *rolloutv1.WatchJobRequest, stream rolloutv1.RolloutService_WatchJobServer) error {
	jr, err := s.job(req.JobId)
	if err != nil {
		return err
	}
	w := &watcher{groups: req.IncludeGroups, ch: make(chan *rolloutv1.WatchJobResponse, 1024), lost: make(chan struct{})}
	jr.mu.Lock()
	select {
	case <-jr.done:
		jr.mu.Unlock()
		return stream.Send(&rolloutv1.WatchJobResponse{Event: &rolloutv1.WatchJobResponse_Finished{Finished: jr.proto()}})
	default:
	}
	jr.watchers[w] = true
	p := cloneProgress(jr.progress)
	jr.mu.Unlock()
	defer func() {
		jr.mu.Lock()
		delete(jr.watchers, w)
		jr.mu.Unlock()
	}()
	if err := stream.Send(&rolloutv1.WatchJobResponse{Event: &rolloutv1.WatchJobResponse_Progress{Progress: p}}); err != nil {
		return err
	}
	for {
		select {
		case ev := <-w.ch:
			if err := stream.Send(ev); err != nil {
				return err
			}
			if _, fin := ev.Event.(*rolloutv1.WatchJobResponse_Finished); fin {
				return nil
			}
		case <-w.lost:
			return status.Error(codes.ResourceExhausted, "watcher fell behind the job's groups and was disconnected; reconnect and read the run directory for what was missed")
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// ListEnvironments implements RolloutServiceServer.
func (s *Server) ListEnvironments(context.Context, *rolloutv1.ListEnvironmentsRequest) (*rolloutv1.ListEnvironmentsResponse, error) {
	out := &rolloutv1.ListEnvironmentsResponse{}
	for _, n := range envs.Names() {
		e, err := envs.New(n, nil)
		if err != nil {
			return nil, toStatus(err)
		}
		out.Environments = append(out.Environments, envProto(e))
	}
	return out, nil
}

// DescribeEnvironment implements RolloutServiceServer.
func (s *Server) DescribeEnvironment(_ context.Context, req *rolloutv1.DescribeEnvironmentRequest) (*rolloutv1.DescribeEnvironmentResponse, error) {
	if req.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "name: required")
	}
	e, err := envs.New(req.Name, nil)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "name: %v", err)
	}
	schema, defaults, err := envs.DescribeConfig(e)
	if err != nil {
		return nil, toStatus(err)
	}
	return &rolloutv1.DescribeEnvironmentResponse{Environment: envProto(e), ConfigSchemaJson: schema, DefaultConfigYaml: defaults}, nil
}

func envProto(e envs.Env) *rolloutv1.Environment {
	d := e.Defaults()
	return &rolloutv1.Environment{Name: e.Name(), Description: d.Description, GroupSize: int32(d.GroupSize), MaxTurns: int32(d.MaxTurns),
		Toolsets: d.Toolsets, Image: d.Image, EvalOnly: d.EvalOnly, Splits: d.Splits}
}

// checkConfig resolves the config's server paths under the path policy.
func (s *Server) checkConfig(cfg *runner.Config) error {
	var err error
	if cfg.Output.Dir == "" {
		return fmt.Errorf("%w: output.dir: required for a job (the run directory; it makes the job resumable)", runner.ErrConfig)
	}
	if cfg.Output.Dir, err = s.resolvePath("output.dir", cfg.Output.Dir); err != nil {
		return err
	}
	if cfg.Dataset.Path != "" {
		if cfg.Dataset.Path, err = s.resolvePath("dataset.path", cfg.Dataset.Path); err != nil {
			return err
		}
	}
	if strings.HasSuffix(cfg.Env, ".yaml") || strings.HasSuffix(cfg.Env, ".yml") {
		if cfg.Env, err = s.resolvePath("env", cfg.Env); err != nil {
			return err
		}
	}
	return nil
}

// resolvePath applies the path policy: relative paths live under DataDir;
// absolute ones must be under DataDir or an allowed prefix.
func (s *Server) resolvePath(field, p string) (string, error) {
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.opts.DataDir, p)
	}
	p = filepath.Clean(p)
	for _, prefix := range append([]string{s.opts.DataDir}, s.opts.AllowedPaths...) {
		prefix = filepath.Clean(prefix)
		if p == prefix || strings.HasPrefix(p, prefix+string(filepath.Separator)) {
			return p, nil
		}
	}
	return "", status.Errorf(codes.PermissionDenied, "%s: %s is outside the server's data dir %s and its allowed paths (--allow-path)", field, p, s.opts.DataDir)
}

// toStatus maps errors to gRPC codes, once, at the boundary.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, runner.ErrConfig), errors.Is(err, envs.ErrConfig), errors.Is(err, datasets.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, sandbox.ErrUnavailable), errors.Is(err, dockerclient.ErrUnreachable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, os.ErrNotExist):
		return status.Error(codes.NotFound, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func validID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

func newJobID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "job_" + time.Now().UTC().Format("20060102T150405") + "_" + hex.EncodeToString(b[:])
}
