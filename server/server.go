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

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/internal/util/netpolicy"
	"github.com/rollout-rl/rollout/internal/util/secrets"
	"github.com/rollout-rl/rollout/internal/util/version"
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
	// CancelGrace bounds how long a job cancelled without cancel_in_flight
	// lets its in-flight rollouts finish before it cancels them too
	// (cancel.go): 0 means DefaultCancelGrace, negative no bound.
	CancelGrace time.Duration
	// JobSinks, when set, gives each job extra sinks (`rollout serve
	// --atropos-url` adds an Atropos bridge through it; the server does not
	// know what they are). It is called for every job started or resumed,
	// after the job's config passed the path policy and before the job
	// opens, not for CollectGroups streams, whose groups go to their
	// caller. An error fails StartJob (InvalidArgument for one wrapping
	// runner.ErrConfig).
	JobSinks func(ctx context.Context, spec JobSpec) (ExtraSinks, error)
	// Quotas bound each tenant's jobs, sandboxes and rows (quota.go): the
	// defaults of every tenant, and the quotas of the single-token and
	// anonymous tenants.
	Quotas Quotas
	// Tenants are the server's clients, each with its own bearer token and
	// quotas (tenant.go, LoadTenants); Transport.Token adds one more
	// (DefaultTenant). Jobs and streams belong to the tenant that started
	// them.
	Tenants []Tenant
	// NetPolicy, when set, confines every connection a job or stream
	// makes (inference endpoints, teacher, judges, MCP servers, web
	// providers): non-public addresses only where it allows them (urls.go,
	// internal/util/netpolicy).
	NetPolicy *netpolicy.Policy
}

// JobSpec is a job as Options.JobSinks sees it.
type JobSpec struct {
	ID   string
	Mode string // assemble.ModeRun or assemble.ModeEval
	// Config is the job's run config with its paths resolved (output.dir
	// is absolute).
	Config runner.Config
	Logger *slog.Logger // carries the job id
}

// ExtraSinks are what Options.JobSinks adds to one job.
type ExtraSinks struct {
	// Sinks follow the job's Parquet output and WatchJob streams; sinks
	// that implement runner.Admitter gate the job's intake.
	Sinks []runner.Sink
	// End, when set, is called once the job's run has returned, with its
	// error, and returns the error the job ends with: runErr, possibly
	// joined with the sinks' own failures, or nil for an intake stop the
	// sinks asked for (the job then succeeds). ctx is detached from the
	// job's cancellation, bounded (jobEndTimeout) and cancelled when a
	// shutdown's drain runs out. A job that could not open gets its error
	// and a ctx that is already done: release, do not wait.
	End func(ctx context.Context, runErr error) error
}

// jobEndTimeout bounds ExtraSinks.End, e.g. an Atropos bridge delivering
// its spool to an API that is down.
const jobEndTimeout = 2 * time.Minute

// Server implements rolloutv1.RolloutServiceServer.
type Server struct {
	rolloutv1.UnimplementedRolloutServiceServer
	opts      Options
	log       *slog.Logger
	store     *store
	sandboxes runner.Sandboxes
	images    runner.ImageBuilder
	quota     *quotaBook
	// legacy maps the client names of jobs recorded before tenants (a
	// token digest) to the tenant holding that token.
	legacy map[string]string

	mu         sync.Mutex
	jobs       map[string]*jobRun
	starting   map[string]bool // job ids whose StartJob is in progress
	collectors map[*collector]bool
	outputs    map[string]string // output dir -> the job or stream writing it

	// wg counts jobs and collect streams. Add happens only under mu while
	// not shutting down, so it never races Shutdown's Wait.
	wg           sync.WaitGroup
	shuttingDown atomic.Bool
	quit         chan struct{} // closed by Shutdown
	quitOnce     sync.Once
	// hard ends when a shutdown's drain runs out: jobs' ExtraSinks.End
	// stop waiting then.
	hard     context.Context
	hardStop context.CancelFunc
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
		images: opts.Images, jobs: map[string]*jobRun{}, starting: map[string]bool{}, collectors: map[*collector]bool{}, outputs: map[string]string{},
		quit: make(chan struct{}), quota: newQuotaBook(opts.Quotas, opts.Tenants), legacy: map[string]string{}}
	for _, t := range opts.Tenants {
		s.legacy[legacyClient(t.TokenSHA256)] = t.Name
	}
	s.hard, s.hardStop = context.WithCancel(context.WithoutCancel(ctx))
	if err := s.resumeJobs(ctx); err != nil {
		s.hardStop()
		return nil, fmt.Errorf("resume jobs: %w", err)
	}
	return s, nil
}

// Register adds the service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { rolloutv1.RegisterRolloutServiceServer(g, s) }

