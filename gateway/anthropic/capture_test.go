package anthropic_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/anthropic"
	"github.com/rollout-rl/rollout/gateway/builtin"
	"github.com/rollout-rl/rollout/gateway/capture"
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
// the simulator) through this door with the official SDK, as a Claude
// Code-style harness does: the previous reply sent back through the SDK's
// own ToParam (thinking with its signature, text, tool_use) followed by a
// user turn of tool_result blocks. The session is one branch whose
// trained ids are exactly the sampled ones, every echo anchored.
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
			cl := sdk.NewClient(option.WithBaseURL(hs.URL+"/s/"+s.ID()), option.WithAPIKey("none"), option.WithMaxRetries(0))
			var schema sdk.ToolInputSchemaParam
			if err := json.Unmarshal([]byte(`{"type":"object","properties":{"command":{"type":"string"},"workdir":{"type":"string"}},"required":["command"]}`), &schema); err != nil {
				t.Fatal(err)
			}
			tools := []sdk.ToolUnionParam{{OfTool: &sdk.ToolParam{Name: "terminal", Description: sdk.String("Run a shell command"), InputSchema: schema}}}
			msgs := []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock("Please fix the bug in a.txt"))}
			var calls []int
			for turn := 0; turn < 3; turn++ {
				params := sdk.MessageNewParams{Model: "rollout-sim", MaxTokens: 400, Messages: msgs, Tools: tools,
					System: []sdk.TextBlockParam{{Text: "You are a terminal agent."}}}
				var m sdk.Message
				if stream {
					st := cl.Messages.NewStreaming(context.Background(), params)
					for st.Next() {
						if err := m.Accumulate(st.Current()); err != nil {
							t.Fatal(err)
						}
					}
					if err := st.Err(); err != nil {
						t.Fatalf("turn %d: %v", turn, err)
					}
					st.Close()
				} else {
					resp, err := cl.Messages.New(context.Background(), params)
					if err != nil {
						t.Fatalf("turn %d: %v", turn, err)
					}
					m = *resp
				}
				msgs = append(msgs, m.ToParam())
				var results []sdk.ContentBlockParamUnion
				for _, b := range m.Content {
					if b.Type == "tool_use" {
						results = append(results, sdk.NewToolResultBlock(b.ID, "ok "+string(b.Input), false))
					}
				}
				calls = append(calls, len(results))
				if len(results) > 0 {
					msgs = append(msgs, sdk.NewUserMessage(results...))
				}
				if turn == 0 && (m.Content[0].Type != "thinking" || m.StopReason != "tool_use") {
					t.Fatalf("first reply %+v", m)
				}
			}
			if !slices.Equal(calls, []int{1, 1, 0}) {
				t.Fatalf("tool calls per turn %v, want [1 1 0]", calls)
			}
			rec, err := s.Close(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(rec.Branches) != 1 || !slices.Equal(rec.Branches[0].Calls, []int{0, 1, 2}) || rec.Unanchored != 0 || rec.Rewritten != 0 {
				t.Fatalf("record: %d branches, calls %+v, unanchored %d, rewritten %d", len(rec.Branches), rec.Calls, rec.Unanchored, rec.Rewritten)
			}
			for _, c := range rec.Calls {
				if c.Status != gateway.CallOK || c.API != anthropic.Name || c.Stream != stream {
					t.Errorf("call %+v", c)
				}
			}
			seq := rec.Branches[0].Sequence
			gens := srv.Generations()
			if len(gens) != 3 || len(seq.TurnStarts) != 3 {
				t.Fatalf("%d generations, %d turns", len(gens), len(seq.TurnStarts))
			}
			for k, st := range seq.TurnStarts {
				for i, id := range gens[k].IDs {
					if int(seq.Tokens[st+i]) != id || seq.Mask[st+i] != 1 {
						t.Fatalf("turn %d: trained id %d differs from the sampled one", k, i)
					}
				}
			}
		})
	}
}
