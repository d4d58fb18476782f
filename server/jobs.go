// Package server implements the gRPC RolloutService: jobs (start, watch,
// cancel, resume after a restart), trainer-driven collection with credit
// flow control, the environment catalogue, auth, rate limits and errors
// mapped to gRPC codes. It adapts assemble and the runner; it does not
// re-implement them.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rollout-rl/rollout/assemble"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/internal/util/netpolicy"
	"github.com/rollout-rl/rollout/runner"
)

// jobState is what survives a restart: <state-dir>/jobs/<id>.json.
type jobState struct {
	ID         string             `json:"id"`
	Mode       rolloutv1.JobMode  `json:"mode"`
	State      rolloutv1.JobState `json:"state"`
	ConfigYAML string             `json:"config_yaml"`
	Env        string             `json:"env"`
	OutputDir  string             `json:"output_dir"`
	Error      string             `json:"error,omitempty"`
	CreatedAt  time.Time          `json:"created_at"`
	FinishedAt *time.Time         `json:"finished_at,omitempty"`
	Resumed    int32              `json:"resumed"`
	// Client is the tenant that started the job (its name; a token digest
	// in records from before tenants): it owns the job, and the job counts
	// against its quotas.
	Client string `json:"client,omitempty"`
	// Progress of the last run (protojson), so ended jobs keep their
	// counters across restarts.
	Progress json.RawMessage `json:"progress,omitempty"`
}

// jobRun is a job in this process.
type jobRun struct {
	mu       sync.Mutex
	st       jobState
	progress *rolloutv1.JobProgress
	runner   *runner.Runner
	updater  assemble.Updater   // BeginPolicyUpdate/EndPolicyUpdate (update.go)
	cancel   context.CancelFunc // cancels in-flight rollouts
	done     chan struct{}
	watchers map[*watcher]bool
	stopped  bool // CancelJob was called
	// interrupted: the server shut down before the job ended; it stays
	// RUNNING on disk and resumes on the next start.
	interrupted bool
}

func newJobRun(st jobState) *jobRun {
	p := &rolloutv1.JobProgress{}
	if st.State != rolloutv1.JobState_JOB_STATE_RUNNING && len(st.Progress) > 0 {
		_ = protojson.Unmarshal(st.Progress, p) // counters are informational
	}
	return &jobRun{st: st, done: make(chan struct{}), watchers: map[*watcher]bool{}, progress: p}
}

func cloneProgress(p *rolloutv1.JobProgress) *rolloutv1.JobProgress {
	return proto.Clone(p).(*rolloutv1.JobProgress)
}

// watcher is one WatchJob stream.
type watcher struct {
	groups bool
	ch     chan *rolloutv1.WatchJobResponse
	lost   chan struct{} // closed when the watcher fell too far behind
	once   sync.Once
}

func (j *jobRun) proto() *rolloutv1.Job {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := &rolloutv1.Job{
		Id: j.st.ID, Mode: j.st.Mode, State: j.st.State, Env: j.st.Env, OutputDir: j.st.OutputDir,
		Progress: cloneProgress(j.progress), Error: j.st.Error, CreatedAt: timestamppb.New(j.st.CreatedAt), Resumed: j.st.Resumed,
	}
	if j.st.FinishedAt != nil {
		out.FinishedAt = timestamppb.New(*j.st.FinishedAt)
	}
	return out
}

// broadcast sends ev to every watcher without ever blocking the job: a
// watcher that cannot keep up is disconnected (its stream ends with
// ResourceExhausted) rather than slowing collection.
func (j *jobRun) broadcast(ev *rolloutv1.WatchJobResponse, isGroup bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for w := range j.watchers {
		if isGroup && !w.groups {
			continue
		}
		select {
		case w.ch <- ev:
		default:
			if isGroup {
				w.once.Do(func() { close(w.lost) })
				delete(j.watchers, w)
			}
			// A dropped progress event is superseded by the next one.
		}
	}
}

// store persists job states.
type store struct {
	dir string
	mu  sync.Mutex
}

func (s *store) save(st jobState) error {
	if s.dir == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := filepath.Join(s.dir, "jobs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("save job %s: %w", st.ID, err)
	}
	b, _ := json.MarshalIndent(st, "", "  ")
	tmp := filepath.Join(dir, "."+st.ID+".json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("save job %s: %w", st.ID, err)
	}
	return os.Rename(tmp, filepath.Join(dir, st.ID+".json"))
}

