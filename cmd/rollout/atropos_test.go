package main

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/atropos"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/demo"
	"github.com/rollout-rl/rollout/internal/testkit/atropostest"
	"github.com/rollout-rl/rollout/trajectory"
)

// startSim serves the simulator following the reference solutions of
// toolcall-match (success probability 0.7, so groups have reward variance).
func startSim(t *testing.T, ctx context.Context) string {
	t.Helper()
	scripts, err := demo.EnvScripts(ctx, "toolcall-match", "train")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sim.Start(ctx, sim.Config{Family: "hermes", Seed: 7, SuccessProb: 0.7, Scripts: scripts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv.URL
}

// atroposWant reads a run directory and returns the groups an Atropos
// bridge sends (at least one successful rollout; scores not all equal
// unless sendEqual), minus the groups named in skip, and how many it skips.
func atroposWant(t *testing.T, dir string, skip map[string]bool, sendEqual bool) (want [][]atropostest.Rollout, skipped int) {
	t.Helper()
	run, err := trajectory.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string][]atropostest.Rollout{}
	var order []string
	for _, r := range recs {
		if _, ok := groups[r.GroupID]; !ok {
			order = append(order, r.GroupID)
			groups[r.GroupID] = nil
		}
		if r.Status == trajectory.StatusOK {
			groups[r.GroupID] = append(groups[r.GroupID], atropostest.Rollout{Tokens: r.Tokens, LossMask: r.LossMask, Logprobs: r.Logprobs, Reward: r.Reward})
		}
	}
	for _, id := range order {
		g := groups[id]
		equal := true
		for _, r := range g {
			equal = equal && math.Abs(r.Reward-g[0].Reward) < 1e-12
		}
		switch {
		case len(g) == 0 || equal && !sendEqual:
			skipped++
		case !skip[id]:
			want = append(want, g)
		}
	}
	return want, skipped
}

// deadLetters returns the group ids in a spool's rejected.jsonl.
func deadLetters(t *testing.T, spool string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	f, err := os.Open(filepath.Join(spool, "rejected.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var dl struct {
			GroupID string `json:"group_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &dl); err != nil {
			t.Fatal(err)
		}
		out[dl.GroupID] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var bridgeLine = regexp.MustCompile(`atropos: +(\d+) groups delivered, (\d+) skipped`)

// bridgeCounts returns the delivered and skipped counts a run printed.
func bridgeCounts(t *testing.T, out string) (delivered, skipped int) {
	t.Helper()
	m := bridgeLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the run prints no bridge counts:\n%s", out)
	}
	delivered, _ = strconv.Atoi(m[1])
	skipped, _ = strconv.Atoi(m[2])
	return delivered, skipped
}

// TestRunAtropos runs `rollout run --atropos-url` against the stand-in API
// three times on one output dir:
//  1. the first group sent is refused (422): the command fails naming the
//     refusal, and the group is kept in the spool's dead letters;
//  2. the API answers 503 until the run is interrupted: the command fails
//     saying that groups stay in the spool;
//  3. a clean run resumes: it collects the remaining groups and replays
//     what the spool holds.
//
// In the end the API holds every sendable group of the run directory
// exactly once, with its tokens, masks, logprobs and scores, except the
// refused one.
func TestRunAtropos(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	api := atropostest.New(t)
	api.StartTrainer(t, 64, 1<<16, 1000)
	simURL := startSim(t, ctx)

	dir := t.TempDir()
	cfg := filepath.Join(dir, "run.yaml")
	text := "env: toolcall-match\ngroups: 10\ngroup_size: 4\nseed: 3\ninference:\n  backend: vllm\n  endpoints: [" + simURL +
		"]\nparser: hermes\nsampling: {max_tokens: 256}\nlimits: {groups_in_flight: 1}\n"
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	spool := filepath.Join(out, atropos.SpoolSubdir)
	args := []string{"run", "-c", cfg, "--out", out, "--atropos-url", api.URL()}
	var delivered, skipped int
	count := func(text string) {
		d, s := bridgeCounts(t, text)
		delivered, skipped = delivered+d, skipped+s
	}

	// 1. Refuse the first group, whichever endpoint carries it.
	api.FailNext("/scored_data", 422)
	api.FailNext("/scored_data_list", 422)
	text1, code := runRollout(ctx, args...)
	if code != 1 || !strings.Contains(text1, atropos.ErrRejected.Error()) {
		t.Fatalf("run 1: exit %d, want 1 naming the refusal:\n%s", code, text1)
	}
	count(text1)
	t.Logf("run 1:\n%s", tail(text1))
	rejected := deadLetters(t, spool)
	if len(rejected) != 1 {
		t.Fatalf("dead letters %v, want the one refused group", rejected)
	}

	// 2. The API fails every send; the run is interrupted once a group
	// waits in the spool.
	api.ClearFail("/scored_data")
	api.ClearFail("/scored_data_list")
	api.FailAll("/scored_data", 503)
	api.FailAll("/scored_data_list", 503)
	runCtx, interrupt := context.WithCancel(ctx)
	ran := make(chan string, 1)
	go func() {
		text, code := runRollout(runCtx, args...)
		ran <- text + "\nexit code " + strconv.Itoa(code)
	}()
	var text2 string
wait:
	for {
		select {
		case text2 = <-ran:
			t.Fatalf("run 2 ended before any send failed:\n%s", text2)
		case <-time.After(10 * time.Millisecond):
		}
		_, reqs := api.Snapshot()
		for _, r := range reqs {
			if r.Status == 503 {
				break wait
			}
		}
	}
	interrupt()
	text2 = <-ran
	if !strings.HasSuffix(text2, "exit code 1") || !strings.Contains(text2, atropos.ErrUndelivered.Error()) || !strings.Contains(text2, spool) {
		t.Fatalf("run 2: want exit 1 saying that groups stay in %s:\n%s", spool, text2)
	}
	count(text2)
	t.Logf("run 2:\n%s", tail(text2))
	api.ClearFail("/scored_data")
	api.ClearFail("/scored_data_list")

	// 3. Resume: the rest of the groups, and the spool replayed.
	text3, code := runRollout(ctx, args...)
	if code != 0 {
		t.Fatalf("run 3: exit %d\n%s", code, text3)
	}
	count(text3)

	want, skip := atroposWant(t, out, rejected, false)
	if len(want) < 2 {
		t.Fatalf("%d groups with reward variance: the test shows little", len(want))
	}
	got, _ := api.Snapshot()
	atropostest.CheckGroups(t, got, want)
	if delivered != len(want) || skipped != skip {
		t.Errorf("the runs printed %d delivered and %d skipped; want %d and %d", delivered, skipped, len(want), skip)
	}
	api.Mu.Lock()
	envs := append([]atropostest.Env(nil), api.Envs...)
	api.Mu.Unlock()
	for _, e := range envs {
		if e.Name != "toolcall-match" || e.GroupSize != 4 {
			t.Errorf("registration %+v: want toolcall-match with G=4", e)
		}
	}
	if len(envs) != 3 {
		t.Errorf("%d registrations, want one per run", len(envs))
	}

	// Evaluation does not feed a trainer: a config asking for it is refused.
	evalCfg := filepath.Join(dir, "eval.yaml")
	if err := os.WriteFile(evalCfg, []byte(text+"atropos: {url: "+api.URL()+"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if text, code := runRollout(ctx, "eval", "-c", evalCfg, "--out", filepath.Join(dir, "eval")); code != 2 || !strings.Contains(text, "atropos.url") {
		t.Errorf("eval with atropos.url: exit %d, want 2 naming atropos.url\n%s", code, text)
	}
	if text, code := runRollout(ctx, "run", "-c", cfg, "--out", filepath.Join(dir, "bad"), "--atropos-url", "ftp://x"); code != 2 || !strings.Contains(text, "URL") {
		t.Errorf("--atropos-url ftp://x: exit %d, want 2\n%s", code, text)
	}
}

// TestServeAtropos serves with --atropos-url and runs a job through
// `rollout job start --watch`: its groups reach the stand-in API.
func TestServeAtropos(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	api := atropostest.New(t)
	api.StartTrainer(t, 64, 1<<16, 1000)
	simURL := startSim(t, ctx)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "run.yaml")
	text := "env: toolcall-match\ngroups: 3\ngroup_size: 4\ninference:\n  backend: vllm\n  endpoints: [" + simURL +
		"]\nparser: hermes\nsampling: {max_tokens: 256}\natropos: {send_equal_scores: true}\noutput:\n  dir: runs/atropos\n"
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "unix://" + filepath.Join(dir, "rollout.sock")
	stopServe := startServe(t, ctx, addr, "--data-dir", dir, "--state-dir", "none", "--atropos-url", api.URL())
	out, code := runRollout(ctx, "job", "start", "-c", cfg, "--watch", "--addr", addr)
	if code != 0 || !strings.Contains(out, "SUCCEEDED") {
		t.Fatalf("job start --watch: exit %d\n%s", code, out)
	}
	stopServe()
	// Every group is sent (send_equal_scores) and the job ends only after
	// its bridge delivered them.
	run := filepath.Join(dir, "runs/atropos")
	want, skipped := atroposWant(t, run, nil, true)
	if len(want) != 3 || skipped != 0 {
		t.Fatalf("run directory: %d groups to send, %d without a successful rollout; want 3 and 0", len(want), skipped)
	}
	got, _ := api.Snapshot()
	atropostest.CheckGroups(t, got, want)
}

func tail(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "{") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
