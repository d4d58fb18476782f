package server

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/trajectory"
)

// TestJobStartWatchList runs a job to completion over a real socket and
// checks the watched groups against the run directory.
func TestJobStartWatchList(t *testing.T) {
	s := newSim(t, "toolcall-match", -1)
	h := startServer(t, Options{StateDir: t.TempDir()}, RunOptions{})
	ctx := bg(t)

	j := h.start(t, startReq(jobYAML(s.URL, "runs/watch", 3, 2), "watch-1"))
	if j.Id != "watch-1" || j.State != rolloutv1.JobState_JOB_STATE_RUNNING || j.Env != "toolcall-match" {
		t.Fatalf("started job: %v", j)
	}
	if want := filepath.Join(h.svc.opts.DataDir, "runs/watch"); j.OutputDir != want {
		t.Errorf("output dir %s, want %s (relative to the data dir)", j.OutputDir, want)
	}
	// Starting the same id again returns the job (idempotent retries).
	if again := h.start(t, startReq(jobYAML(s.URL, "runs/watch", 3, 2), "watch-1")); again.Id != "watch-1" {
		t.Errorf("restart of the same id returned %v", again)
	}

	res := h.watch(ctx, j.Id, true, nil)
	if res.err != nil {
		t.Fatalf("watch: %v", res.err)
	}
	if res.finished == nil || res.finished.State != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("finished: %v", res.finished)
	}
	p := res.finished.Progress
	if p.GroupsDone != 3 || p.Rollouts != 6 || p.RolloutsOk != 6 || p.InfraFailed != 0 {
		t.Errorf("final progress %v", p)
	}
	if res.finished.FinishedAt == nil {
		t.Error("finished_at unset")
	}
	// Groups may be missed only if they finished before the watch began;
	// the run directory has all of them.
	recs := readRun(t, j.OutputDir)
	if len(recs) != 3 {
		t.Fatalf("run directory has %d groups, want 3", len(recs))
	}
	for _, g := range res.groups {
		if len(g.Rollouts) != 2 || g.Env != "toolcall-match" {
			t.Errorf("group %s: %d rollouts, env %q", g.GroupId, len(g.Rollouts), g.Env)
		}
		rows := recs[g.GroupId]
		if len(rows) != 2 {
			t.Fatalf("group %s: %d records on disk", g.GroupId, len(rows))
		}
		for _, ro := range g.Rollouts {
			rec := rows[0]
			if rows[1].RolloutIndex == ro.Index {
				rec = rows[1]
			}
			if ro.Status != trajectory.StatusOK || len(ro.Tokens) == 0 || len(ro.Tokens) != len(ro.LossMask) || len(ro.Tokens) != len(ro.Logprobs) {
				t.Errorf("group %s rollout %d: status %s (%s), %d tokens, %d mask, %d logprobs", g.GroupId, ro.Index, ro.Status, ro.FailureMessage, len(ro.Tokens), len(ro.LossMask), len(ro.Logprobs))
			}
			// The stream and the files carry the same data.
			if len(rec.Tokens) != len(ro.Tokens) || rec.Reward != ro.Reward {
				t.Errorf("group %s rollout %d: stream and file differ (%d vs %d tokens, reward %v vs %v)", g.GroupId, ro.Index, len(ro.Tokens), len(rec.Tokens), ro.Reward, rec.Reward)
			}
		}
	}

	got, err := h.cli.GetJob(ctx, &rolloutv1.GetJobRequest{JobId: j.Id})
	if err != nil || got.Job.State != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("GetJob: %v %v", got, err)
	}
	list, err := h.cli.ListJobs(ctx, &rolloutv1.ListJobsRequest{})
	if err != nil || len(list.Jobs) != 1 || list.Jobs[0].Id != j.Id {
		t.Fatalf("ListJobs: %v %v", list, err)
	}
	// Watching an ended job returns its final state at once.
	if again := h.watch(ctx, j.Id, false, nil); again.err != nil || again.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Errorf("watch of an ended job: %+v", again)
	}
	// Cancelling an ended job changes nothing.
	c, err := h.cli.CancelJob(ctx, &rolloutv1.CancelJobRequest{JobId: j.Id})
	if err != nil || c.Job.State != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Errorf("CancelJob of an ended job: %v %v", c, err)
	}
	// A later job in the same (complete) run directory resumes it and
	// finds nothing left to do.
	j2 := h.start(t, startReq(jobYAML(s.URL, "runs/watch", 3, 2), ""))
	res2 := h.watch(ctx, j2.Id, false, nil)
	if res2.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED || res2.finished.Progress.GroupsSkipped != 3 || res2.finished.Progress.GroupsDone != 0 {
		t.Errorf("second job in a complete run directory: %v (%v)", res2.finished, res2.err)
	}
}

