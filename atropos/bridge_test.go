package atropos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/testkit/atropostest"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/runner"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testLogger discards logs unless ATROPOS_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("ATROPOS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

const testG = 4

var testRun = &runner.RunInfo{RunID: "run_test", Env: "unit", Model: "m", SamplingJSON: `{"temperature":0.7}`}

// testGroup builds group k: every rollout has a 3-token prompt and a
// 2-token completion whose ids encode (k, rollout), reward = rollout index.
func testGroup(k int) *runner.Group {
	g := &runner.Group{ID: fmt.Sprintf("item-%d", k), Item: datasets.Item{ID: fmt.Sprintf("item-%d", k)}, Rollouts: make([]runner.Rollout, testG)}
	for i := range g.Rollouts {
		adv := float64(i) - 1.5
		g.Rollouts[i] = runner.Rollout{
			ID: fmt.Sprintf("ro-%d-%d", k, i), Index: i, Attempts: 1, Status: runner.StatusOK,
			Score: rewards.Score{Value: float64(i)}, Advantage: &adv, Created: time.Unix(1700000000, 0),
			Result: agentloop.Result{
				Messages: []openai.ChatCompletionMessage{
					{Role: "user", Content: fmt.Sprintf("question %d <b>", k)},
					{Role: "assistant", Content: fmt.Sprintf("answer %d.%d", k, i)},
				},
				Sequence: inference.Sequence{
					Tokens:   []int32{1, int32(100 + k), 7, int32(1000*k + 10*i + 1), int32(1000*k + 10*i + 2)},
					Mask:     []int8{0, 0, 0, 1, 1},
					Logprobs: []float32{1, 1, 1, -0.5, -0.25},
				},
				FinishedNaturally: true, StopReason: agentloop.StopReason("finished"), TurnsUsed: 1,
			},
		}
		g.Rollouts[i].Result.Sequence.PromptLen = 3
	}
	g.OK, g.Mean = testG, 1.5
	return g
}

// checkGroup asserts that got is testGroup(k) as Atropos expects it.
func checkGroup(t *testing.T, got atropostest.ScoredData, k, envID int) {
	t.Helper()
	if got.EnvID == nil || *got.EnvID != envID {
		t.Errorf("group %d: env_id %s, want %d", k, ptrString(got.EnvID), envID)
	}
	if len(got.Tokens) != testG {
		t.Fatalf("group %d: %d sequences, want %d", k, len(got.Tokens), testG)
	}
	for i := range testG {
		a, b := 1000*k+10*i+1, 1000*k+10*i+2
		want := fmt.Sprint([]int{1, 100 + k, 7, a, b})
		if fmt.Sprint(got.Tokens[i]) != want {
			t.Errorf("group %d seq %d: tokens %v, want %s", k, i, got.Tokens[i], want)
		}
		if w := fmt.Sprint([]int{-100, -100, -100, a, b}); fmt.Sprint(got.Masks[i]) != w {
			t.Errorf("group %d seq %d: masks %v, want %s", k, i, got.Masks[i], w)
		}
		if got.InferenceLogprobs == nil || fmt.Sprint(got.InferenceLogprobs[i]) != "[1 1 1 -0.5 -0.25]" {
			t.Errorf("group %d seq %d: inference_logprobs %v", k, i, got.InferenceLogprobs)
		}
		if got.Scores[i] != float64(i) {
			t.Errorf("group %d seq %d: score %v, want %d", k, i, got.Scores[i], i)
		}
		if len(got.Messages) != testG || len(got.Messages[i]) != 2 || got.Messages[i][1]["role"] != "assistant" ||
			got.Messages[i][1]["content"] != fmt.Sprintf("answer %d.%d", k, i) || got.Messages[i][0]["content"] != fmt.Sprintf("question %d <b>", k) {
			t.Errorf("group %d seq %d: messages %v", k, i, got.Messages)
		}
	}
	if got.GenerationParams["temperature"] != 0.7 {
		t.Errorf("group %d: generation_params %v", k, got.GenerationParams)
	}
	if got.GroupOverrides != nil {
		t.Errorf("group %d: group_overrides %v on a full group", k, got.GroupOverrides)
	}
}

// groupIndex recovers k from a received group's first completion token.
func groupIndex(g atropostest.ScoredData) int { return g.Tokens[0][3] / 1000 }

func newBridge(t *testing.T, api *atropostest.API, mod func(*Options)) *Bridge {
	t.Helper()
	opts := Options{
		URL: api.URL(), SpoolDir: t.TempDir(), GroupSize: testG, AtroposKnobs: runner.AtroposKnobs{Name: "rollout-test"},
		PollInterval: 10 * time.Millisecond, RegisterInterval: 10 * time.Millisecond,
		RetryMin: 2 * time.Millisecond, RetryMax: 40 * time.Millisecond, RequestTimeout: 10 * time.Second,
		Logger: testLogger(),
	}
	if mod != nil {
		mod(&opts)
	}
	b, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_ = b.Close(ctx)
	})
	return b
}

