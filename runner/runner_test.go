package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// scriptPolicy answers every turn with the item's text as the final
// answer; fail(n) makes the n-th generation overall fail with ErrInfra.
type scriptPolicy struct {
	calls atomic.Int64
	fail  func(prompt string) error
	delay time.Duration
	// delayFor, when set, overrides delay per prompt.
	delayFor func(prompt string) time.Duration
}

func (p *scriptPolicy) Start(context.Context, inference.EpisodeSpec) (inference.Episode, error) {
	return &scriptEpisode{p: p}, nil
}

type scriptEpisode struct{ p *scriptPolicy }

func (e *scriptEpisode) Generate(ctx context.Context, msgs []openai.ChatCompletionMessage) (inference.Turn, error) {
	e.p.calls.Add(1)
	last := msgs[len(msgs)-1].Content
	delay := e.p.delay
	if e.p.delayFor != nil {
		delay = e.p.delayFor(last)
	}
	if delay > 0 {
		select {
		case <-ctx.Done():
			return inference.Turn{}, fmt.Errorf("generate: %w: %w", inference.ErrInfra, ctx.Err())
		case <-time.After(delay):
		}
	}
	if e.p.fail != nil {
		if err := e.p.fail(last); err != nil {
			return inference.Turn{}, err
		}
	}
	return inference.Turn{Parsed: true, Content: "answer " + last, Text: "answer " + last, FinishReason: "stop"}, nil
}

func (e *scriptEpisode) Finish(context.Context, []openai.ChatCompletionMessage) (inference.Sequence, error) {
	return inference.Sequence{}, nil
}

// scoreEnv scores a rollout by the number in its final answer plus the
// rollout index parity, so groups have variance.
type scoreEnv struct {
	items  []datasets.Item
	reward func(out envs.Outcome) (rewards.Score, error)
}

func (e *scoreEnv) Name() string            { return "unit" }
func (e *scoreEnv) Defaults() envs.Defaults { return envs.Defaults{GroupSize: 4, MaxTurns: 3} }
func (e *scoreEnv) Items(context.Context, string) ([]datasets.Item, error) {
	return e.items, nil
}
func (e *scoreEnv) Task(_ context.Context, it datasets.Item) (envs.Task, error) {
	q, err := it.String("q")
	if err != nil {
		return envs.Task{}, err
	}
	return envs.Task{Messages: []openai.ChatCompletionMessage{{Role: "user", Content: q}}}, nil
}
func (e *scoreEnv) Reward(_ context.Context, _ datasets.Item, out envs.Outcome, _ envs.Sandbox) (rewards.Score, error) {
	return e.reward(out)
}

func items(n int) []datasets.Item {
	out := make([]datasets.Item, n)
	for i := range out {
		out[i] = datasets.Item{ID: fmt.Sprintf("item-%d", i), Data: map[string]any{"q": fmt.Sprintf("q%d", i)}}
	}
	return out
}

type memSink struct {
	mu     sync.Mutex
	groups []*Group
	done   map[string]bool
	err    error
	block  chan struct{}
}

