package runner_test

// End-to-end through the in-process simulator (real inference backends
// over HTTP, the real agent loop and runner, the real record conversion and
// Atropos export): model misbehaviour at the token limit is a model
// outcome, never an infrastructure failure.

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

const lookupTask = "look it up"

// lookupEnv offers one call-only tool (recorded, never executed): episodes
// have tool calls without a sandbox. Rewards differ by rollout index so a
// group has non-zero advantages.
type lookupEnv struct{ g int }

func (e lookupEnv) Name() string            { return "lookup" }
func (e lookupEnv) Defaults() envs.Defaults { return envs.Defaults{GroupSize: e.g, MaxTurns: 4} }
func (lookupEnv) Items(context.Context, string) ([]datasets.Item, error) {
	return []datasets.Item{{ID: "item-0", Data: map[string]any{"q": lookupTask}}}, nil
}
func (lookupEnv) Task(context.Context, datasets.Item) (envs.Task, error) {
	return envs.Task{
		Messages: []openai.ChatCompletionMessage{{Role: "user", Content: lookupTask}},
		CallOnly: []openai.Tool{{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
			Name: "lookup", Parameters: map[string]any{"type": "object", "properties": map[string]any{"key": map[string]any{"type": "string"}}}}}},
	}, nil
}

func (lookupEnv) Reward(_ context.Context, _ datasets.Item, out envs.Outcome, _ envs.Sandbox) (rewards.Score, error) {
	v := 0.0
	if strings.Contains(out.Final, "found") {
		v = 1
	}
	return rewards.Score{Value: v + float64(len(out.Messages)%3)/10}, nil
}

type groupSink struct {
	mu     sync.Mutex
	run    *runner.RunInfo
	groups []*runner.Group
}

func (s *groupSink) WriteGroup(_ context.Context, run *runner.RunInfo, g *runner.Group) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.run = run
	s.groups = append(s.groups, g)
	return nil
}

// recordingPolicy keeps every history sent to the server.
type recordingPolicy struct {
	inference.Policy
	mu    sync.Mutex
	hists [][]openai.ChatCompletionMessage
}

type recordingEpisode struct {
	inference.Episode
	p *recordingPolicy
}

func (p *recordingPolicy) Start(ctx context.Context, spec inference.EpisodeSpec) (inference.Episode, error) {
	ep, err := p.Policy.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &recordingEpisode{Episode: ep, p: p}, nil
}

func (e *recordingEpisode) Generate(ctx context.Context, msgs []openai.ChatCompletionMessage) (inference.Turn, error) {
	e.p.mu.Lock()
	e.p.hists = append(e.p.hists, append([]openai.ChatCompletionMessage(nil), msgs...))
	e.p.mu.Unlock()
	return e.Episode.Generate(ctx, msgs)
}

type e2eCase struct {
	backend  string
	simCfg   sim.Config
	loop     runner.LoopConfig
	maxToks  int
	maxTurns int
	g        int
	wantStop agentloop.StopReason
	// after, when set, runs with the simulator still up.
	after func(t *testing.T, url string, recs []trajectory.Record)
}

