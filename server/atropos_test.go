package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/atropos"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/internal/testkit/atropostest"
	"github.com/rollout-rl/rollout/runner"
)

// atroposHook is what `rollout serve --atropos-url` installs: a bridge per
// run job, ended with the job.
func atroposHook(defaultURL string) func(context.Context, JobSpec) (ExtraSinks, error) {
	return func(ctx context.Context, spec JobSpec) (ExtraSinks, error) {
		b, err := atropos.OpenRun(ctx, spec.Config, atropos.RunSetup{Mode: spec.Mode, DefaultURL: defaultURL, Logger: spec.Logger})
		if err != nil || b == nil {
			return ExtraSinks{}, err
		}
		return ExtraSinks{Sinks: []runner.Sink{b}, End: b.Finish}, nil
	}
}

// TestJobFeedsAtropos runs jobs with the server-wide Atropos URL against
// the stand-in API: every group of a run job reaches it with the tokens,
// masks, logprobs and scores of the run directory; eval jobs and opted-out
// jobs register nothing; an eval job naming atropos.url is refused.
func TestJobFeedsAtropos(t *testing.T) {
	api := atropostest.New(t)
	api.StartTrainer(t, 64, 1<<16, 1000)
	s := newSim(t, "toolcall-match", -1)
	h := startServer(t, Options{StateDir: t.TempDir(), JobSinks: atroposHook(api.URL())}, RunOptions{})
	ctx := bg(t)

	// Every group is sent (send_equal_scores), so every group must arrive.
	j := h.start(t, startReq(jobYAML(s.URL, "runs/atropos", 3, 4)+"atropos: {send_equal_scores: true}\n", "atropos-1"))
	res := h.watch(ctx, j.Id, false, nil)
	if res.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("job: %v (%v)", res.finished, res.err)
	}
	// The job ends after its bridge delivered the spool: no waiting here.
	got, reqs := api.Snapshot()
	var want [][]atropostest.Rollout
	for _, recs := range readRun(t, j.OutputDir) {
		var g []atropostest.Rollout
		for _, r := range recs {
			if r.Status == runner.StatusOK {
				g = append(g, atropostest.Rollout{Tokens: r.Tokens, LossMask: r.LossMask, Logprobs: r.Logprobs, Reward: r.Reward})
			}
		}
		want = append(want, g)
	}
	if len(want) != 3 {
		t.Fatalf("run directory has %d groups, want 3", len(want))
	}
	atropostest.CheckGroups(t, got, want)
	for _, r := range reqs {
		if !r.Gzipped || r.Status != 200 {
			t.Errorf("request %+v", r)
		}
	}
	if _, err := os.Stat(filepath.Join(j.OutputDir, atropos.SpoolSubdir)); err != nil {
		t.Errorf("no spool in the run directory: %v", err)
	}
	api.Mu.Lock()
	envs, disconnected := append([]atropostest.Env(nil), api.Envs...), append([]int(nil), api.Disconnected...)
	api.Mu.Unlock()
	if len(envs) != 1 || envs[0].Name != "toolcall-match" || envs[0].GroupSize != 4 || len(disconnected) != 1 {
		t.Errorf("registrations %+v, disconnected %v: want one toolcall-match env of G=4, disconnected at the end", envs, disconnected)
	}

	// An eval job does not feed the trainer; naming atropos.url in one is
	// an error, not silently ignored.
	ev := h.start(t, &rolloutv1.StartJobRequest{Config: &rolloutv1.StartJobRequest_ConfigYaml{ConfigYaml: jobYAML(s.URL, "runs/eval", 1, 2)},
		Mode: rolloutv1.JobMode_JOB_MODE_EVAL})
	if r := h.watch(ctx, ev.Id, false, nil); r.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Errorf("eval job: %v (%v)", r.finished, r.err)
	}
	_, err := h.cli.StartJob(ctx, &rolloutv1.StartJobRequest{Config: &rolloutv1.StartJobRequest_ConfigYaml{
		ConfigYaml: jobYAML(s.URL, "runs/eval2", 1, 2) + "atropos: {url: " + api.URL() + "}\n"}, Mode: rolloutv1.JobMode_JOB_MODE_EVAL})
	wantCode(t, "eval job with atropos.url", err, codes.InvalidArgument, "atropos.url")
	// A run job may opt out of the server's default.
	off := h.start(t, startReq(jobYAML(s.URL, "runs/off", 1, 2)+"atropos: {disabled: true}\n", ""))
	if r := h.watch(ctx, off.Id, false, nil); r.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Errorf("opted-out job: %v (%v)", r.finished, r.err)
	}
	// A job's bad atropos settings are the caller's error.
	_, err = h.cli.StartJob(ctx, startReq(jobYAML(s.URL, "runs/bad", 1, 2)+"atropos: {url: 'ftp://x'}\n", ""))
	wantCode(t, "job with a bad atropos.url", err, codes.InvalidArgument, "URL")

	api.Mu.Lock()
	defer api.Mu.Unlock()
	if len(api.Envs) != 1 || len(api.Received) != 3 {
		t.Errorf("after the eval and opted-out jobs: %d registrations, %d groups; want 1 and 3", len(api.Envs), len(api.Received))
	}
}