func (s *memSink) WriteGroup(_ context.Context, _ *RunInfo, g *Group) error {
	if s.block != nil {
		<-s.block
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.groups = append(s.groups, g)
	return nil
}

func (s *memSink) CompletedGroups(context.Context) (map[string]bool, error) { return s.done, nil }

func baseConfig() Config {
	return Config{Env: "unit", Inference: inference.Config{Endpoints: []string{"http://127.0.0.1:1"}}, Retries: 2}
}

func TestGroupsAdvantagesAndResume(t *testing.T) {
	var seq atomic.Int64
	env := &scoreEnv{items: items(5), reward: func(envs.Outcome) (rewards.Score, error) {
		return rewards.Score{Value: float64(seq.Add(1) % 2)}, nil
	}}
	sink := &memSink{done: map[string]bool{"item-1": true}}
	r, err := New(baseConfig(), Deps{Logger: quiet, Env: env, Policy: &scriptPolicy{}, Sinks: []Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Groups != 4 || sum.GroupsSkipped != 1 || sum.Rollouts != 16 || sum.RolloutsOK != 16 || sum.InfraFailed != 0 {
		t.Fatalf("summary %+v", sum)
	}
	for _, g := range sink.groups {
		if g.ID == "item-1" {
			t.Error("a completed group ran again")
		}
		var advSum float64
		for _, ro := range g.Rollouts {
			if ro.Advantage == nil {
				t.Fatalf("group %s rollout %d: no advantage", g.ID, ro.Index)
			}
			advSum += *ro.Advantage
			if !strings.HasPrefix(ro.Result.Messages[len(ro.Result.Messages)-1].Content, "answer q") {
				t.Errorf("unexpected transcript %v", ro.Result.Messages)
			}
		}
		if advSum > 1e-6 || advSum < -1e-6 {
			t.Errorf("group %s: advantages sum to %v, want 0", g.ID, advSum)
		}
	}
}

func TestRetriesAndFailureTaxonomy(t *testing.T) {
	env := &scoreEnv{items: items(3), reward: func(out envs.Outcome) (rewards.Score, error) {
		if strings.Contains(out.Final, "q2") {
			return rewards.Score{}, fmt.Errorf("%w: judge down", rewards.ErrReward)
		}
		return rewards.Score{Value: 1}, nil
	}}
	// The first five generations for item-0 fail: its rollouts need
	// retries and still succeed (4 rollouts x 3 attempts > 5).
	var q0 atomic.Int64
	pol := &scriptPolicy{fail: func(prompt string) error {
		if prompt == "q0" && q0.Add(1) <= 5 {
			return fmt.Errorf("endpoint x: %w", inference.ErrInfra)
		}
		return nil
	}}
	sink := &memSink{}
	cfg := baseConfig()
	cfg.Advantage.DropEqual = true
	r, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: pol, Sinks: []Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Rollouts != 12 || sum.Retries == 0 {
		t.Fatalf("summary %+v: want 12 rollouts and some retries", sum)
	}
	for _, g := range sink.groups {
		for _, ro := range g.Rollouts {
			switch {
			case g.ID == "item-2":
				if ro.Status != StatusInfraFailed || ro.Failure.Kind != FailReward || ro.Advantage != nil {
					t.Errorf("reward failure recorded as %+v", ro)
				}
				if ro.Attempts != 3 {
					t.Errorf("reward failure attempts = %d, want 3 (1 + 2 retries)", ro.Attempts)
				}
			case ro.Status != StatusOK:
				t.Errorf("group %s rollout %d failed after retries: %+v", g.ID, ro.Index, ro.Failure)
			}
		}
		if g.ID != "item-2" && !g.Dropped {
			t.Errorf("group %s: all scores equal, want dropped", g.ID)
		}
		if g.ID == "item-2" && (g.OK != 0 || g.Dropped) {
			t.Errorf("failed group: ok=%d dropped=%v", g.OK, g.Dropped)
		}
	}
	if sum.FailuresByKind[FailReward] != 4 || sum.GroupsDropped != 2 {
		t.Errorf("summary %+v", sum)
	}
}

func TestBadItemAndPanicAreRecorded(t *testing.T) {
	its := items(2)
	delete(its[1].Data, "q")
	env := &scoreEnv{items: its, reward: func(envs.Outcome) (rewards.Score, error) { panic("boom") }}
	sink := &memSink{}
	r, err := New(baseConfig(), Deps{Logger: quiet, Env: env, Policy: &scriptPolicy{}, Sinks: []Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.FailuresByKind[FailTask] != 4 || sum.FailuresByKind[FailPanic] != 4 || sum.Retries != 0 {
		t.Errorf("summary %+v", sum)
	}
}

func TestSinkErrorStopsIntakeAndCancellationKeepsWork(t *testing.T) {
	env := &scoreEnv{items: items(20), reward: func(envs.Outcome) (rewards.Score, error) { return rewards.Score{Value: 1}, nil }}
	cfg := baseConfig()
	cfg.Limits.GroupsInFlight = 1
	sink := &memSink{err: errors.New("disk full")}
	r, _ := New(cfg, Deps{Logger: quiet, Env: env, Policy: &scriptPolicy{}, Sinks: []Sink{sink}})
	sum, err := r.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("err = %v", err)
	}
	if sum.Groups != 0 {
		t.Errorf("groups counted after a sink failure: %d", sum.Groups)
	}

	// Cancel mid-run: in-flight groups still reach the sink, flagged.
	ctx, cancel := context.WithCancel(context.Background())
	sink2 := &memSink{}
	pol := &scriptPolicy{delay: 50 * time.Millisecond}
	r2, _ := New(cfg, Deps{Logger: quiet, Env: env, Policy: pol, Sinks: []Sink{sink2}, Progress: func(e Event) {
		if e.Group != nil {
			cancel()
		}
	}})
	_, err = r2.Run(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if len(sink2.groups) == 0 || len(sink2.groups) >= 20 {
		t.Fatalf("%d groups written", len(sink2.groups))
	}
	for _, g := range sink2.groups[1:] {
		for _, ro := range g.Rollouts {
			if ro.Status == StatusOK && ro.Result.StopReason == "cancelled" {
				t.Errorf("a cancelled rollout was recorded as ok")
			}
		}
	}
}

// Cancelling mid-run (Ctrl-C) never writes a group cut short: a resumed
// run then collects exactly the missing groups, whole — no gaps, no
// duplicates.
func TestCancelledGroupsAreCollectedAgainOnResume(t *testing.T) {
	env := &scoreEnv{items: items(12), reward: func(envs.Outcome) (rewards.Score, error) { return rewards.Score{Value: 1}, nil }}
	cfg := baseConfig()
	cfg.Limits.GroupsInFlight = 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := &memSink{}
	var written atomic.Int64
	// q0 and q1 finish at once; every other item outlives the test unless
	// cancelled, so the cancellation always cuts groups short.
	slow := &scriptPolicy{delayFor: func(prompt string) time.Duration {
		if prompt == "q0" || prompt == "q1" {
			return time.Millisecond
		}
		return time.Hour
	}}
	r, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: slow, Sinks: []Sink{first},
		Progress: func(e Event) {
			if e.Group != nil && written.Add(1) == 2 {
				cancel()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := r.Run(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	done := map[string]bool{}
	for _, g := range first.groups {
		for _, ro := range g.Rollouts {
			if ro.Failure != nil && ro.Failure.Kind == FailCancelled {
				t.Fatalf("group %s was written with a cancelled rollout", g.ID)
			}
		}
		done[g.Item.Key()] = true
	}
	if len(done) == 0 || len(done) == 12 {
		t.Fatalf("%d groups written before the cancellation took effect", len(done))
	}
	if sum.GroupsInterrupted == 0 {
		t.Errorf("no group reported as interrupted: %+v", sum)
	}

	second := &memSink{done: done}
	r2, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: &scriptPolicy{}, Sinks: []Sink{second}})
	if err != nil {
		t.Fatal(err)
	}
	sum2, err := r2.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum2.GroupsSkipped != len(done) || sum2.Groups != 12-len(done) {
		t.Fatalf("resume summary %+v after %d done", sum2, len(done))
	}
	for _, g := range second.groups {
		if done[g.Item.Key()] {
			t.Errorf("group %s collected twice", g.ID)
		}
		done[g.Item.Key()] = true
		if len(g.Rollouts) != 4 {
			t.Errorf("group %s has %d rollouts", g.ID, len(g.Rollouts))
		}
	}
	if len(done) != 12 {
		t.Errorf("%d of 12 groups collected in all", len(done))
	}
}

func TestConfigStrict(t *testing.T) {
	_, err := ParseConfig([]byte("env: x\ninference:\n  endpoints: [http://a]\ngroupz: 3\n"))
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "line 4: field groupz not found") {
		t.Errorf("err = %v", err)
	}
	_, err = ParseConfig([]byte("env: x\nrollout_timeout: soon\n"))
	if err == nil || !strings.Contains(err.Error(), `"soon" is not a duration`) {
		t.Errorf("err = %v", err)
	}
	cfg, err := ParseConfig([]byte("env: terminal-tasks\nenv_config:\n  max_turns: 3\ninference:\n  endpoints: [http://127.0.0.1:8000]\nrollout_timeout: 90s\n"))
	if err != nil || time.Duration(cfg.RolloutTimeout) != 90*time.Second || cfg.EnvConfig.Kind == 0 {
		t.Fatalf("cfg %+v err %v", cfg, err)
	}
	for _, tc := range []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.Env = "" }, "env: required"},
		{func(c *Config) { c.Inference.Endpoints = nil }, "inference.endpoints"},
		{func(c *Config) { c.Inference.Endpoints = []string{"localhost:8000"} }, "not an http(s) URL"},
		{func(c *Config) { c.Advantage.Mode = "ppo" }, "advantage.mode"},
		{func(c *Config) { c.Groups = -1 }, "groups: must not be negative"},
	} {
		c := cfg
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
}

// retries: -1 turns retries off (0 means the default).
func TestNoRetries(t *testing.T) {
	env := &scoreEnv{items: items(2), reward: func(envs.Outcome) (rewards.Score, error) { return rewards.Score{Value: 1}, nil }}
	cfg := baseConfig()
	cfg.Retries = -1
	pol := &scriptPolicy{fail: func(string) error { return fmt.Errorf("down: %w", inference.ErrInfra) }}
	r, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: pol, Sinks: []Sink{&memSink{}}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Retries != 0 || sum.InfraFailed != sum.Rollouts || sum.Rollouts == 0 {
		t.Fatalf("summary %+v", sum)
	}
	cfg.Retries = -2
	if _, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: pol}); err == nil || !strings.Contains(err.Error(), "retries") {
		t.Fatalf("retries -2: %v", err)
	}
}

type countingImages struct{ n atomic.Int64 }

func (c *countingImages) BuildTask(context.Context, envs.ImageBuild) (string, error) {
	c.n.Add(1)
	return "task-image", nil
}

type refusingSandboxes struct {
	images   chan string
	expected atomic.Int64 // sandboxes announced through Expect
}

func (s *refusingSandboxes) Expect(spec sandbox.Spec, n int) error {
	if spec.Image == "task-image" {
		s.expected.Add(int64(n))
	}
	return nil
}

func (s *refusingSandboxes) Create(_ context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	s.images <- spec.Image
	return nil, fmt.Errorf("create: %w", sandbox.ErrUnavailable)
}

// buildEnv's tasks need a task image and a sandbox.
type buildEnv struct{ scoreEnv }

func (e *buildEnv) Task(ctx context.Context, it datasets.Item) (envs.Task, error) {
	t, err := e.scoreEnv.Task(ctx, it)
	t.Sandbox = &sandbox.Spec{}
	t.Build = &envs.ImageBuild{Dir: "/nonexistent"}
	return t, err
}

// A group builds its task image once, however many rollouts and retries
// it has (the build hashes the whole context), and every sandbox gets it;
// each group announces its G sandboxes to a pooling backend first.
func TestTaskImageBuiltOncePerGroup(t *testing.T) {
	env := &buildEnv{scoreEnv{items: items(2), reward: func(envs.Outcome) (rewards.Score, error) { return rewards.Score{Value: 1}, nil }}}
	imgs := &countingImages{}
	boxes := &refusingSandboxes{images: make(chan string, 64)}
	cfg := baseConfig()
	cfg.Retries = 1
	r, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: &scriptPolicy{}, Images: imgs, Sandboxes: boxes, Sinks: []Sink{&memSink{}}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Rollouts != 8 || sum.Retries != 8 || sum.FailuresByKind[FailSandbox] != 8 {
		t.Fatalf("summary %+v", sum)
	}
	if n := imgs.n.Load(); n != 2 {
		t.Errorf("task image built %d times for 2 groups", n)
	}
	if n := boxes.expected.Load(); n != 8 {
		t.Errorf("%d sandboxes announced to the warm pool for 2 groups of 4", n)
	}
	close(boxes.images)
	for img := range boxes.images {
		if img != "task-image" {
			t.Fatalf("sandbox created from %q", img)
		}
	}
}

// aheadSandboxes records Expect and refuses Create; every create waits
// until a second group was announced, or gives up after 10 s and records
// that it had to.
type aheadSandboxes struct {
	mu       sync.Mutex
	expected int
	announce chan struct{} // closed once more than one group was announced
	gaveUp   atomic.Bool   // a create waited in vain for the next group
}

func (s *aheadSandboxes) Expect(spec sandbox.Spec, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if spec.Image != "task-image" {
		return nil
	}
	s.expected += n
	if s.expected > n && s.announce != nil {
		close(s.announce)
		s.announce = nil
	}
	return nil
}

func (s *aheadSandboxes) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	s.mu.Lock()
	ch := s.announce
	s.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			s.gaveUp.Store(true)
		case <-ctx.Done():
		}
	}
	return nil, fmt.Errorf("create: %w", sandbox.ErrUnavailable)
}

