package responses_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	sdk "github.com/openai/openai-go/v3/responses"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/builtin"
	"github.com/rollout-rl/rollout/gateway/capture"
	"github.com/rollout-rl/rollout/gateway/responses"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/simtest"
)

var fixScript = sim.Script{Match: "fix the bug", Steps: []sim.Step{
	{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls"}}}},
	{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"workdir": "/src", "command": "cat a.txt"}}}},
	{Final: "Done: the bug is fixed."},
}}

// TestCaptureSession drives the real capture core (tokens mode against
// the simulator) through this door with the official SDK, as a
// Codex-style harness does: stateless, store false, the previous output
// items sent back with the function call outputs. The session is one
// branch whose trained ids are exactly the sampled ones, every echo
// anchored.
func TestCaptureSession(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			srv := simtest.Start(t, sim.Config{Family: "hermes", Scripts: []sim.Script{fixScript}, Reasoning: true, RecordGenerations: true})
			pol, err := inference.New(inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, Retries: -1, ReadyTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pol.(interface{ Close() error }).Close() })
			temp := 0.6
			opts := capture.Options{Parser: "hermes", ReasoningParser: "qwen3", Doors: builtin.FrontDoors()}
			opts.Sampling.Temperature, opts.Sampling.MaxTokens = &temp, 512
			gw, err := capture.New(pol, opts)
			if err != nil {
				t.Fatal(err)
			}
			hs := httptest.NewServer(capture.Handler(gw, builtin.FrontDoors()))
			t.Cleanup(hs.Close)
			s, err := gw.Open(context.Background(), inference.EpisodeSpec{ID: "r1"})
			if err != nil {
				t.Fatal(err)
			}
			cl := oai.NewClient(option.WithBaseURL(hs.URL+"/s/"+s.ID()+"/v1/"), option.WithAPIKey("none"), option.WithMaxRetries(0))
			tools := json.RawMessage(`[{"type":"function","name":"terminal","description":"Run a shell command","strict":false,"parameters":{"type":"object","properties":{"command":{"type":"string"},"workdir":{"type":"string"}},"required":["command"]}}]`)
			input := []any{map[string]any{"role": "user", "content": "Please fix the bug in a.txt"}}
			var statuses []int
			for turn := 0; turn < 3; turn++ {
				body, _ := json.Marshal(map[string]any{
					"model": "rollout-sim", "instructions": "You are a coding agent.", "input": input, "tools": tools,
					"tool_choice": "auto", "parallel_tool_calls": true, "store": false, "stream": stream,
					"include": []string{"reasoning.encrypted_content"}, "reasoning": map[string]any{"effort": "medium"},
				})
				var out []sdk.ResponseOutputItemUnion
				if stream {
					st := cl.Responses.NewStreaming(context.Background(), sdk.ResponseNewParams{}, option.WithRequestBody("application/json", body))
					for st.Next() {
						if ev := st.Current(); ev.Type == "response.completed" {
							out = ev.Response.Output
						}
					}
					if err := st.Err(); err != nil {
						t.Fatalf("turn %d: %v", turn, err)
					}
					st.Close()
				} else {
					resp, err := cl.Responses.New(context.Background(), sdk.ResponseNewParams{}, option.WithRequestBody("application/json", body))
					if err != nil {
						t.Fatalf("turn %d: %v", turn, err)
					}
					out = resp.Output
				}
				calls := 0
				for _, it := range out {
					input = append(input, json.RawMessage(it.RawJSON()))
					if it.Type == "function_call" {
						fc := it.AsFunctionCall()
						input = append(input, map[string]any{"type": "function_call_output", "call_id": fc.CallID, "output": "ok " + fc.Arguments})
						calls++
					}
				}
				statuses = append(statuses, calls)
			}
			if !slices.Equal(statuses, []int{1, 1, 0}) {
				t.Fatalf("function calls per turn %v, want [1 1 0]", statuses)
			}
			rec, err := s.Close(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(rec.Branches) != 1 || !slices.Equal(rec.Branches[0].Calls, []int{0, 1, 2}) || rec.Unanchored != 0 || rec.Rewritten != 0 {
				t.Fatalf("record: %d branches, calls %+v, unanchored %d, rewritten %d", len(rec.Branches), rec.Calls, rec.Unanchored, rec.Rewritten)
			}
			for _, c := range rec.Calls {
				if c.Status != gateway.CallOK || c.API != responses.Name || c.Stream != stream {
					t.Errorf("call %+v", c)
				}
			}
			seq := rec.Branches[0].Sequence
			gens := srv.Generations()
			if len(gens) != 3 || len(seq.TurnStarts) != 3 {
				t.Fatalf("%d generations, %d turns", len(gens), len(seq.TurnStarts))
			}
			for k, st := range seq.TurnStarts {
				ids := gens[k].IDs
				for i, id := range ids {
					if int(seq.Tokens[st+i]) != id || seq.Mask[st+i] != 1 {
						t.Fatalf("turn %d: trained id %d differs from the sampled one", k, i)
					}
				}
			}
		})
	}
}
