package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `rollout gateway` refuses flags it cannot start with, with exit 2 and a
// message naming them, before it reads the engine: TLS halves, a client CA
// without TLS, an unreadable tenants file, and no token off loopback.
func TestGatewayFlagErrors(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfg, []byte("inference: {backend: vllm, endpoints: [\"http://127.0.0.1:1\"]}\nparser: hermes\noutput: {dir: "+filepath.Join(dir, "out")+"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badTenants := filepath.Join(dir, "tenants.yaml")
	if err := os.WriteFile(badTenants, []byte("tenants: [{name: \"no spaces allowed\", token_sha256: \"x\"}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", "c.pem"}, "--tls-cert and --tls-key"},
		{[]string{"--tls-client-ca", "ca.pem"}, "--tls-client-ca needs --tls-cert"},
		{[]string{"--tenants-file", badTenants}, "tenant"},
		{[]string{"--tenants-file", filepath.Join(dir, "missing.yaml")}, "missing.yaml"},
		{[]string{"--listen", "0.0.0.0:0"}, "without an auth token"},
	} {
		_, msg, code := runRolloutCmd(t, append([]string{"gateway", "-c", cfg}, c.args...)...)
		if code != 2 || !strings.Contains(msg, c.want) {
			t.Errorf("%v: exit %d, %q; want exit 2 naming %q", c.args, code, msg, c.want)
		}
	}
}