func runE2E(t *testing.T, c e2eCase) ([]trajectory.Record, *recordingPolicy) {
	t.Helper()
	c.simCfg.Family = "hermes"
	srv, err := sim.Start(context.Background(), c.simCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	icfg := inference.Config{Backend: c.backend, Endpoints: []string{srv.URL}, Retries: -1, ChatTokenIDs: c.backend == inference.BackendChat}
	pol, err := inference.Open(icfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pol.Close()
	rec := &recordingPolicy{Policy: pol}
	cfg := runner.Config{Env: "lookup", Inference: icfg, Parser: "hermes", Retries: 2, Loop: c.loop, GroupSize: c.g,
		Sampling: inference.Sampling{MaxTokens: c.maxToks}, MaxTurns: c.maxTurns}
	sink := &groupSink{}
	r, err := runner.New(cfg, runner.Deps{Logger: slog.New(slog.DiscardHandler), Env: lookupEnv{g: c.g}, Policy: rec, Sinks: []runner.Sink{sink}, RunID: "run_e2e"})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.InfraFailed != 0 || sum.Retries != 0 || sum.RolloutsOK != c.g {
		t.Fatalf("summary %+v: model misbehaviour must not be an infrastructure failure", sum)
	}
	var recs []trajectory.Record
	for _, g := range sink.groups {
		for i := range g.Rollouts {
			ro := &g.Rollouts[i]
			if ro.Result.StopReason != c.wantStop {
				t.Errorf("rollout %d: stop %s, want %s (events %+v)", ro.Index, ro.Result.StopReason, c.wantStop, ro.Result.Events)
			}
			r, err := assemble.Record(sink.run, g, ro)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Validate(); err != nil {
				t.Fatal(err)
			}
			if len(r.Tokens) == 0 || len(r.Logprobs) != len(r.Tokens) {
				t.Errorf("rollout %d: %d tokens, %d logprobs", ro.Index, len(r.Tokens), len(r.Logprobs))
			}
			recs = append(recs, r)
		}
	}
	// Every history sent to the server has JSON-object arguments.
	for i, h := range rec.hists {
		for _, m := range h {
			for _, tc := range m.ToolCalls {
				var v map[string]any
				if err := json.Unmarshal([]byte(tc.Function.Arguments), &v); err != nil {
					t.Errorf("history %d: call arguments %q are not a JSON object", i, tc.Function.Arguments)
				}
			}
		}
	}
	if c.after != nil {
		c.after(t, srv.URL, recs)
	}
	return recs, rec
}

// Defect 6 of issue 14: with every generation cut at max_tokens
// (--exact-length), rollouts stop with "length", finished_naturally false,
// and the Atropos export's zero-advantage-on-truncation takes effect.
func TestTruncatedRolloutExportedWithZeroAdvantage(t *testing.T) {
	if agentloop.StopLength != trajectory.StopLength {
		t.Fatalf("the loop emits %q, the export checks %q", agentloop.StopLength, trajectory.StopLength)
	}
	for _, backend := range []string{inference.BackendVLLM, inference.BackendChat} {
		t.Run(backend, func(t *testing.T) {
			recs, _ := runE2E(t, e2eCase{backend: backend, simCfg: sim.Config{ExactLength: true}, maxToks: 12, g: 4, wantStop: agentloop.StopLength})
			for _, r := range recs {
				if r.StopReason != "length" || r.FinishedNaturally || r.Status != trajectory.StatusOK {
					t.Fatalf("record: stop %q natural %v status %s", r.StopReason, r.FinishedNaturally, r.Status)
				}
				if r.CompletionTokens != 12 {
					t.Errorf("completion tokens %d, want 12", r.CompletionTokens)
				}
			}
			on, _, err := trajectory.AtroposGroups(recs, trajectory.AtroposOptions{ZeroAdvantageOnTruncation: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(on) != 1 || len(on[0].Overrides) != 4 {
				t.Fatalf("groups %+v", on)
			}
			for i, ov := range on[0].Overrides {
				if ov["set_advantage_to_zero"] != true {
					t.Errorf("rollout %d: overrides %v, want set_advantage_to_zero", i, ov)
				}
			}
			off, _, err := trajectory.AtroposGroups(recs, trajectory.AtroposOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if off[0].Overrides != nil {
				t.Errorf("option off: overrides %v", off[0].Overrides)
			}
		})
	}
}

// A tool call cut by max_tokens: by default the rollout stops with
// "length" and the call is not executed; with on_truncation: tool_error the
// model is told and the episode goes on. Never an infrastructure failure.
func TestTruncatedToolCall(t *testing.T) {
	long := strings.Repeat("alpha beta gamma delta ", 60)
	script := sim.Script{Match: lookupTask, Steps: []sim.Step{
		{ToolCalls: []sim.Call{{Name: "lookup", Arguments: map[string]any{"key": long}}}},
		{Final: "found it"},
	}}
	for _, backend := range []string{inference.BackendVLLM, inference.BackendChat} {
		t.Run(backend+"/stop", func(t *testing.T) {
			recs, _ := runE2E(t, e2eCase{backend: backend, simCfg: sim.Config{Scripts: []sim.Script{script}, SuccessProb: 1}, maxToks: 40, g: 2, wantStop: agentloop.StopLength})
			for _, r := range recs {
				var msgs []openai.ChatCompletionMessage
				if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
					t.Fatal(err)
				}
				if len(msgs) != 2 || msgs[1].Role != "assistant" || r.FinishedNaturally {
					t.Fatalf("messages %+v", msgs)
				}
				if !hasEvent(r, agentloop.EventCallUnparsed) || !hasEvent(r, agentloop.EventCallNotExecuted) {
					t.Errorf("events %+v", r.LoopEvents)
				}
			}
		})
		t.Run(backend+"/tool_error", func(t *testing.T) {
			recs, rec := runE2E(t, e2eCase{backend: backend, simCfg: sim.Config{Scripts: []sim.Script{script}, SuccessProb: 1}, maxToks: 40, g: 2,
				loop: runner.LoopConfig{OnTruncation: agentloop.TruncationToolError}, wantStop: agentloop.StopFinished})
			for _, r := range recs {
				if len(r.ToolErrors) != 1 || r.ToolErrors[0].Kind != agentloop.InvalidTruncated || !r.FinishedNaturally {
					t.Errorf("tool errors %+v natural %v", r.ToolErrors, r.FinishedNaturally)
				}
			}
			if len(rec.hists) != 4 {
				t.Errorf("%d generations, want 2 per rollout", len(rec.hists))
			}
		})
	}
}

func hasEvent(r trajectory.Record, kind string) bool {
	for _, e := range r.LoopEvents {
		if e.Kind == kind {
			return true
		}
	}
	return false
}

// Empty-reply nudges and tool-name repair, through the simulator and the
// runner: what the loop inserts or repairs is in the record.
func TestNudgeAndNameRepairRecorded(t *testing.T) {
	script := sim.Script{Match: lookupTask, Steps: []sim.Step{
		{ToolCalls: []sim.Call{{Name: "Lookup", Arguments: map[string]any{"key": "x"}}}},
		{Final: "found it"},
	}}
	for _, backend := range []string{inference.BackendVLLM, inference.BackendChat} {
		t.Run(backend+"/repair", func(t *testing.T) {
			recs, _ := runE2E(t, e2eCase{backend: backend, simCfg: sim.Config{Scripts: []sim.Script{script}, SuccessProb: 1}, maxToks: 200, g: 2,
				loop: runner.LoopConfig{RepairToolNames: true}, wantStop: agentloop.StopFinished})
			for _, r := range recs {
				if len(r.ToolErrors) != 0 || len(r.LoopEvents) != 1 {
					t.Fatalf("tool errors %+v events %+v", r.ToolErrors, r.LoopEvents)
				}
				e := r.LoopEvents[0]
				if e.Kind != agentloop.EventToolNameRepaired || e.Original != "Lookup" || e.Detail != "lookup" || e.Turn != 1 {
					t.Fatalf("event %+v", e)
				}
			}
		})
		t.Run(backend+"/no-repair", func(t *testing.T) {
			recs, _ := runE2E(t, e2eCase{backend: backend, simCfg: sim.Config{Scripts: []sim.Script{script}, SuccessProb: 1}, maxToks: 200, g: 2, wantStop: agentloop.StopFinished})
			for _, r := range recs {
				if len(r.ToolErrors) != 1 || r.ToolErrors[0].Kind != "unknown_tool" || len(r.LoopEvents) != 0 {
					t.Fatalf("tool errors %+v events %+v", r.ToolErrors, r.LoopEvents)
				}
			}
		})
	}
	// An empty first reply: finished by default, nudged (and the nudge
	// recorded as an inserted, untrained message) when enabled.
	empty := sim.Script{Match: lookupTask, Steps: []sim.Step{{Final: ""}, {Final: "found it"}}}
	for _, backend := range []string{inference.BackendVLLM, inference.BackendChat} {
		t.Run(backend+"/nudge", func(t *testing.T) {
			c := e2eCase{backend: backend, simCfg: sim.Config{Scripts: []sim.Script{empty}, SuccessProb: 1}, maxToks: 200, g: 2,
				loop: runner.LoopConfig{EmptyReplyNudges: 1}, wantStop: agentloop.StopFinished}
			c.after = func(t *testing.T, url string, recs []trajectory.Record) {
				for _, r := range recs {
					checkNudgeMasked(t, url, r)
				}
			}
			recs, _ := runE2E(t, c)
			for _, r := range recs {
				var msgs []openai.ChatCompletionMessage
				if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
					t.Fatal(err)
				}
				if len(msgs) != 4 || msgs[2].Role != "user" || msgs[2].Content != agentloop.EmptyReplyNudgeText || msgs[3].Content != "found it" || r.Turns != 2 {
					t.Fatalf("messages %+v", msgs)
				}
				if len(r.LoopEvents) != 1 || r.LoopEvents[0].Kind != agentloop.EventMessageInserted || r.LoopEvents[0].Message != 2 {
					t.Fatalf("events %+v", r.LoopEvents)
				}
			}
		})
		t.Run(backend+"/no-nudge", func(t *testing.T) {
			recs, _ := runE2E(t, e2eCase{backend: backend, simCfg: sim.Config{Scripts: []sim.Script{empty}, SuccessProb: 1}, maxToks: 200, g: 2, wantStop: agentloop.StopFinished})
			for _, r := range recs {
				if r.Turns != 1 || len(r.LoopEvents) != 0 || !r.FinishedNaturally {
					t.Fatalf("turns %d events %+v", r.Turns, r.LoopEvents)
				}
			}
		})
	}
}

// checkNudgeMasked: the inserted message is rendered by the server's
// template between the two generations and masked, like a tool result: the
// trained positions are exactly the two sampled turns (tokens mode, and
// chat mode with the server's token ids).
func checkNudgeMasked(t *testing.T, url string, r trajectory.Record) {
	t.Helper()
	var runs [][2]int // [start, end) of trained runs
	for i, m := range r.LossMask {
		if m == 1 && (i == 0 || r.LossMask[i-1] == 0) {
			runs = append(runs, [2]int{i, i + 1})
		} else if m == 1 {
			runs[len(runs)-1][1] = i + 1
		}
	}
	if len(runs) != 2 {
		t.Fatalf("%d trained runs, want 2 (one per generation): %v", len(runs), runs)
	}
	// The masked ids between the two generations are the template's
	// rendering of the nudge (and the turn markers around it).
	body, _ := json.Marshal(map[string]any{"tokens": r.Tokens[runs[0][1]:runs[1][0]]})
	resp, err := http.Post(url+"/detokenize", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Prompt string `json:"prompt"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("detokenize: %v (HTTP %d)", err, resp.StatusCode)
	}
	if !strings.Contains(out.Prompt, agentloop.EmptyReplyNudgeText) {
		t.Fatalf("masked ids between the generations read %q: the nudge is not there", out.Prompt)
	}
}

// The grace turn, through the simulator: after max_turns a user message
// asks for the final answer, one more generation answers; the stop reason
// stays max_turns, the message is recorded and masked.
func TestGraceTurnRecorded(t *testing.T) {
	script := sim.Script{Match: lookupTask, Steps: []sim.Step{
		{ToolCalls: []sim.Call{{Name: "lookup", Arguments: map[string]any{"key": "x"}}}},
		{Final: "found it"},
	}}
	for _, backend := range []string{inference.BackendVLLM, inference.BackendChat} {
		t.Run(backend, func(t *testing.T) {
			c := e2eCase{backend: backend, simCfg: sim.Config{Scripts: []sim.Script{script}, SuccessProb: 1}, maxToks: 200, g: 2,
				loop: runner.LoopConfig{GraceTurn: true}, wantStop: agentloop.StopMaxTurns, maxTurns: 1}
			recs, _ := runE2E(t, c)
			for _, r := range recs {
				var msgs []openai.ChatCompletionMessage
				if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
					t.Fatal(err)
				}
				if len(msgs) != 5 || msgs[3].Role != "user" || msgs[3].Content != agentloop.GraceTurnText || msgs[4].Content != "found it" {
					t.Fatalf("messages %+v", msgs)
				}
				if !r.FinishedNaturally || r.Turns != 2 || len(r.LoopEvents) != 1 || r.LoopEvents[0].Detail != "grace_turn" || r.LoopEvents[0].Message != 3 {
					t.Fatalf("natural %v turns %d events %+v", r.FinishedNaturally, r.Turns, r.LoopEvents)
				}
				if r.Reward < 1 {
					t.Errorf("reward %v: the grace answer is scored", r.Reward)
				}
			}
		})
	}
}