// startTrainer registers a trainer and makes its first GET /batch, which
// opens the gate for envs.
func startTrainer(t *testing.T, api *atropostest.API, batchSize int) {
	t.Helper()
	api.TrainerRegister(t, batchSize, 4096, 1000)
	api.TrainerBatch(t)
}

// eventually waits for cond (it never asserts on elapsed time: the
// deadline only turns a hang into a failure).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func admit(t *testing.T, b *Bridge) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Admit(ctx); err != nil {
		t.Fatalf("admit: %v", err)
	}
}

func write(t *testing.T, b *Bridge, g *runner.Group) {
	t.Helper()
	if err := b.WriteGroup(context.Background(), testRun, g); err != nil {
		t.Fatalf("write group %s: %v", g.ID, err)
	}
}

func closeBridge(t *testing.T, b *Bridge) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestDeliversGroupsWithAtroposFields(t *testing.T) {
	api := atropostest.New(t)
	startTrainer(t, api, 64)
	b := newBridge(t, api, nil)
	for k := range 5 {
		admit(t, b)
		write(t, b, testGroup(k))
	}
	// All scores equal: skipped, as Atropos' ensure_scores_are_not_same.
	eq := testGroup(99)
	for i := range eq.Rollouts {
		eq.Rollouts[i].Score.Value = 1
	}
	write(t, b, eq)
	eventually(t, "5 groups delivered", func() bool { return b.Stats().Delivered == 5 })
	st := b.Stats()
	if !st.Registered || st.EnvID != 0 || st.Registrations != 1 || st.Skipped != 1 || st.Pending != 0 || st.BatchSize != 64 {
		t.Errorf("stats %+v", st)
	}
	closeBridge(t, b)

	got, reqs := api.Snapshot()
	if len(got) != 5 {
		t.Fatalf("received %d groups, want 5", len(got))
	}
	for k, g := range got {
		if groupIndex(g) != k {
			t.Errorf("group %d arrived at position %d", groupIndex(g), k)
		}
		checkGroup(t, g, groupIndex(g), 0)
	}
	for _, r := range reqs {
		if !r.Gzipped {
			t.Errorf("%s request without Content-Encoding: gzip", r.Path)
		}
	}
	api.Mu.Lock()
	defer api.Mu.Unlock()
	if api.StatusEnvGets == 0 {
		t.Error("the bridge never polled GET /status-env with its JSON body")
	}
	if len(api.Disconnected) != 1 || api.Disconnected[0] != 0 {
		t.Errorf("disconnect-env calls %v, want [0]", api.Disconnected)
	}
	if len(api.Envs) != 1 || api.Envs[0].Name != "rollout-test" || api.Envs[0].GroupSize != testG || api.Envs[0].MaxLen != 2048 {
		t.Errorf("registered envs %+v", api.Envs)
	}
}

