package responses_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	sdk "github.com/openai/openai-go/v3/responses"

	"github.com/rollout-rl/rollout/gateway/builtin"
	"github.com/rollout-rl/rollout/gateway/responses"
	"github.com/rollout-rl/rollout/internal/testkit/gatewaytest"
)

// TestCaptureSession drives the real capture core (tokens mode against
// the simulator) through this door with the official SDK, as a
// Codex-style harness does: stateless, store false, the previous output
// items sent back with the function call outputs. The session is one
// branch whose trained ids are exactly the sampled ones, every echo
// anchored.
func TestCaptureSession(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			cs := gatewaytest.StartCapture(t, builtin.FrontDoors(), gatewaytest.FixScript)
			cl := oai.NewClient(option.WithBaseURL(cs.URL+"/v1/"), option.WithAPIKey("none"), option.WithMaxRetries(0))
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
			cs.CheckLinear(t, responses.Name, stream, 3)
		})
	}
}