// hookSink stops intake after its first group, as a bridge does when the
// trainer has enough.
type hookSink struct{ admits atomic.Int32 }

func (s *hookSink) Admit(context.Context) error {
	if s.admits.Add(1) > 1 {
		return fmt.Errorf("trainer done: %w", runner.ErrIntakeStopped)
	}
	return nil
}

func (s *hookSink) WriteGroup(context.Context, *runner.RunInfo, *runner.Group) error { return nil }

// TestJobSinksHook checks the contract of Options.JobSinks: what the hook
// sees, its sinks gating intake, End deciding the job's outcome (an intake
// stop the sinks asked for is success; End's own error fails the job), and
// a hook error refusing StartJob.
func TestJobSinksHook(t *testing.T) {
	s := newSim(t, "toolcall-match", -1)
	var mu sync.Mutex
	specs := map[string]JobSpec{}
	ended := map[string][]error{}
	hook := func(_ context.Context, spec JobSpec) (ExtraSinks, error) {
		if spec.ID == "refused" {
			return ExtraSinks{}, fmt.Errorf("%w: atropos: no API here", runner.ErrConfig)
		}
		mu.Lock()
		specs[spec.ID] = spec
		mu.Unlock()
		return ExtraSinks{Sinks: []runner.Sink{&hookSink{}}, End: func(_ context.Context, runErr error) error {
			mu.Lock()
			ended[spec.ID] = append(ended[spec.ID], runErr)
			mu.Unlock()
			if spec.ID == "end-fails" {
				return errors.Join(runErr, errors.New("2 groups not delivered"))
			}
			if errors.Is(runErr, runner.ErrIntakeStopped) {
				return nil
			}
			return runErr
		}}, nil
	}
	h := startServer(t, Options{JobSinks: hook}, RunOptions{})
	ctx := bg(t)

	j := h.start(t, startReq(jobYAML(s.URL, "runs/stop", 4, 2), "stops"))
	res := h.watch(ctx, j.Id, false, nil)
	if f := res.finished; f.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED || f.Progress.GroupsDone != 1 || f.Error != "" {
		t.Errorf("job whose sink stopped intake: %v (%v); want SUCCEEDED after 1 group", f, res.err)
	}
	j2 := h.start(t, startReq(jobYAML(s.URL, "runs/fails", 4, 2), "end-fails"))
	res = h.watch(ctx, j2.Id, false, nil)
	if f := res.finished; f.GetState() != rolloutv1.JobState_JOB_STATE_FAILED || !strings.Contains(f.Error, "2 groups not delivered") {
		t.Errorf("job whose End failed: %v (%v); want FAILED with End's error", f, res.err)
	}
	_, err := h.cli.StartJob(ctx, startReq(jobYAML(s.URL, "runs/refused", 1, 2), "refused"))
	wantCode(t, "hook error", err, codes.InvalidArgument, "no API here")

	mu.Lock()
	defer mu.Unlock()
	sp := specs["stops"]
	if sp.Mode != assemble.ModeRun || sp.Logger == nil || sp.Config.Output.Dir != filepath.Join(h.svc.opts.DataDir, "runs/stop") {
		t.Errorf("hook saw mode %q, output.dir %q, logger %v", sp.Mode, sp.Config.Output.Dir, sp.Logger)
	}
	for _, id := range []string{"stops", "end-fails"} {
		if e := ended[id]; len(e) != 1 || !errors.Is(e[0], runner.ErrIntakeStopped) {
			t.Errorf("End of %s called with %v; want once, with the intake stop", id, e)
		}
	}
	if _, ok := ended["refused"]; ok {
		t.Error("End called for a job whose hook failed")
	}
}
