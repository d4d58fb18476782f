package trajectory

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if crashChild() {
		return
	}
	// Writer logs are not what these tests check.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	goleak.VerifyTestMain(m)
}

func ptr[T any](v T) *T { return &v }

var fixtureTime = time.Date(2026, 11, 22, 1, 2, 3, 456789000, time.UTC)

const fixtureTools = `[{"type":"function","function":{"name":"terminal","description":"Run a shell command","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}}]`

// fixtureRecords is a small run covering every column: two groups of an env
// with categories, tool calls and reasoning, an infra failure, tool errors,
// reward components, optional advantage and policy version.
func fixtureRecords() []Record {
	manifest := Manifest{ImageDigest: "sha256:abc", CPUs: 1.5, MemoryBytes: 512 << 20, PidsLimit: 128, Network: "none",
		RolloutTimeoutMS: 600000, ToolTimeoutMS: 30000, Parser: "hermes", ServiceVersion: "v0.1.0", ConfigHash: "cfg123"}
	mk := func(group, item, cat string, idx int32, reward float64, answer string, finished bool, trained []int8) Record {
		toks := make([]int32, len(trained))
		lp := make([]float32, len(trained))
		for i := range toks {
			toks[i] = int32(100 + 7*i + int(idx))
			lp[i] = -float32(i+1) / 8
		}
		msgs := `[{"role":"system","content":"You are a careful agent."},{"role":"user","content":"What is 2+` + item + `?"},` +
			`{"role":"assistant","content":"","reasoning_content":"I should compute it.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"terminal","arguments":"{\"command\": \"echo $((2+` + item + `))\"}"}}]},` +
			`{"role":"tool","tool_call_id":"call_1","name":"terminal","content":"{\"output\": \"` + answer + `\", \"exit_code\": 0}"},` +
			`{"role":"assistant","content":"The answer is ` + answer + `."}]`
		r := Record{
			SchemaVersion: SchemaVersion, RunID: "run-fixture", Env: "arith", Category: cat, ItemID: item, GroupID: group, RolloutIndex: idx,
			Model: "qwen-test", SamplingParams: `{"temperature":0.8,"max_tokens":64}`, Messages: msgs, Tools: fixtureTools,
			Tokens: toks, LossMask: trained, Logprobs: lp, PromptTokens: 3, CompletionTokens: int32(len(trained) - 3),
			Reward: reward, RewardComponents: map[string]float64{"correct": reward, "format": 0.5},
			Turns: 2, FinishedNaturally: finished, StopReason: "stop", Status: StatusOK,
			Timings:  Timings{GenerationMS: 120 + int64(idx), ToolsMS: 30, SandboxStartMS: 400, RewardMS: 5, TotalMS: 560 + int64(idx)},
			Manifest: manifest, CreatedAt: fixtureTime.Add(time.Duration(idx) * time.Second),
			SessionID: fmt.Sprintf("ro-%s-%d", group, idx), ParentBranch: -1, SplitCall: -1,
		}
		if !finished {
			r.StopReason = "length"
		}
		if idx == 1 {
			// Asynchronous RL: the last trained tokens came after an abort cut.
			r.TokenVersions = make([]int64, len(toks))
			for i := range r.TokenVersions {
				r.TokenVersions[i] = 4
				if i >= len(toks)-2 {
					r.TokenVersions[i] = 5
				}
			}
			lo, hi, lag := int64(4), int64(5), int64(2)
			r.MinPolicyVersion, r.MaxPolicyVersion, r.PolicyLag = &lo, &hi, &lag
			r.VersionCuts = []VersionCut{{Turn: 2, Position: int32(len(toks) - 2), Kind: "abort", From: 4, To: 5}}
		}
		r.DeriveTrainingFields()
		return r
	}
	a := []int8{0, 0, 0, 1, 1, 0, 0, 1, 1}
	recs := []Record{
		mk("g-1", "1", "easy", 0, 1, "3", true, a),
		mk("g-1", "1", "easy", 1, 0, "4", true, a),
		mk("g-1", "1", "easy", 2, 1, "3", false, a),
		mk("g-2", "5", "hard", 0, 0.25, "8", true, a),
		mk("g-2", "5", "hard", 1, 1, "7", true, a),
	}
	recs[0].Advantage = ptr(0.5)
	recs[0].PolicyVersion = ptr(int64(42))
	recs[1].ToolErrors = []ToolError{{Turn: 1, Tool: "terminal", CallID: "call_1", Kind: "timeout", Message: "command timed out after 30s"}}
	recs[1].TurnRewards = []float64{0, 0.5}
	recs[1].DistillTokenIDs = make([][]int32, len(a))
	recs[1].DistillLogprobs = make([][]float32, len(a))
	for p, m := range a {
		recs[1].DistillTokenIDs[p], recs[1].DistillLogprobs[p] = []int32{}, []float32{}
		if m == 1 {
			recs[1].DistillTokenIDs[p] = []int32{int32(200 + p), int32(300 + p)}
			recs[1].DistillLogprobs[p] = []float32{-0.25, -1.5}
		}
	}
	recs[1].LoopEvents = []LoopEvent{{Turn: 1, Kind: "arguments_replaced", Message: 2, CallID: "call_1", Original: `{"command": "ls`, Detail: "{}"}}
	recs[1].CallStatuses = []CallStatus{{Turn: 1, Index: 0, Name: "terminal", Status: CallMalformed, Reason: "call JSON is incomplete before </tool_call>", SpanStart: 12, SpanEnd: 30},
		{Turn: 2, Index: 0, Name: "terminal", Status: CallRepaired, Reason: "close marker missing", SpanStart: -1, SpanEnd: -1}, {Turn: 2, Index: 1, Name: "terminal", Status: CallOK, SpanStart: 41, SpanEnd: 58}}
	recs[2].DriftTokens = 2
	recs[2].UnscoredTokens = 1
	// Group g-1 replays routing: the experts of the first 8 of 9 tokens,
	// 2 layers × top-2.
	for r := range 3 {
		recs[r].RoutedExpertsShape = []int32{8, 2, 2}
		for i := range 8 * 2 * 2 {
			recs[r].RoutedExperts = append(recs[r].RoutedExperts, uint16((i+r)*4099%65536))
		}
	}
	// Same conversation as recs[0]: --dedupe drops it.
	recs[2].Messages = recs[0].Messages
	failed := Record{
		SchemaVersion: SchemaVersion, RunID: "run-fixture", Env: "arith", Category: "hard", ItemID: "5", GroupID: "g-2", RolloutIndex: 2,
		Model: "qwen-test", SamplingParams: `{"temperature":0.8}`, Messages: `[{"role":"user","content":"What is 2+5?"}]`, Tools: fixtureTools,
		Status: StatusInfraFailed, Failure: &Failure{Kind: "sandbox_start", Message: "image rollout-sandbox:missing not found"},
		StopReason: "infra_error", Timings: Timings{SandboxStartMS: 50, TotalMS: 51}, Manifest: manifest, CreatedAt: fixtureTime,
		SessionID: "ro-g-2-2", ParentBranch: -1, SplitCall: -1,
	}
	return append(recs, failed)
}