// TestCancelJob stops intake mid-job: without cancel_in_flight the group in
// flight finishes and is written; with it, the group's rollouts are
// cancelled.
func TestCancelJob(t *testing.T) {
	for _, inFlight := range []bool{false, true} {
		name := "drain"
		if inFlight {
			name = "in-flight"
		}
		t.Run(name, func(t *testing.T) {
			// Two groups of two pass the gate; the third group blocks.
			s := newSim(t, "toolcall-match", 4)
			h := startServer(t, Options{}, RunOptions{})
			t.Cleanup(s.open)
			ctx := bg(t)
			j := h.start(t, startReq(jobYAML(s.URL, "runs/cancel", 0, 2), ""))
			reached := make(chan struct{})
			watched := h.watchAsync(t, j.Id, true, progressAtLeast(2, reached))
			wait(t, "two groups", reached)
			s.waitBlocked(t, 2)

			c, err := h.cli.CancelJob(ctx, &rolloutv1.CancelJobRequest{JobId: j.Id, CancelInFlight: inFlight})
			if err != nil {
				t.Fatal(err)
			}
			if !inFlight {
				if c.Job.State != rolloutv1.JobState_JOB_STATE_RUNNING {
					t.Errorf("state right after a draining cancel: %v", c.Job.State)
				}
				s.open() // let the in-flight group finish
			}
			res := wait(t, "the watch to end", watched)
			if res.err != nil {
				t.Fatalf("watch: %v", res.err)
			}
			if res.finished.GetState() != rolloutv1.JobState_JOB_STATE_CANCELLED {
				t.Fatalf("final state %v", res.finished)
			}
			// Draining writes the group in flight; cancelling it drops the
			// partial group (a resumed run would collect it again whole).
			want := map[bool]int{false: 3, true: 2}[inFlight]
			p := res.finished.Progress
			if int(p.GroupsDone) != want || p.GroupsTotal != 7 {
				t.Errorf("progress %v: want %d groups done of 7", p, want)
			}
			recs := readRun(t, j.OutputDir)
			if len(recs) != want {
				t.Fatalf("%d groups on disk, want %d", len(recs), want)
			}
			for g, rows := range recs {
				for _, r := range rows {
					if r.Status != trajectory.StatusOK {
						t.Errorf("group %s rollout %d on disk: %s %+v", g, r.RolloutIndex, r.Status, r.Failure)
					}
				}
			}
		})
	}
}

