package runner

import (
	"strings"
	"testing"
	"time"
)

// sandbox.backend and its typed kubernetes block are decoded strictly and
// validated with a message naming the field.
func TestSandboxBackendConfig(t *testing.T) {
	base := "env: terminal-tasks\ninference: {endpoints: [http://127.0.0.1:8000]}\n"
	cfg, err := ParseConfig([]byte(base + `sandbox:
  backend: kubernetes
  kubernetes:
    kubeconfig: /tmp/kc
    namespace: sandboxes
    image_pull_policy: Never
    start_timeout: 90s
    tolerations: [{key: pool, operator: Exists, effect: NoSchedule}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	k := cfg.Sandbox.Kubernetes
	if k == nil || k.Namespace != "sandboxes" || k.StartTimeout != 90*time.Second || len(k.Tolerations) != 1 {
		t.Fatalf("decoded %+v", k)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"sandbox: {backend: k8s}\n", "sandbox.backend"},
		{"sandbox: {kubernetes: {namespace: x}}\n", "sandbox.kubernetes"},
		{"sandbox: {backend: kubernetes, kubernetes: {mode: crd}}\n", "sandbox.kubernetes.mode"},
		{"sandbox: {backend: kubernetes, kubernetes: {agent_sandbox: {warm_pool: 4}}}\n", "needs mode \"agent-sandbox\""},
		{"sandbox: {backend: kubernetes, kubernetes: {mode: agent-sandbox, agent_sandbox: {warm_pool: -1}}}\n", "warm_pool -1: negative"},
		{"sandbox: {backend: kubernetes, kubernetes: {image_pull_policy: Sometimes}}\n", "image_pull_policy"},
	} {
		c, err := ParseConfig([]byte(base + tc.yaml))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.yaml, err, tc.want)
		}
	}
	c, err := ParseConfig([]byte(base + "sandbox: {backend: kubernetes, kubernetes: {mode: agent-sandbox, agent_sandbox: {warm_pool: 8}}}\n"))
	if err == nil {
		err = c.Validate()
	}
	if err != nil || c.Sandbox.Kubernetes.AgentSandbox.WarmPool != 8 {
		t.Fatalf("mode agent-sandbox with a warm pool: %v", err)
	}
	if _, err := ParseConfig([]byte(base + "sandbox: {backend: kubernetes, kubernetes: {agent_sandbox: {warm: 1}}}\n")); err == nil {
		t.Error("unknown key in sandbox.kubernetes.agent_sandbox accepted")
	}
	if _, err := ParseConfig([]byte(base + "sandbox: {backend: kubernetes, kubernetes: {namespce: x}}\n")); err == nil {
		t.Error("unknown key in sandbox.kubernetes accepted")
	}
}