// A backlog goes out through /scored_data_list, in order, gzip'd; an API
// without the endpoint gets the groups one by one.
func TestBacklogUsesScoredDataList(t *testing.T) {
	for _, mode := range []string{"list", "no list endpoint", "list refused"} {
		t.Run(mode, func(t *testing.T) {
			api := atropostest.New(t)
			startTrainer(t, api, 64)
			api.FailAll("/scored_data", 503)
			api.FailAll("/scored_data_list", 503)
			b := newBridge(t, api, func(o *Options) { o.ListBatch = 3 })
			for k := range 7 {
				admit(t, b)
				write(t, b, testGroup(k))
			}
			eventually(t, "the backlog", func() bool { return b.Stats().Pending == 7 })
			api.ClearFail("/scored_data_list")
			switch mode {
			case "no list endpoint":
				api.FailAll("/scored_data_list", 404)
			case "list refused":
				// One bad group fails a whole list: the bridge resends
				// that list group by group to find it.
				api.FailNext("/scored_data_list", 422)
			}
			api.ClearFail("/scored_data")
			eventually(t, "7 groups delivered", func() bool { return b.Stats().Delivered == 7 })
			got, reqs := api.Snapshot()
			if len(got) != 7 {
				t.Fatalf("received %d groups", len(got))
			}
			for k, g := range got {
				if groupIndex(g) != k {
					t.Fatalf("order: group %d at position %d", groupIndex(g), k)
				}
				checkGroup(t, g, k, 0)
			}
			lists := 0
			for _, r := range reqs {
				if !r.Gzipped {
					t.Errorf("%s without gzip", r.Path)
				}
				if r.Path == "/scored_data_list" && r.Status == 200 {
					lists++
					if r.Groups > 3 {
						t.Errorf("a list of %d groups, ListBatch is 3", r.Groups)
					}
				}
			}
			if (mode == "no list endpoint") != (lists == 0) {
				t.Errorf("%d lists accepted in mode %q", lists, mode)
			}
			if st := b.Stats(); st.Rejected != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// Register-env retries until the API is up and waits while the trainer
// has not made its first GET /batch; Admit blocks meanwhile.
func TestWaitsForAPIAndTrainer(t *testing.T) {
	api := atropostest.New(t)
	api.Stop()
	b := newBridge(t, api, nil)

	short := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		return b.Admit(ctx)
	}
	if err := short(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("admit with the API down: %v", err)
	}
	eventually(t, "the bridge to notice the API is down", func() bool { return b.Stats().Down })

	api.Start()
	api.TrainerRegister(t, 16, 4096, 1000)
	eventually(t, "register-env attempts on the live API", func() bool {
		api.Mu.Lock()
		defer api.Mu.Unlock()
		return api.RegisterCalls >= 2
	})
	if err := short(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("admit before the trainer started: %v", err)
	}
	if st := b.Stats(); st.Registered || st.Down {
		t.Fatalf("before the trainer started: %+v", st)
	}

	api.TrainerBatch(t) // the trainer starts
	admit(t, b)
	write(t, b, testGroup(0))
	eventually(t, "delivery", func() bool { return b.Stats().Delivered == 1 })
}

// An outage mid-run (connection refused, then 503s) loses no group and
// duplicates none; the runner's groups keep spooling meanwhile.
func TestOutageLosesNothing(t *testing.T) {
	api := atropostest.New(t)
	startTrainer(t, api, 64)
	b := newBridge(t, api, nil)
	k := 0
	next := func() {
		admit(t, b)
		write(t, b, testGroup(k))
		k++
	}
	for range 3 {
		next()
	}
	eventually(t, "first groups", func() bool { return b.Stats().Delivered == 3 })

	api.Stop() // connection refused
	for range 4 {
		next()
	}
	eventually(t, "the outage to be noticed", func() bool { return b.Stats().Down })
	if st := b.Stats(); st.Pending == 0 {
		t.Fatalf("nothing spooled during the outage: %+v", st)
	}

	api.FailAll("/scored_data", 503)
	api.FailAll("/scored_data_list", 503)
	api.Start()
	next()
	eventually(t, "503s", func() bool {
		_, reqs := api.Snapshot()
		n := 0
		for _, r := range reqs {
			if r.Status == 503 {
				n++
			}
		}
		return n >= 3
	})
	api.ClearFail("/scored_data")
	api.ClearFail("/scored_data_list")
	next()
	eventually(t, "every group delivered", func() bool { return b.Stats().Delivered == int64(k) })
	closeBridge(t, b)

	got, _ := api.Snapshot()
	if len(got) != k {
		t.Fatalf("received %d groups, want %d (lost or duplicated)", len(got), k)
	}
	for i, g := range got {
		if groupIndex(g) != i {
			t.Fatalf("position %d holds group %d: order broken", i, groupIndex(g))
		}
		checkGroup(t, g, i, 0)
	}
}

// After an API restart (state lost, another env registered first), the
// bridge re-registers and replays the spooled groups under its new env_id.
func TestReregistersAfterRestart(t *testing.T) {
	api := atropostest.New(t)
	startTrainer(t, api, 64)
	b := newBridge(t, api, nil)
	for k := range 2 {
		admit(t, b)
		write(t, b, testGroup(k))
	}
	eventually(t, "first groups", func() bool { return b.Stats().Delivered == 2 })

	api.Restart(func(f *atropostest.API) {
		f.Envs = []atropostest.Env{{Name: "other", GroupSize: 8, MaxLen: 4096, Weight: 1, Connected: true}}
	})
	eventually(t, "the registration to be dropped", func() bool { return !b.Stats().Registered })
	// Groups written while the env is not registered stay spooled. (A
	// group sent in the instant between a restart and its detection can
	// be accepted under the old env_id: Atropos cannot tell.)
	for k := 2; k < 4; k++ {
		write(t, b, testGroup(k))
	}
	startTrainer(t, api, 64)
	eventually(t, "re-registration", func() bool { st := b.Stats(); return st.Registered && st.Registrations == 2 })
	admit(t, b)
	write(t, b, testGroup(4))
	eventually(t, "delivery after the restart", func() bool { return b.Stats().Delivered == 5 })
	if st := b.Stats(); st.EnvID != 1 {
		t.Fatalf("env_id after restart = %d, want 1 (another env took 0)", st.EnvID)
	}
	got, _ := api.Snapshot()
	if len(got) != 5 {
		t.Fatalf("received %d groups, want 5", len(got))
	}
	for i, g := range got {
		want := 0
		if i >= 2 {
			want = 1
		}
		checkGroup(t, g, i, want)
	}
}

// A stricter API answers 404 for an unknown env_id on /scored_data: the
// bridge re-registers instead of dead-lettering the group. A current_step
// going backwards is a restart too, even when the old env_id answers.
func TestRestartDetection(t *testing.T) {
	t.Run("4xx unknown env", func(t *testing.T) {
		api := atropostest.New(t)
		api.Strict = true
		startTrainer(t, api, 64)
		// Poll only when the sender asks, so the 404 is what tells.
		b := newBridge(t, api, func(o *Options) { o.PollInterval = time.Hour })
		admit(t, b)
		write(t, b, testGroup(0))
		eventually(t, "first group", func() bool { return b.Stats().Delivered == 1 })
		// The restarted API already has its trainer, so nothing but the
		// 404 tells the bridge that its env_id is gone.
		api.Restart(func(f *atropostest.API) {
			f.Trainer, f.Started = &atropostest.Trainer{BatchSize: 64, MaxTokenLen: 4096, NumSteps: 1000}, true
		})
		write(t, b, testGroup(1))
		eventually(t, "delivery after re-registration", func() bool { return b.Stats().Delivered == 2 })
		if st := b.Stats(); st.Registrations != 2 || st.Rejected != 0 {
			t.Fatalf("stats %+v", st)
		}
		got, _ := api.Snapshot()
		if len(got) != 2 {
			t.Fatalf("received %d groups", len(got))
		}
	})
	t.Run("current_step backwards", func(t *testing.T) {
		api := atropostest.New(t)
		startTrainer(t, api, 8)
		b := newBridge(t, api, nil)
		for k := range 2 {
			admit(t, b)
			write(t, b, testGroup(k))
		}
		eventually(t, "first groups", func() bool { return b.Stats().Delivered == 2 })
		if n := api.TrainerBatch(t); n != 2 {
			t.Fatalf("batch of %d groups", n)
		}
		eventually(t, "step 1 seen", func() bool { return b.Stats().CurrentStep == 1 })
		api.Restart(func(f *atropostest.API) {
			f.Trainer, f.Started = &atropostest.Trainer{BatchSize: 8, MaxTokenLen: 4096, NumSteps: 1000}, true
			f.Envs = []atropostest.Env{{Name: "other", GroupSize: testG, MaxLen: 4096, Weight: 1, Connected: true}}
		})
		eventually(t, "re-registration", func() bool { st := b.Stats(); return st.Registrations == 2 && st.Registered })
		if st := b.Stats(); st.EnvID != 1 {
			t.Fatalf("env_id %d after restart, want 1", st.EnvID)
		}
	})
}

// A 4xx is never retried: the group goes to the dead letters with the
// API's answer and, by default, intake stops with a clear error.
func TestRejectedGroup(t *testing.T) {
	for _, cont := range []bool{false, true} {
		t.Run(fmt.Sprintf("continue=%v", cont), func(t *testing.T) {
			api := atropostest.New(t)
			startTrainer(t, api, 64)
			b := newBridge(t, api, func(o *Options) { o.ContinueOnReject = cont })
			admit(t, b)
			api.FailNext("/scored_data", 422)
			write(t, b, testGroup(0))
			eventually(t, "the refusal", func() bool { return b.Stats().Rejected == 1 })
			_, reqs := api.Snapshot()
			if len(reqs) != 1 || reqs[0].Status != 422 {
				t.Fatalf("requests %+v: a 4xx must not be retried", reqs)
			}
			lines := readLines(t, filepath.Join(b.opts.SpoolDir, rejectedName))
			if len(lines) != 1 {
				t.Fatalf("%d dead letters", len(lines))
			}
			var dl deadLetter
			if err := json.Unmarshal([]byte(lines[0]), &dl); err != nil {
				t.Fatal(err)
			}
			if dl.GroupID != "item-0" || dl.Status != 422 || !strings.Contains(dl.Reason, "injected failure 422") || len(dl.Group) == 0 {
				t.Errorf("dead letter %+v", dl)
			}
			err := b.Admit(context.Background())
			if cont {
				if err != nil {
					t.Fatalf("admit after a refusal with ContinueOnReject: %v", err)
				}
				write(t, b, testGroup(1))
				eventually(t, "the next group", func() bool { return b.Stats().Delivered == 1 })
				return
			}
			if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "item-0") || !strings.Contains(err.Error(), "422") {
				t.Fatalf("admit after a refusal: %v", err)
			}
			// Still spooled (for the next bridge), and delivered.
			if werr := b.WriteGroup(context.Background(), testRun, testGroup(1)); !errors.Is(werr, ErrRejected) {
				t.Fatalf("write after a refusal: %v", werr)
			}
			eventually(t, "the group written after the refusal", func() bool { return b.Stats().Delivered == 1 })
		})
	}
}

// A group the trainer would drop (a sequence reaching its max_token_len)
// is dead-lettered before sending; the run goes on.
func TestTooLongGroupIsDeadLettered(t *testing.T) {
	api := atropostest.New(t)
	api.TrainerRegister(t, 64, 5, 1000) // testGroup sequences have 5 tokens
	api.TrainerBatch(t)
	b := newBridge(t, api, nil)
	admit(t, b)
	write(t, b, testGroup(0))
	eventually(t, "the dead letter", func() bool { return b.Stats().Rejected == 1 })
	lines := readLines(t, filepath.Join(b.opts.SpoolDir, rejectedName))
	if len(lines) != 1 || !strings.Contains(lines[0], "max_token_len 5") {
		t.Fatalf("dead letters %q", lines)
	}
	admit(t, b)
	if got, _ := api.Snapshot(); len(got) != 0 {
		t.Fatalf("a too-long group was sent")
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// Groups spooled by a bridge that could not deliver them are sent by the
// next bridge on the same directory, in order; a torn last line (a crash
// mid-write) is cut off.
func TestSpoolSurvivesTheProcess(t *testing.T) {
	api := atropostest.New(t)
	startTrainer(t, api, 64)
	dir := t.TempDir()
	api.FailAll("/scored_data", 503)
	api.FailAll("/scored_data_list", 503)
	b1 := newBridge(t, api, func(o *Options) { o.SpoolDir = dir })
	for k := range 3 {
		admit(t, b1)
		write(t, b1, testGroup(k))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if err := b1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	if st := b1.Stats(); st.Pending != 3 || st.Delivered != 0 {
		t.Fatalf("first bridge: %+v", st)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, segmentPrefix+"*"))
	if len(segs) == 0 {
		t.Fatal("no spool segment on disk")
	}
	f, err := os.OpenFile(segs[len(segs)-1], os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(`{"seq":99,"group_id":"torn","gro`)
	_ = f.Close()

	api.ClearFail("/scored_data")
	api.ClearFail("/scored_data_list")
	b2 := newBridge(t, api, func(o *Options) { o.SpoolDir = dir })
	eventually(t, "replay", func() bool { return b2.Stats().Delivered == 3 })
	admit(t, b2)
	write(t, b2, testGroup(3))
	eventually(t, "the new group", func() bool { return b2.Stats().Delivered == 4 })
	closeBridge(t, b2)
	got, _ := api.Snapshot()
	if len(got) != 4 {
		t.Fatalf("received %d groups, want 4", len(got))
	}
	for i, g := range got {
		checkGroup(t, g, i, 1) // all sent by the second bridge, registered as env 1
	}
}

func TestConfigurationErrors(t *testing.T) {
	if _, err := New(context.Background(), Options{URL: "localhost:8000", SpoolDir: t.TempDir(), GroupSize: 4}); !errors.Is(err, ErrConfig) {
		t.Errorf("bad URL: %v", err)
	}
	if _, err := New(context.Background(), Options{URL: "http://127.0.0.1:1", GroupSize: 4}); !errors.Is(err, ErrConfig) {
		t.Errorf("no spool dir: %v", err)
	}

	api := atropostest.New(t)
	startTrainer(t, api, 64)
	b := newBridge(t, api, nil)
	admit(t, b)
	g := testGroup(0)
	for i := range g.Rollouts {
		g.Rollouts[i].Result.Sequence.Logprobs = nil
	}
	if err := b.WriteGroup(context.Background(), testRun, g); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "inference_logprobs") {
		t.Fatalf("group without logprobs: %v", err)
	}
	if err := b.Admit(context.Background()); !errors.Is(err, ErrConfig) {
		t.Fatalf("admit after a configuration error: %v", err)
	}

	// A group size that does not divide the trainer's batch size.
	api2 := atropostest.New(t)
	startTrainer(t, api2, 6)
	b2 := newBridge(t, api2, nil)
	if err := b2.Admit(context.Background()); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "batch size 6") {
		t.Fatalf("admit with batch size 6: %v", err)
	}
}

// Intake stops (runner.ErrIntakeStopped) once the trainer's steps plus the
// queued batches exceed its num_steps.
func TestStopsAtTotalSteps(t *testing.T) {
	api := atropostest.New(t)
	api.TrainerRegister(t, 8, 4096, 1)
	api.TrainerBatch(t)
	b := newBridge(t, api, nil)
	for k := range 2 {
		admit(t, b)
		write(t, b, testGroup(k))
	}
	eventually(t, "delivery", func() bool { return b.Stats().Delivered == 2 })
	api.TrainerBatch(t) // step 1, and 2 more groups make another batch
	for k := 2; k < 4; k++ {
		admit(t, b)
		write(t, b, testGroup(k))
	}
	eventually(t, "delivery", func() bool { return b.Stats().Delivered == 4 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := b.Admit(ctx)
	for err == nil { // admitted before the next poll saw the queue
		b.release()
		err = b.Admit(ctx)
	}
	if !errors.Is(err, runner.ErrIntakeStopped) {
		t.Fatalf("admit past num_steps: %v", err)
	}
}

func ptrString(p *int) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}
