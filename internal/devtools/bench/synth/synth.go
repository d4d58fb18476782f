// Package synth generates agent-like trajectory records for `rollout bench`
// and for tests that need realistic volumes: what the bench's output suite
// writes, and what size and crash tests write, without a model.
package synth

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/trajectory"
)

// Options shapes generated records.
type Options struct {
	// Tokens per record (8,192).
	Tokens int
	// GroupSize rollouts share a group id and item (8).
	GroupSize int
	// PromptTokens untrained tokens before the first assistant turn (1,024).
	PromptTokens int
	// Vocab is the token id range (151,936, Qwen's vocabulary).
	Vocab int
	// SharedPrompt gives the rollouts of a group one prompt (its ids and
	// the system and user messages), as the rollouts of a GRPO group have.
	// Off, every record draws its own (the records are otherwise the same).
	SharedPrompt bool
}

func (o *Options) defaults() {
	if o.Tokens <= 0 {
		o.Tokens = 8192
	}
	if o.GroupSize <= 0 {
		o.GroupSize = 8
	}
	if o.PromptTokens <= 0 || o.PromptTokens >= o.Tokens {
		o.PromptTokens = min(1024, o.Tokens/8)
	}
	if o.Vocab <= 0 {
		o.Vocab = 151936
	}
}

var words = strings.Fields(`the a of to and in is it that for file run test error output command
line value return function import print def class self if else true false none list dict string int
path directory install build package result check pass fail assert expected got answer compute sum
let me look at this first then write patch apply diff grep find cat echo make go python numpy pandas`)

// Trajectory generates a realistic-looking agent trajectory for benchmarks
// and crash tests: Zipf-distributed token ids, a prompt, alternating
// assistant (trained) and tool-output (untrained) segments, sampling
// logprobs concentrated near zero, and conversation text of matching length.
// The same seed and index give the same record.
func Trajectory(seed uint64, index int, opts Options) trajectory.Record {
	opts.defaults()
	rng := rand.New(rand.NewPCG(seed, uint64(index)))
	zipf := rand.NewZipf(rng, 1.07, 8, uint64(opts.Vocab-1))
	n := opts.Tokens
	r := trajectory.Record{
		RunID: fmt.Sprintf("synthetic-%d", seed), Env: "synthetic-swe", Category: []string{"easy", "medium", "hard"}[index/opts.GroupSize%3],
		ItemID: fmt.Sprintf("item-%d", index/opts.GroupSize), GroupID: fmt.Sprintf("group-%d", index/opts.GroupSize),
		RolloutIndex: int32(index % opts.GroupSize), Model: "Qwen/Qwen3-8B", SamplingParams: `{"temperature":1.0,"top_p":1.0,"max_tokens":2048}`,
		Tokens: make([]int32, n), LossMask: make([]int8, n), Logprobs: make([]float32, n),
		Status: trajectory.StatusOK, StopReason: "stop", FinishedNaturally: true,
		Manifest: trajectory.Manifest{ImageDigest: "sha256:5f1c0e9d", CPUs: 1, MemoryBytes: 1 << 30, PidsLimit: 256, Network: "none",
			RolloutTimeoutMS: 1_200_000, ToolTimeoutMS: 60_000, Parser: "hermes", ServiceVersion: "bench", ConfigHash: "bench"},
		CreatedAt: time.Unix(1_790_000_000+int64(index), 0).UTC(),
	}
	for i := range r.Tokens {
		r.Tokens[i] = int32(zipf.Uint64())
	}
	text := func(k int) string { return wordsFrom(rng, k) }
	// ~0.75 words per token.
	type msg = map[string]any
	msgs := []msg{{"role": "system", "content": text(opts.PromptTokens / 2)}, {"role": "user", "content": text(opts.PromptTokens / 4)}}
	pos, turn := opts.PromptTokens, 0
	for pos < n {
		asst := min(150+rng.IntN(300), n-pos)
		for i := pos; i < pos+asst; i++ {
			r.LossMask[i] = 1
			if rng.Float64() < 0.75 {
				r.Logprobs[i] = -float32(math.Abs(rng.NormFloat64()) * 0.01)
			} else {
				r.Logprobs[i] = -float32(rng.ExpFloat64() * 1.5)
			}
		}
		pos += asst
		turn++
		call := fmt.Sprintf("call_%d", turn)
		msgs = append(msgs, msg{"role": "assistant", "content": text(asst * 3 / 4), "tool_calls": []msg{{"id": call, "type": "function",
			"function": msg{"name": "terminal", "arguments": fmt.Sprintf(`{"command": "%s"}`, text(6))}}}})
		tool := min(200+rng.IntN(600), n-pos)
		pos += tool
		msgs = append(msgs, msg{"role": "tool", "tool_call_id": call, "content": text(tool * 3 / 4)})
	}
	if opts.SharedPrompt {
		// Drawn after the record's own stream, so everything else is the
		// record it would be without the option.
		g := rand.New(rand.NewPCG(seed, 1<<40+uint64(index/opts.GroupSize)))
		gz := rand.NewZipf(g, 1.07, 8, uint64(opts.Vocab-1))
		for i := range opts.PromptTokens {
			r.Tokens[i] = int32(gz.Uint64())
		}
		msgs[0]["content"] = wordsFrom(g, opts.PromptTokens/2)
		msgs[1]["content"] = wordsFrom(g, opts.PromptTokens/4)
	}
	r.Turns = int32(turn)
	r.PromptTokens = int32(opts.PromptTokens)
	r.CompletionTokens = int32(n - opts.PromptTokens)
	b, _ := json.Marshal(msgs)
	r.Messages = string(b)
	r.Tools = toolsJSON
	r.Reward = float64(rng.IntN(2))
	r.RewardComponents = map[string]float64{"tests_passed": r.Reward, "format": 1}
	r.Timings = trajectory.Timings{GenerationMS: int64(5000 + rng.IntN(20000)), ToolsMS: int64(rng.IntN(8000)), SandboxStartMS: int64(300 + rng.IntN(900)), RewardMS: int64(rng.IntN(3000))}
	r.Timings.TotalMS = r.Timings.GenerationMS + r.Timings.ToolsMS + r.Timings.SandboxStartMS + r.Timings.RewardMS
	r.DeriveTrainingFields()
	return r
}

// wordsFrom is k of words drawn from rng.
func wordsFrom(rng *rand.Rand, k int) string {
	var b strings.Builder
	for i := range k {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()
}

const toolsJSON = `[{"type":"function","function":{"name":"terminal","description":"Run a shell command in the sandbox","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}}]`