func (s *store) load() ([]jobState, error) {
	if s.dir == "" {
		return nil, nil
	}
	files, err := filepath.Glob(filepath.Join(s.dir, "jobs", "*.json"))
	if err != nil {
		return nil, err
	}
	var out []jobState
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("load job %s: %w", f, err)
		}
		var st jobState
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, fmt.Errorf("load job %s: %w", f, err)
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, k int) bool { return out[i].CreatedAt.Before(out[k].CreatedAt) })
	return out, nil
}

// startJob opens a job, adds it to the server and launches it in the
// background.
func (s *Server) startJob(ctx context.Context, st jobState) (*jobRun, error) {
	cfg, err := runner.ParseConfig([]byte(st.ConfigYAML))
	if err != nil {
		return nil, err
	}
	mode := assemble.ModeRun
	if st.Mode == rolloutv1.JobMode_JOB_MODE_EVAL {
		mode = assemble.ModeEval
	}
	if err := s.checkConfig(&cfg, "", true); err != nil {
		return nil, err
	}
	if err := s.checkURLs(ctx, st.ConfigYAML, ""); err != nil {
		return nil, err
	}
	if err := s.claimOutput(cfg.Output.Dir, "job "+st.ID); err != nil {
		return nil, err
	}
	if !s.track() {
		s.releaseOutput(cfg.Output.Dir, "job "+st.ID)
		return nil, errShuttingDown
	}
	launched := false
	defer func() {
		if !launched {
			s.releaseOutput(cfg.Output.Dir, "job "+st.ID)
			s.wg.Done()
		}
	}()
	// The output dir's writer lock comes first: the job sinks (the Atropos
	// spool) write there too. Another process's writer is refused here.
	lock, err := assemble.LockOutput(cfg.Output.Dir, "job "+st.ID)
	if err != nil {
		return nil, err
	}
	jr := newJobRun(st)
	log := s.log.With("job", st.ID)
	runCtx, cancel := context.WithCancel(netpolicy.With(context.WithoutCancel(ctx), s.opts.NetPolicy))
	jr.cancel = cancel
	var extra ExtraSinks
	if s.opts.JobSinks != nil {
		if extra, err = s.opts.JobSinks(runCtx, JobSpec{ID: st.ID, Mode: mode, Config: cfg, Logger: log}); err != nil {
			cancel()
			_ = lock.Unlock()
			return nil, err // the hook's errors name what failed
		}
	}
	j, err := assemble.Open(runCtx, cfg, assemble.Options{
		Mode: mode, Logger: log, Sandboxes: s.sandboxes, Images: s.images, RunID: "", Lock: lock,
		Progress: func(e runner.Event) { s.onProgress(jr, e) },
		Sinks:    append([]runner.Sink{&watchSink{jr: jr}}, extra.Sinks...),
	})
	if err != nil {
		cancel()
		return nil, s.endSinks(extra, err, false)
	}
	rows, err := jobRows(runCtx, j.Runner)
	var release func()
	if err == nil {
		release, err = s.quota.reserve(s.tenantOfClient(st.Client), sandboxesOf(j.Runner), rows)
	}
	if err != nil {
		_ = j.Close(context.WithoutCancel(ctx))
		cancel()
		return nil, s.endSinks(extra, err, false)
	}
	defer func() {
		if !launched {
			release()
		}
	}()
	jr.runner = j.Runner
	jr.updater = j.Updater()
	jr.st.Env = j.Env.Name()
	jr.st.OutputDir = j.Dir
	jr.st.State = rolloutv1.JobState_JOB_STATE_RUNNING
	jr.st.Error, jr.st.FinishedAt = "", nil
	if err := s.store.save(jr.st); err != nil {
		_ = j.Close(context.WithoutCancel(ctx))
		cancel()
		return nil, s.endSinks(extra, err, false)
	}
	s.addJob(jr)
	launched = true
	go func() {
		defer s.wg.Done()
		defer s.releaseOutput(cfg.Output.Dir, "job "+st.ID)
		defer cancel()
		defer release()
		sum, err := j.Run(runCtx)
		s.finish(jr, sum, s.endSinks(extra, err, true))
	}()
	return jr, nil
}

// endSinks calls the job's ExtraSinks.End with the run's error and returns
// the job's. After a run (ran) it may wait, up to jobEndTimeout or until a
// shutdown's drain runs out; for a job that never ran its ctx is done.
func (s *Server) endSinks(extra ExtraSinks, runErr error, ran bool) error {
	if extra.End == nil {
		return runErr
	}
	ctx, cancel := context.WithTimeout(s.hard, jobEndTimeout)
	defer cancel()
	if !ran {
		cancel()
	}
	return extra.End(ctx, runErr)
}

