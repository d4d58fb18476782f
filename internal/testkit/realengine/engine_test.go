package realengine

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
)

// serverErrors counts the errors the server logged, by message: the
// "got exception" lines of llama-server's log.
func serverErrors(e *llamacpptest.Engine) map[string]int {
	out := map[string]int{}
	re := regexp.MustCompile(`"message":"([^"]*)"`)
	for _, line := range strings.Split(e.LogTail(1_000_000), "\n") {
		if !strings.Contains(line, "got exception") {
			continue
		}
		msg := line
		if m := re.FindStringSubmatch(line); m != nil {
			msg = m[1]
		}
		out[msg]++
	}
	return out
}

func detokenize(t *testing.T, e *llamacpptest.Engine, ids []int32) string {
	t.Helper()
	var r struct {
		Content string `json:"content"`
	}
	e.MustCall(t, "/detokenize", map[string]any{"tokens": ids}, &r)
	return r.Content
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("marshal: %v", err))
	}
	return string(b)
}