// Shutdown stops intake of every job and collect stream; with
// cancelInFlight running rollouts are cancelled too. It waits for the jobs
// to flush their outputs and for the streams to send their in-flight
// groups, or for ctx, after which in-flight rollouts are cancelled and
// waited for. Jobs interrupted here stay RUNNING on disk and resume on the
// next start. New jobs and streams are refused from the first call on.
func (s *Server) Shutdown(ctx context.Context, cancelInFlight bool) error {
	s.mu.Lock()
	s.shuttingDown.Store(true)
	s.quitOnce.Do(func() { close(s.quit) })
	for _, jr := range s.jobs {
		if jr.runner != nil {
			jr.runner.StopIntake()
		}
		if cancelInFlight && jr.cancel != nil {
			jr.cancel()
		}
	}
	for c := range s.collectors {
		if cancelInFlight {
			c.cancel()
		}
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.hardStop()
		s.mu.Lock()
		for _, jr := range s.jobs {
			if jr.cancel != nil {
				jr.cancel()
			}
		}
		for c := range s.collectors {
			c.cancel()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}

// track counts a job or stream in wg unless the server is shutting down.
func (s *Server) track() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shuttingDown.Load() {
		return false
	}
	s.wg.Add(1)
	return true
}

var errShuttingDown = status.Error(codes.Unavailable, "server shutting down: retry against the restarted server")

// claimOutput reserves an output dir for one writer: two writers in one
// run directory would interleave part files and break resume.
func (s *Server) claimOutput(dir, owner string) error {
	if dir == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.outputs[dir]; ok && cur != owner {
		return status.Errorf(codes.FailedPrecondition, "output.dir: %s is being written by %s", dir, cur)
	}
	s.outputs[dir] = owner
	return nil
}

func (s *Server) releaseOutput(dir, owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.outputs[dir] == owner {
		delete(s.outputs, dir)
	}
}

func (s *Server) addJob(jr *jobRun) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jobs[jr.st.ID] = jr
}

func (s *Server) job(ctx context.Context, id string) (*jobRun, error) {
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "job_id: required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	jr, ok := s.jobs[id]
	// Another tenant's job is answered as if it did not exist: a tenant
	// learns nothing of the others' jobs.
	if !ok || !s.owns(ctx, jr.st.Client) {
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
	field := "config_yaml"
	switch c := req.GetConfig().(type) {
	case *rolloutv1.StartJobRequest_ConfigYaml:
		text = c.ConfigYaml
	case *rolloutv1.StartJobRequest_ConfigPath:
		field = "config_path"
		if c.ConfigPath == "" {
			return nil, status.Error(codes.InvalidArgument, "config_path: empty")
		}
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
		return nil, status.Errorf(codes.InvalidArgument, "%s: empty", field)
	}
	if req.JobId != "" && !validID(req.JobId) {
		return nil, status.Error(codes.InvalidArgument, "job_id: use letters, digits, '-' and '_' (at most 64)")
	}
	switch req.Mode {
	case rolloutv1.JobMode_JOB_MODE_UNSPECIFIED:
		req.Mode = rolloutv1.JobMode_JOB_MODE_RUN
	case rolloutv1.JobMode_JOB_MODE_RUN, rolloutv1.JobMode_JOB_MODE_EVAL:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "mode: unknown value %d", req.Mode)
	}
	if s.shuttingDown.Load() {
		return nil, errShuttingDown
	}
	id := req.JobId
	if id == "" {
		id = newJobID()
	}
	// Reserve the id: a retried StartJob returns the job the first one
	// started instead of starting it twice.
	s.mu.Lock()
	if jr, ok := s.jobs[id]; ok {
		s.mu.Unlock()
		if !s.owns(ctx, jr.st.Client) {
			return nil, status.Errorf(codes.AlreadyExists, "job_id: %q is taken; choose another", id)
		}
		return &rolloutv1.StartJobResponse{Job: jr.proto()}, nil
	}
	if s.starting[id] {
		s.mu.Unlock()
		return nil, status.Errorf(codes.Aborted, "job_id: job %q is being started by another call; retry", id)
	}
	s.starting[id] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.starting, id)
		s.mu.Unlock()
	}()
	st := jobState{ID: id, Mode: req.Mode, ConfigYAML: text, CreatedAt: time.Now().UTC(), Client: tenantOf(ctx)}
	jr, err := s.startJob(ctx, st)
	if err != nil {
		return nil, fieldStatus(field, err)
	}
	s.log.Info("job started", "job", id, "env", jr.st.Env, "output", jr.st.OutputDir)
	return &rolloutv1.StartJobResponse{Job: jr.proto()}, nil
}

