package imageref

import (
	"strings"
	"testing"
)

func TestInRegistry(t *testing.T) {
	for _, tc := range []struct{ reg, ref, want string }{
		{"127.0.0.1:5000", "rollout-sandbox:busybox", "127.0.0.1:5000/rollout-sandbox:busybox"},
		{"reg.example/", "team/img:1", "reg.example/team/img:1"},
		{"reg.example", "ghcr.io/x/y:1", "ghcr.io/x/y:1"},
		{"reg.example", "localhost/x:1", "localhost/x:1"},
		{"", "a:1", "a:1"},
	} {
		if got := InRegistry(tc.reg, tc.ref); got != tc.want {
			t.Errorf("InRegistry(%q, %q) = %q, want %q", tc.reg, tc.ref, got, tc.want)
		}
	}
}

func TestCheckRegistry(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:5000", "reg.example", "localhost:5000", "[::1]:5000"} {
		if err := CheckRegistry(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"":                     "empty",
		"http://reg.example":   "without a scheme",
		"reg.example/team":     "without a scheme or path",
		"reg.example:notaport": "reg.example:notaport",
	} {
		if err := CheckRegistry(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error containing %q", bad, err, want)
		}
	}
}
