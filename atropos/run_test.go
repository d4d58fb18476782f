package atropos

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/testkit/atropostest"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

func runConfig(t *testing.T, a runner.Atropos) runner.Config {
	return runner.Config{Env: "toolcall-match", Inference: inference.Config{Endpoints: []string{"http://127.0.0.1:1"}},
		Output: runner.Output{Dir: t.TempDir()}, Atropos: a}
}

// OpenRun opens a bridge only for run jobs that ask for one, and refuses
// bad settings as run config errors.
func TestOpenRunChoices(t *testing.T) {
	ctx := context.Background()
	const url = "http://127.0.0.1:1"
	for _, tc := range []struct {
		name  string
		cfg   runner.Atropos
		setup RunSetup
	}{
		{"no url", runner.Atropos{}, RunSetup{Mode: assemble.ModeRun}},
		{"disabled", runner.Atropos{URL: url, Disabled: true}, RunSetup{Mode: assemble.ModeRun}},
		{"disabled default", runner.Atropos{Disabled: true}, RunSetup{Mode: assemble.ModeRun, DefaultURL: url}},
		{"eval", runner.Atropos{URL: url}, RunSetup{Mode: assemble.ModeEval, DefaultURL: url}},
		{"collect", runner.Atropos{}, RunSetup{Mode: assemble.ModeCollect, DefaultURL: url}},
	} {
		b, err := OpenRun(ctx, runConfig(t, tc.cfg), tc.setup)
		if b != nil || err != nil {
			t.Errorf("%s: bridge %v, error %v; want none", tc.name, b, err)
		}
	}
	bad := []struct {
		name string
		cfg  func(*runner.Config)
		want string
	}{
		{"no output dir", func(c *runner.Config) { c.Output.Dir = "" }, "output.dir"},
		{"bad url", func(c *runner.Config) { c.Atropos.URL = "localhost:8000" }, "http(s)://"},
		{"bad env", func(c *runner.Config) { c.Env = "no-such-env" }, "env"},
		{"negative off-policy", func(c *runner.Config) { c.Atropos.MaxBatchesOffPolicy = -1 }, "atropos.max_batches_off_policy"},
		{"invalid run config", func(c *runner.Config) { c.Inference.Endpoints = nil }, "inference.endpoints"},
		{"chat mode", func(c *runner.Config) { c.Inference.Backend = inference.BackendChat }, "token ids"},
	}
	for _, tc := range bad {
		cfg := runConfig(t, runner.Atropos{URL: url})
		tc.cfg(&cfg)
		b, err := OpenRun(ctx, cfg, RunSetup{Mode: assemble.ModeRun})
		if b != nil || !errors.Is(err, runner.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: bridge %v, error %v; want a run config error naming %q", tc.name, b, err, tc.want)
		}
	}
	if err := CheckURL("http://h:1"); err != nil {
		t.Errorf("CheckURL: %v", err)
	}
	if err := CheckURL("h:1"); !errors.Is(err, ErrConfig) {
		t.Errorf("CheckURL(h:1): %v", err)
	}
}

