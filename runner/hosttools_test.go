package runner

import (
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/tools"
	"github.com/rollout-rl/rollout/tools/web"
)

// A task without a sandbox may carry host-side tools, never built-ins.
func TestNeedsSandbox(t *testing.T) {
	set, err := tools.Default().Resolve([]string{"terminal"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := needsSandbox(set); err == nil || !strings.Contains(err.Error(), "acts on the sandbox, and this task has none") {
		t.Fatalf("terminal without a sandbox: %v", err)
	}
	p, err := web.New(web.Config{Provider: "corpus"}, []web.Doc{{URL: "u", Text: "t"}})
	if err != nil {
		t.Fatal(err)
	}
	reg := tools.NewRegistry()
	for _, tl := range web.Tools(p, 3) {
		if err := reg.Register(tl); err != nil {
			t.Fatal(err)
		}
	}
	set, err = reg.Resolve([]string{web.Toolset}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := needsSandbox(set); err != nil {
		t.Fatalf("web tools: %v", err)
	}
}
