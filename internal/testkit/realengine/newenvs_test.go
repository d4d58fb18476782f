package realengine

import (
	"context"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/internal/testkit/mcptest"
	"github.com/rollout-rl/rollout/trajectory"
)

// TestWebResearchAndMCPTokens runs the web-research env (host-side
// web_search/web_extract over the embedded corpus, no sandbox) with an
// HTTP MCP server's tools added by the run config, against the real
// llama.cpp engine in tokens mode: whatever the biased tiny model writes,
// every rollout must be ok (never infrastructure) and its trained tokens
// must re-score against the server.
func TestWebResearchAndMCPTokens(t *testing.T) {
	e := startEngine(t)
	url := mcptest.ServeHTTP(t, mcptest.Binary(t))
	c := collection{backend: "llamacpp", groups: 2, groupSize: 4, maxTokens: 64, maxTurns: 3,
		onTruncation: "tool_error", bias: collectionBias(t, e), inFlight: slots,
		env: "web-research", envConfig: map[string]any{"max_turns": 3},
		extra: map[string]any{"mcp_servers": []map[string]any{{"name": "calc", "url": url, "tools": []string{"add"}}}}}
	dir, retried := c.run(t, suiteCtx(t), e)
	s := check(t, e, dir, true, 8)
	t.Logf("web-research + mcp, tokens mode: %s\n  retried: %v", s, retried)
	if s.rollouts != c.groups*c.groupSize || s.infra != 0 || len(retried) != 0 {
		t.Errorf("rollouts %d, infra %d (%v), retried %v", s.rollouts, s.infra, s.byFailure, retried)
	}
	run, err := trajectory.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		for _, name := range []string{`"web_search"`, `"web_extract"`, `"mcp_calc_add"`} {
			if !strings.Contains(r.Tools, name) {
				t.Errorf("rollout %s/%d: %s not offered: %s", r.GroupID, r.RolloutIndex, name, r.Tools)
			}
		}
	}
}