// A run whose bridge stops intake at the trainer's step budget succeeds;
// the bridge registers with the run's G, the env's name and the config's
// settings, and spools in the run directory.
func TestRunBridgeStepBudget(t *testing.T) {
	api := atropostest.New(t)
	api.StartTrainer(t, 2*testG, 4096, 1000)
	cfg := runConfig(t, runner.Atropos{AtroposKnobs: runner.AtroposKnobs{TotalSteps: 1, Weight: 2, MaxTokenLength: 512}})
	cfg.GroupSize = testG
	b, err := OpenRun(context.Background(), cfg, RunSetup{Mode: assemble.ModeRun, DefaultURL: api.URL(), Logger: testLogger()})
	if err != nil || b == nil {
		t.Fatalf("OpenRun: %v, %v", b, err)
	}
	if got := b.Bridge().opts.SpoolDir; got != filepath.Join(cfg.Output.Dir, SpoolSubdir) {
		t.Errorf("spool %s", got)
	}
	its := make([]datasets.Item, 20)
	for i := range its {
		its[i] = datasets.Item{ID: fmt.Sprintf("q%d", i)}
	}
	rcfg := runner.Config{Env: "count", GroupSize: testG, Inference: inference.Config{Endpoints: []string{"http://127.0.0.1:1"}}}
	rcfg.Limits.GroupsInFlight = 1
	r, err := runner.New(rcfg, runner.Deps{Env: &countEnv{items: its}, Policy: &tokenPolicy{}, Sinks: []runner.Sink{b}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	sum, runErr := r.Run(context.Background())
	if !errors.Is(runErr, runner.ErrIntakeStopped) || sum.Groups >= len(its) {
		t.Fatalf("run: %v after %d groups; want an intake stop", runErr, sum.Groups)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Finish(ctx, runErr); err != nil {
		t.Fatalf("Finish of a run the trainer stopped: %v; want success", err)
	}
	got, _ := api.Snapshot()
	if len(got) != sum.Groups {
		t.Errorf("the API received %d groups, the run wrote %d", len(got), sum.Groups)
	}
	api.Mu.Lock()
	defer api.Mu.Unlock()
	if e := api.Envs; len(e) != 1 || e[0].Name != "toolcall-match" || e[0].GroupSize != testG || e[0].Weight != 2 || e[0].MaxLen != 512 {
		t.Errorf("registration %+v", e)
	}
}

// Finish passes other errors through and adds a bridge failure the run did
// not see.
func TestRunBridgeFinishErrors(t *testing.T) {
	api := atropostest.New(t)
	api.StartTrainer(t, 64, 4096, 1000)
	cfg := runConfig(t, runner.Atropos{})
	cfg.GroupSize = testG
	b, err := OpenRun(context.Background(), cfg, RunSetup{Mode: assemble.ModeRun, DefaultURL: api.URL(), Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	admit(t, b.Bridge())
	api.FailNext("/scored_data", 422)
	write(t, b.Bridge(), testGroup(0)) // refused after WriteGroup returned
	eventually(t, "the refusal", func() bool { return b.Bridge().Err() != nil })
	runErr := errors.New("some run failure")
	err = b.Finish(context.Background(), runErr)
	if !errors.Is(err, runErr) || !errors.Is(err, ErrRejected) {
		t.Fatalf("Finish: %v; want the run's error and the refusal", err)
	}
	// An intake stop the bridge did not ask for stays an error.
	b2, err := OpenRun(context.Background(), runConfig(t, runner.Atropos{URL: api.URL()}), RunSetup{Mode: assemble.ModeRun, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.Finish(context.Background(), runner.ErrIntakeStopped); err != runner.ErrIntakeStopped {
		t.Fatalf("Finish: %v; want the intake stop unchanged", err)
	}
}

// A crash between the run directory and the spool: groups durable in the
// run directory that the bridge never saw are spooled by the next OpenRun
// and delivered once; groups it delivered or skipped are not sent again.
func TestRunBridgeReconcilesRunDirectory(t *testing.T) {
	api := atropostest.New(t)
	api.StartTrainer(t, 64, 4096, 1000)
	cfg := runConfig(t, runner.Atropos{})
	cfg.GroupSize = testG
	ctx := context.Background()
	writeRun := func(ks ...int) {
		w, err := trajectory.NewWriter(ctx, cfg.Output.Dir, trajectory.WriterOptions{RunID: testRun.RunID, Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ks {
			g := testGroup(k)
			recs := make([]trajectory.Record, len(g.Rollouts))
			for i := range g.Rollouts {
				if recs[i], err = assemble.Record(testRun, g, &g.Rollouts[i]); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.WriteGroup(ctx, recs); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Group 0 was written before the bridge existed: never the bridge's.
	writeRun(0)
	open := func() *RunBridge {
		b, err := OpenRun(ctx, cfg, RunSetup{Mode: assemble.ModeRun, DefaultURL: api.URL(), Logger: testLogger()})
		if err != nil || b == nil {
			t.Fatalf("OpenRun: %v, %v", b, err)
		}
		return b
	}
	finish := func(b *RunBridge) {
		fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := b.Finish(fctx, nil); err != nil {
			t.Fatalf("Finish: %v", err)
		}
	}
	// Run 1: group 1 goes through the bridge; groups 2 and 3 are durable in
	// the run directory when the process dies, before the bridge saw them.
	b := open()
	admit(t, b.Bridge())
	writeRun(1)
	write(t, b.Bridge(), testGroup(1))
	finish(b)
	writeRun(2, 3)
	// Run 2 (the resume) hands them over; run 3 finds nothing to do.
	finish(open())
	finish(open())
	got, _ := api.Snapshot()
	sent := map[string]int{}
	for _, g := range got {
		sent[fmt.Sprint(g)]++
	}
	if len(got) != 3 {
		t.Fatalf("the API received %d groups, want 3 (groups 1, 2 and 3 once each)", len(got))
	}
	for k, n := range sent {
		if n != 1 {
			t.Errorf("group %s received %d times", k, n)
		}
	}
}