// TestRestartResumes stops the server mid-job (draining the group in
// flight) and starts a new one on the same state dir: the job resumes
// where its run directory left off, and every group is written once.
func TestRestartResumes(t *testing.T) {
	state, data := t.TempDir(), t.TempDir()
	s := newSim(t, "toolcall-match", 4)
	h1 := startServer(t, Options{StateDir: state, DataDir: data}, RunOptions{})
	t.Cleanup(s.open)
	j := h1.start(t, startReq(jobYAML(s.URL, "runs/resume", 0, 2), "resume-me"))
	reached := make(chan struct{})
	watched := h1.watchAsync(t, j.Id, false, progressAtLeast(2, reached))
	wait(t, "two groups", reached)
	s.waitBlocked(t, 2) // the third group is in flight

	stopped := make(chan error, 1)
	go func() { stopped <- h1.stop() }()
	// Intake is stopped in the same step that marks the server as shutting
	// down; only then may the in-flight group finish.
	waitFor(t, "the shutdown to begin", h1.shuttingDown)
	s.open()
	if err := wait(t, "the server to stop", stopped); err != nil {
		t.Fatalf("server 1: %v", err)
	}
	res := wait(t, "the watch to end", watched)
	wantCode(t, "watch across shutdown", res.err, 14 /* Unavailable */, "resumes")

	b, err := os.ReadFile(filepath.Join(state, "jobs", "resume-me.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st jobState
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if st.State != rolloutv1.JobState_JOB_STATE_RUNNING {
		t.Fatalf("state file after shutdown: %v, want RUNNING (to resume)", st.State)
	}
	before := readRun(t, j.OutputDir)
	if len(before) != 3 {
		t.Fatalf("%d groups written before the restart, want 3 (2 + the drained one)", len(before))
	}

	h2 := startServer(t, Options{StateDir: state, DataDir: data}, RunOptions{})
	ctx := bg(t)
	got, err := h2.cli.GetJob(ctx, &rolloutv1.GetJobRequest{JobId: "resume-me"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Job.Resumed != 1 {
		t.Errorf("resumed %d, want 1", got.Job.Resumed)
	}
	// A client that had received groups 0 and 1 continues from sequence 2
	// across the restart: every later group exactly once, in order.
	fromSeq := int64(2)
	stream, err := h2.cli.WatchJob(ctx, &rolloutv1.WatchJobRequest{JobId: "resume-me", IncludeGroups: true, FromSequence: &fromSeq,
		TokenLayout: rolloutv1.TokenLayout_TOKEN_LAYOUT_COMPACT})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	seen := map[string]bool{}
	compactGroups := map[string]*rolloutv1.Group{}
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("watch from sequence 2: %v", err)
		}
		if g := ev.GetGroup(); g != nil {
			if g.Sequence == nil {
				t.Fatalf("group %s without a sequence", g.GroupId)
			}
			if seen[g.GroupId] {
				t.Errorf("group %s sent twice", g.GroupId)
			}
			seen[g.GroupId] = true
			seqs = append(seqs, *g.Sequence)
			// Asked for the compact layout: replayed and live groups alike.
			for _, r := range g.Rollouts {
				if len(r.Tokens) > 0 && len(r.LossMaskRuns) == 0 {
					t.Errorf("group %s rollout %d not in the compact layout", g.GroupId, r.Index)
				}
			}
			if err := ExpandGroup(g); err != nil {
				t.Error(err)
			}
			compactGroups[g.GroupId] = g
		}
	}
	if want := []int64{2, 3, 4, 5, 6}; !slices.Equal(seqs, want) {
		t.Errorf("sequences after reconnecting from 2: %v, want %v", seqs, want)
	}
	res = h2.watch(ctx, "resume-me", false, nil)
	if res.err != nil || res.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("resumed job: %v (%v)", res.finished, res.err)
	}
	if p := res.finished.Progress; p.GroupsSkipped != 3 || p.GroupsDone != 4 {
		t.Errorf("resumed progress %v: want 3 skipped, 4 done", p)
	}
	after := readRun(t, j.OutputDir)
	if len(after) != 7 {
		t.Fatalf("%d groups after the resume, want 7", len(after))
	}
	for g, rows := range after {
		if len(rows) != 2 {
			t.Errorf("group %s: %d rows", g, len(rows))
		}
		if w := compactGroups[g]; w != nil {
			for _, r := range w.Rollouts {
				rec := rows[r.Index]
				if !slices.Equal(r.Tokens, rec.Tokens) || len(r.LossMask) != len(rec.LossMask) || !slices.Equal(r.Logprobs, rec.Logprobs) {
					t.Errorf("group %s rollout %d: the expanded compact layout differs from the Parquet row", g, r.Index)
				}
				for k, m := range rec.LossMask {
					if r.LossMask[k] != int32(m) {
						t.Errorf("group %s rollout %d: loss_mask[%d] %d, Parquet %d", g, r.Index, k, r.LossMask[k], m)
						break
					}
				}
			}
		}
		for _, r := range rows {
			if r.Status != trajectory.StatusOK {
				t.Errorf("group %s rollout %d: %s %+v", g, r.RolloutIndex, r.Status, r.Failure)
			}
		}
	}

	// An ended job keeps its state and counters across a further restart.
	if err := h2.stop(); err != nil {
		t.Fatal(err)
	}
	h3 := startServer(t, Options{StateDir: state, DataDir: data}, RunOptions{})
	got, err = h3.cli.GetJob(bg(t), &rolloutv1.GetJobRequest{JobId: "resume-me"})
	if err != nil {
		t.Fatal(err)
	}
	if p := got.Job.Progress; got.Job.State != rolloutv1.JobState_JOB_STATE_SUCCEEDED || p.GroupsDone != 4 || p.GroupsSkipped != 3 || got.Job.FinishedAt == nil {
		t.Errorf("ended job after another restart: %v", got.Job)
	}
}

// An env with turn feedback (guess-number, no sandbox): the stream carries
// each rollout's turn rewards as the Parquet records hold them, in the
// compact layout too.
func TestStreamCarriesTurnRewards(t *testing.T) {
	s := newSim(t, "guess-number", -1)
	h := startServer(t, Options{}, RunOptions{})
	ctx := bg(t)
	cfg := strings.Replace(jobYAML(s.URL, "runs/guess", 2, 2), "env: toolcall-match", "env: guess-number", 1)
	j := h.start(t, startReq(cfg, "guess-1"))
	if res := h.watch(ctx, j.Id, false, nil); res.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("job: %v %v", res.finished, res.err)
	}
	recs := readRun(t, j.OutputDir)
	from := int64(0)
	stream, err := h.cli.WatchJob(ctx, &rolloutv1.WatchJobRequest{JobId: j.Id, IncludeGroups: true, FromSequence: &from,
		TokenLayout: rolloutv1.TokenLayout_TOKEN_LAYOUT_COMPACT})
	if err != nil {
		t.Fatal(err)
	}
	rewarded, seen := 0, 0
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		g := ev.GetGroup()
		if g == nil {
			continue
		}
		for _, ro := range g.Rollouts {
			var rec *trajectory.Record
			for i := range recs[g.GroupId] {
				if recs[g.GroupId][i].RolloutIndex == ro.Index {
					rec = &recs[g.GroupId][i]
				}
			}
			if rec == nil {
				t.Fatalf("group %s rollout %d: no record", g.GroupId, ro.Index)
			}
			if !slices.Equal(ro.TurnRewards, rec.TurnRewards) || len(ro.TurnRewards) != int(ro.Turns) {
				t.Fatalf("group %s rollout %d: turn_rewards %v, record %v, %d turns", g.GroupId, ro.Index, ro.TurnRewards, rec.TurnRewards, ro.Turns)
			}
			seen++
			if slices.ContainsFunc(ro.TurnRewards, func(r float64) bool { return r != 0 }) {
				rewarded++
			}
		}
	}
	if seen != 4 || rewarded == 0 {
		t.Fatalf("%d rollouts streamed (want 4), %d with a nonzero turn reward", seen, rewarded)
	}
}