// GetJob implements RolloutServiceServer.
func (s *Server) GetJob(ctx context.Context, req *rolloutv1.GetJobRequest) (*rolloutv1.GetJobResponse, error) {
	jr, err := s.job(ctx, req.JobId)
	if err != nil {
		return nil, err
	}
	return &rolloutv1.GetJobResponse{Job: jr.proto()}, nil
}

// ListJobs implements RolloutServiceServer.
func (s *Server) ListJobs(ctx context.Context, _ *rolloutv1.ListJobsRequest) (*rolloutv1.ListJobsResponse, error) {
	s.mu.Lock()
	list := make([]*jobRun, 0, len(s.jobs))
	for _, jr := range s.jobs {
		if s.owns(ctx, jr.st.Client) {
			list = append(list, jr)
		}
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
func (s *Server) CancelJob(ctx context.Context, req *rolloutv1.CancelJobRequest) (*rolloutv1.CancelJobResponse, error) {
	jr, err := s.job(ctx, req.JobId)
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
		} else {
			s.boundCancel(jr)
		}
	}
	return &rolloutv1.CancelJobResponse{Job: jr.proto()}, nil
}

// WatchJob implements RolloutServiceServer.
func (s *Server) WatchJob(req *rolloutv1.WatchJobRequest, stream rolloutv1.RolloutService_WatchJobServer) error {
	jr, err := s.job(stream.Context(), req.JobId)
	if err != nil {
		return err
	}
	if req.FromSequence != nil && (!req.IncludeGroups || *req.FromSequence < 0) {
		return status.Error(codes.InvalidArgument, "from_sequence: needs include_groups and must not be negative")
	}
	if err := checkLayout("token_layout", req.TokenLayout); err != nil {
		return err
	}
	compact := compactLayout(req.TokenLayout)
	w := &watcher{groups: req.IncludeGroups, ch: make(chan *rolloutv1.WatchJobResponse, 1024), lost: make(chan struct{})}
	jr.mu.Lock()
	ended := false
	select {
	case <-jr.done:
		ended = true
	default:
		// Registered before the run directory is read: a group made durable
		// from now on arrives live; one already durable is on disk. One
		// that is both is sent once (by sequence).
		jr.watchers[w] = true
	}
	p := cloneProgress(jr.progress)
	dir, cfgYAML := jr.st.OutputDir, jr.st.ConfigYAML
	jr.mu.Unlock()
	if !ended {
		defer func() {
			jr.mu.Lock()
			delete(jr.watchers, w)
			jr.mu.Unlock()
		}()
	}
	next := int64(-1) // live groups below this sequence were replayed
	if req.FromSequence != nil {
		next = *req.FromSequence
		dropEqual := false
		if cfg, err := runner.ParseConfig([]byte(cfgYAML)); err == nil {
			dropEqual = cfg.Advantage.DropEqual
		}
		err := replayGroups(stream.Context(), dir, next, dropEqual, func(g *rolloutv1.Group) error {
			next = g.GetSequence() + 1
			if compact {
				g = CompactGroup(g)
			}
			return stream.Send(&rolloutv1.WatchJobResponse{Event: &rolloutv1.WatchJobResponse_Group{Group: g}})
		})
		if err != nil {
			return toStatus(err)
		}
	}
	if ended {
		return jr.sendEnd(stream)
	}
	if err := stream.Send(&rolloutv1.WatchJobResponse{Event: &rolloutv1.WatchJobResponse_Progress{Progress: p}}); err != nil {
		return err
	}
	send := func(ev *rolloutv1.WatchJobResponse) (bool, error) {
		if g := ev.GetGroup(); g != nil && g.Sequence != nil && *g.Sequence < next {
			return false, nil // already replayed from the run directory
		}
		if g := ev.GetGroup(); g != nil && compact {
			// The event is shared by every watcher: compact a copy.
			ev = &rolloutv1.WatchJobResponse{Event: &rolloutv1.WatchJobResponse_Group{Group: CompactGroup(g)}}
		}
		if err := stream.Send(ev); err != nil {
			return true, err
		}
		_, fin := ev.Event.(*rolloutv1.WatchJobResponse_Finished)
		return fin, nil
	}
	for {
		select {
		case ev := <-w.ch:
			if end, err := send(ev); end {
				return err
			}
		case <-w.lost:
			return status.Error(codes.ResourceExhausted, "watcher fell behind the job's groups and was disconnected; reconnect and read the run directory for what was missed")
		case <-jr.done:
			// The final event is queued before done closes: send what is
			// left, then end the stream.
			for {
				select {
				case ev := <-w.ch:
					if end, err := send(ev); end {
						return err
					}
					continue
				default:
				}
				break
			}
			return jr.sendEnd(stream)
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// sendEnd ends a watch of an ended job: the final job, or Unavailable when
// the server is shutting down and the job will resume on the next start.
func (j *jobRun) sendEnd(stream rolloutv1.RolloutService_WatchJobServer) error {
	j.mu.Lock()
	interrupted := j.interrupted
	j.mu.Unlock()
	if interrupted {
		return status.Errorf(codes.Unavailable, "server shutting down: job %s resumes when the server restarts; watch it again then", j.st.ID)
	}
	return stream.Send(&rolloutv1.WatchJobResponse{Event: &rolloutv1.WatchJobResponse_Finished{Finished: j.proto()}})
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

// checkConfig resolves the config's server paths under the path policy:
// output.dir, dataset.path, an env file, sandbox.kubernetes.kubeconfig,
// and the env_config keys that name
// host paths (path, dir, *_path, *_dir, *_file, e.g. terminal-bench's tasks_dir).
// Field names in errors get prefix. A job needs an output dir; a collect
// stream may go without.
func (s *Server) checkConfig(cfg *runner.Config, prefix string, needOutput bool) error {
	var err error
	switch {
	case cfg.Output.Dir == "" && needOutput:
		return fmt.Errorf("%w: output.dir: required for a job (the run directory; it makes the job resumable)", runner.ErrConfig)
	case cfg.Output.Dir != "":
		if cfg.Output.Dir, err = s.resolvePath(prefix+"output.dir", cfg.Output.Dir); err != nil {
			return err
		}
		if st := s.opts.StateDir; st != "" {
			if abs, aerr := filepath.Abs(st); aerr == nil && (cfg.Output.Dir == abs || strings.HasPrefix(cfg.Output.Dir, abs+string(filepath.Separator)) ||
				strings.HasPrefix(abs, cfg.Output.Dir+string(filepath.Separator))) {
				return status.Errorf(codes.PermissionDenied, "%soutput.dir: %s overlaps the server's state dir", prefix, cfg.Output.Dir)
			}
		}
	}
	if cfg.Dataset.Path != "" {
		if cfg.Dataset.Path, err = s.resolvePath(prefix+"dataset.path", cfg.Dataset.Path); err != nil {
			return err
		}
	}
	if strings.HasSuffix(cfg.Env, ".yaml") || strings.HasSuffix(cfg.Env, ".yml") {
		if cfg.Env, err = s.resolvePath(prefix+"env", cfg.Env); err != nil {
			return err
		}
	}
	if k := cfg.Sandbox.Kubernetes; k != nil && k.Kubeconfig != "" {
		// The kubeconfig is a host file holding credentials: the same
		// policy as every other path (an empty one means the server's
		// own: $KUBECONFIG, ~/.kube/config or in-cluster).
		kc := *k
		if kc.Kubeconfig, err = s.resolvePath(prefix+"sandbox.kubernetes.kubeconfig", kc.Kubeconfig); err != nil {
			return err
		}
		cfg.Sandbox.Kubernetes = &kc
	}
	return s.checkEnvPaths(&cfg.EnvConfig, prefix+"env_config")
}

// checkEnvPaths applies the path policy to env_config values whose keys
// name paths, rewriting them to the resolved absolute path.
func (s *Server) checkEnvPaths(n *yaml.Node, field string) error {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for i, c := range n.Content {
			f := field
			if n.Kind == yaml.SequenceNode {
				f = fmt.Sprintf("%s.%d", field, i)
			}
			if err := s.checkEnvPaths(c, f); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i].Value, n.Content[i+1]
			f := field + "." + k
			if v.Kind == yaml.ScalarNode && v.Value != "" && (k == "path" || k == "dir" || strings.HasSuffix(k, "_path") || strings.HasSuffix(k, "_dir") || strings.HasSuffix(k, "_file")) {
				p, err := s.resolvePath(f, v.Value)
				if err != nil {
					return err
				}
				v.Value = p
				continue
			}
			if err := s.checkEnvPaths(v, f); err != nil {
				return err
			}
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

// fieldStatus maps err like toStatus, prefixing invalid-input messages with
// the request field they came from.
func fieldStatus(field string, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, secrets.ErrNotAllowed) {
		return status.Error(codes.PermissionDenied, field+": "+err.Error())
	}
	if errors.Is(err, runner.ErrConfig) || errors.Is(err, envs.ErrConfig) || errors.Is(err, datasets.ErrInvalid) {
		return status.Error(codes.InvalidArgument, field+": "+err.Error())
	}
	return toStatus(err)
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
	case errors.Is(err, secrets.ErrNotAllowed):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, runner.ErrConfig), errors.Is(err, envs.ErrConfig), errors.Is(err, datasets.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, assemble.ErrOutputInUse):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, sandbox.ErrUnavailable), errors.Is(err, dockerclient.ErrUnreachable), errors.Is(err, inference.ErrUnreachable):
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