// With every group slot busy, Run prepares the next group and announces its
// sandboxes while the running group still creates its own (the warm pool
// starts them ahead of demand); each group is announced and builds its
// image once.
func TestSandboxesAnnouncedAhead(t *testing.T) {
	env := &buildEnv{scoreEnv{items: items(3), reward: func(envs.Outcome) (rewards.Score, error) { return rewards.Score{Value: 1}, nil }}}
	imgs := &countingImages{}
	boxes := &aheadSandboxes{announce: make(chan struct{})}
	cfg := baseConfig()
	cfg.Retries = 0
	cfg.Limits.GroupsInFlight = 1
	r, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: &scriptPolicy{}, Images: imgs, Sandboxes: boxes, Sinks: []Sink{&memSink{}}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Rollouts != 12 || sum.FailuresByKind[FailSandbox] != 12 {
		t.Fatalf("summary %+v", sum)
	}
	if boxes.gaveUp.Load() {
		t.Error("the next group was not announced while the first group created its sandboxes")
	}
	if boxes.expected != 12 {
		t.Errorf("%d sandboxes announced for 3 groups of 4", boxes.expected)
	}
	if n := imgs.n.Load(); n != 3 {
		t.Errorf("task image built %d times for 3 groups", n)
	}
}

// pidsEnv's tasks ask for a pids limit in their own sandbox spec.
type pidsEnv struct{ scoreEnv }