// writeFixtureRun writes recs to a fresh run directory with small files so
// that several part files and row groups are exercised.
func writeFixtureRun(t *testing.T, recs []Record) string {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	w, err := NewWriter(ctx, dir, WriterOptions{RunID: "run-fixture", MaxRowsPerFile: 4, RowGroupRows: 2,
		Config: []byte(`{"env":"arith","group_size":3}`), Versions: map[string]string{"rollout": "test"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := w.Write(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sizedRecord is record index of a run drawn from seed, for tests that need
// many or large valid records rather than every column: the fixture's first
// record with n token positions of seeded random ids (they do not compress
// away, so size-bound tests fill files), groupSize rollouts per group and
// the first n/8 positions untrained. The same arguments give the same
// record. (Realistic agent-like records for size figures are the bench's:
// internal/devtools/bench/synth.)
func sizedRecord(seed uint64, index, n, groupSize int) Record {
	r := fixtureRecords()[0]
	r.Advantage, r.PolicyVersion = nil, nil
	rng := rand.New(rand.NewPCG(seed, uint64(index)))
	g := index / groupSize
	r.RunID = fmt.Sprintf("sized-%d", seed)
	r.ItemID, r.GroupID, r.RolloutIndex = fmt.Sprintf("item-%d", g), fmt.Sprintf("group-%d", g), int32(index%groupSize)
	r.CreatedAt = fixtureTime.Add(time.Duration(index) * time.Second)
	r.Tokens, r.LossMask, r.Logprobs, r.Masks = make([]int32, n), make([]int8, n), make([]float32, n), nil
	prompt := n / 8
	for i := range n {
		r.Tokens[i] = int32(rng.IntN(151936))
		if i >= prompt {
			r.LossMask[i] = 1
			r.Logprobs[i] = -rng.Float32()
		}
	}
	r.PromptTokens, r.CompletionTokens = int32(prompt), int32(n-prompt)
	r.DeriveTrainingFields()
	return r
}