func (s *Server) onProgress(jr *jobRun, e runner.Event) {
	if e.Rollout != nil {
		observeRollout(jr.st.Env, e.Rollout)
	}
	if e.Group != nil {
		observeGroup(jr.st.Env, "job", e.Group)
	}
	jr.mu.Lock()
	p := jr.progress
	if e.Total > 0 {
		p.GroupsTotal = int32(e.Total)
	}
	if ro := e.Rollout; ro != nil {
		p.Rollouts++
		if ro.Status == runner.StatusOK {
			p.RolloutsOk++
		} else {
			p.InfraFailed++
		}
	}
	if g := e.Group; g != nil {
		p.GroupsDone++
		if g.Dropped {
			p.GroupsDropped++
		}
	}
	if jr.runner != nil {
		p.MeanReward = jr.runner.Summary().MeanReward
		p.GroupsSkipped = int32(jr.runner.Summary().GroupsSkipped)
	}
	cp := cloneProgress(p)
	jr.mu.Unlock()
	jr.broadcast(&rolloutv1.WatchJobResponse{Event: &rolloutv1.WatchJobResponse_Progress{Progress: cp}}, false)
}

// finish records a job's end. A job interrupted by server shutdown stays
// RUNNING in its state file so the next server resumes it; its watchers'
// streams end with Unavailable.
func (s *Server) finish(jr *jobRun, sum runner.Summary, err error) {
	env := jr.st.Env
	jr.mu.Lock()
	now := time.Now().UTC()
	shutdown := err != nil && s.shuttingDown.Load() && !jr.stopped
	switch {
	case shutdown:
		// leave RUNNING: resumed on restart
	case jr.stopped && err != nil:
		jr.st.State = rolloutv1.JobState_JOB_STATE_CANCELLED
	case err != nil:
		jr.st.State = rolloutv1.JobState_JOB_STATE_FAILED
		jr.st.Error = err.Error()
	default:
		jr.st.State = rolloutv1.JobState_JOB_STATE_SUCCEEDED
	}
	if !shutdown {
		jr.st.FinishedAt = &now
	}
	jr.interrupted = shutdown
	jr.progress.GroupsSkipped = int32(sum.GroupsSkipped)
	jr.progress.MeanReward = sum.MeanReward
	if b, err := protojson.Marshal(jr.progress); err == nil {
		jr.st.Progress = b
	}
	st := jr.st
	jr.mu.Unlock()
	if err := s.store.save(st); err != nil {
		s.log.Error("save job state", "job", st.ID, "error", err)
	}
	s.log.Info("job ended", "job", st.ID, "env", env, "state", st.State.String(), "interrupted", shutdown,
		"groups", sum.Groups, "rollouts", sum.Rollouts, "error", errString(err))
	if !shutdown {
		fin := jr.proto()
		jr.broadcast(&rolloutv1.WatchJobResponse{Event: &rolloutv1.WatchJobResponse_Finished{Finished: fin}}, false)
	}
	close(jr.done)
}

func errString(err error) string {
	if err == nil || errors.Is(err, runner.ErrIntakeStopped) {
		return ""
	}
	return err.Error()
}

// watchSink forwards completed groups to watchers.
type watchSink struct{ jr *jobRun }

func (w *watchSink) WriteGroup(_ context.Context, run *runner.RunInfo, g *runner.Group) error {
	pg, err := groupProto(run, g)
	if err != nil {
		return err
	}
	w.jr.broadcast(&rolloutv1.WatchJobResponse{Event: &rolloutv1.WatchJobResponse_Group{Group: pg}}, true)
	return nil
}

var _ runner.Sink = (*watchSink)(nil)

// resumeJobs restarts the jobs a previous server left running.
func (s *Server) resumeJobs(ctx context.Context) error {
	states, err := s.store.load()
	if err != nil {
		return err
	}
	for _, st := range states {
		if st.State != rolloutv1.JobState_JOB_STATE_RUNNING {
			jr := newJobRun(st)
			close(jr.done)
			s.addJob(jr)
			continue
		}
		st.Resumed++
		if _, err := s.startJob(ctx, st); err != nil {
			now := time.Now().UTC()
			st.State, st.Error, st.FinishedAt = rolloutv1.JobState_JOB_STATE_FAILED, "resume: "+err.Error(), &now
			if serr := s.store.save(st); serr != nil {
				s.log.Error("save job state", "job", st.ID, "error", serr)
			}
			jr := newJobRun(st)
			close(jr.done)
			s.addJob(jr)
			s.log.Error("job could not be resumed", "job", st.ID, "error", err)
			continue
		}
		s.log.Info("job resumed after restart", "job", st.ID, "resumed", st.Resumed)
	}
	return nil
}