func (e *pidsEnv) Task(ctx context.Context, it datasets.Item) (envs.Task, error) {
	t, err := e.scoreEnv.Task(ctx, it)
	t.Sandbox = &sandbox.Spec{Image: "img", Limits: sandbox.Limits{PIDs: 128}}
	return t, err
}

// An env's own pids limit on the kubernetes backend, which no pod can be
// held to, fails its rollouts as task errors naming the key, without a
// sandbox and without retries; on another backend the same spec is
// created.
func TestEnvPIDsRefusedOnKubernetes(t *testing.T) {
	for _, backend := range []string{sandbox.BackendKubernetes, sandbox.BackendDocker} {
		env := &pidsEnv{scoreEnv{items: items(1), reward: func(envs.Outcome) (rewards.Score, error) { return rewards.Score{Value: 1}, nil }}}
		boxes := &refusingSandboxes{images: make(chan string, 64)}
		cfg := baseConfig()
		cfg.Retries = 1
		cfg.Sandbox.Backend = backend
		r, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: &scriptPolicy{}, Sandboxes: boxes, Sinks: []Sink{&memSink{}}})
		if err != nil {
			t.Fatal(err)
		}
		sum, err := r.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		close(boxes.images)
		created := len(boxes.images)
		if backend == sandbox.BackendKubernetes {
			if sum.FailuresByKind[FailTask] != 4 || sum.Retries != 0 || created != 0 {
				t.Errorf("%s: summary %+v, %d sandboxes created: want 4 task failures, no retry, no sandbox", backend, sum, created)
			}
			continue
		}
		if sum.FailuresByKind[FailTask] != 0 || created == 0 {
			t.Errorf("%s: summary %+v, %d sandboxes created: want the spec created", backend, sum, created)
		}
	}
}
