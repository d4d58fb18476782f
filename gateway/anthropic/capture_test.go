package anthropic_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/rollout-rl/rollout/gateway/anthropic"
	"github.com/rollout-rl/rollout/gateway/builtin"
	"github.com/rollout-rl/rollout/internal/testkit/gatewaytest"
)

// TestCaptureSession drives the real capture core (tokens mode against
// the simulator) through this door with the official SDK, as a Claude
// Code-style harness does: the previous reply sent back through the SDK's
// own ToParam (thinking with its signature, text, tool_use) followed by a
// user turn of tool_result blocks. The session is one branch whose
// trained ids are exactly the sampled ones, every echo anchored.
func TestCaptureSession(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			cs := gatewaytest.StartCapture(t, builtin.FrontDoors(), gatewaytest.FixScript)
			cl := sdk.NewClient(option.WithBaseURL(cs.URL), option.WithAPIKey("none"), option.WithMaxRetries(0))
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
			cs.CheckLinear(t, anthropic.Name, stream, 3)
		})
	}
}
