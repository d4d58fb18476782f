package capture

import (
	"encoding/json"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/gateway"
)

// The tool cache answers what toolKeys answers, keyed by the raw bytes and
// the API: other bytes or another door's shape are parsed afresh.
func TestToolCacheKeys(t *testing.T) {
	tools := func(name string) []openai.Tool {
		return []openai.Tool{{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{Name: name,
			Parameters: json.RawMessage(`{"type":"object","properties":{"cmd":{"type":"string"}}}`)}}}
	}
	raw := func(name string) []byte { b, _ := json.Marshal(tools(name)); return b }
	var c toolCache
	want, wantSchemas, err := toolKeys(tools("shell"))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		key, schemas, err := c.keys(gateway.Call{API: "openai-chat", Tools: tools("shell"), ToolsRaw: raw("shell")})
		if err != nil || key != want || len(schemas) != len(wantSchemas) || schemas[0].Name != "shell" {
			t.Fatalf("keys = %q %v %v, want %q", key, schemas, err, want)
		}
	}
	if c.n != 1 {
		t.Fatalf("cache holds %d entries, want 1", c.n)
	}
	key, schemas, err := c.keys(gateway.Call{API: "openai-chat", Tools: tools("edit"), ToolsRaw: raw("edit")})
	if err != nil || key == want || schemas[0].Name != "edit" {
		t.Fatalf("other tools: keys = %q %v %v", key, schemas, err)
	}
	// The same bytes under another API are another entry (its shape may
	// differ from OpenAI's).
	if _, _, err := c.keys(gateway.Call{API: "anthropic", Tools: tools("shell"), ToolsRaw: raw("shell")}); err != nil || c.n != 3 {
		t.Fatalf("another API: %v, %d entries", err, c.n)
	}
	// Without raw bytes nothing is cached.
	if k, _, err := c.keys(gateway.Call{API: "openai-chat", Tools: tools("x")}); err != nil || k == "" || c.n != 3 {
		t.Fatalf("no raw: %q %v, %d entries", k, err, c.n)
	}
	// A full cache starts over instead of growing.
	for i := range toolCacheSize + 5 {
		n := "t" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if _, _, err := c.keys(gateway.Call{API: "openai-chat", Tools: tools(n), ToolsRaw: raw(n)}); err != nil {
			t.Fatal(err)
		}
	}
	if c.n > toolCacheSize {
		t.Fatalf("cache grew to %d entries, bound %d", c.n, toolCacheSize)
	}
	// A hit allocates nothing (the lookup copies no bytes).
	call := gateway.Call{API: "openai-chat", Tools: tools("hit"), ToolsRaw: raw("hit")}
	if _, _, err := c.keys(call); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _, _ = c.keys(call) }); n != 0 {
		t.Fatalf("a cache hit allocates %v times", n)
	}
}
