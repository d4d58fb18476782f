package netpolicy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

func TestAllowAddr(t *testing.T) {
	p, err := New([]string{"10.1.0.0/16", "192.168.7.7", "llm.internal", "*.corp.example"}, "--allow-net")
	if err != nil {
		t.Fatal(err)
	}
	for a, want := range map[string]bool{
		"8.8.8.8": true, "2606:4700::1111": true,
		"127.0.0.1": false, "::1": false, "10.0.0.1": false, "172.16.0.1": false, "192.168.7.8": false,
		"169.254.169.254": false, "fe80::1": false, "0.0.0.0": false, "100.64.0.1": false, "::ffff:127.0.0.1": false,
		"10.1.2.3": true, "192.168.7.7": true, "::ffff:10.1.0.9": true,
	} {
		if got := p.AllowAddr(netip.MustParseAddr(a)); got != want {
			t.Errorf("AllowAddr(%s) = %v, want %v", a, got, want)
		}
	}
	for h, want := range map[string]bool{"llm.internal": true, "LLM.internal.": true, "a.corp.example": true, "corp.example": false, "x.llm.internal": false} {
		if got := p.allowHost(h); got != want {
			t.Errorf("allowHost(%s) = %v, want %v", h, got, want)
		}
	}
	for _, bad := range []string{"", "10.0.0.0/33", "a b", "http://x"} {
		if _, err := New([]string{bad}, "--allow-net"); err == nil {
			t.Errorf("New(%q): no error", bad)
		}
	}
}

func TestCheckURL(t *testing.T) {
	ctx := context.Background()
	p, _ := New(nil, "--allow-net")
	for _, u := range []string{"http://127.0.0.1:8000/v1", "http://[::1]/", "http://169.254.169.254/latest", "http://localhost:9/"} {
		err := p.CheckURL(ctx, "mcp_servers[0].url", u)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "mcp_servers[0].url") || !strings.Contains(err.Error(), "--allow-net") {
			t.Errorf("CheckURL(%s) = %v, want a refusal naming the key and the flag", u, err)
		}
	}
	if err := p.CheckURL(ctx, "url", "http://93.184.215.14/"); err != nil {
		t.Errorf("public address: %v", err)
	}
	if err := p.CheckURL(ctx, "url", "not a url"); err == nil || errors.Is(err, ErrRefused) {
		t.Errorf("malformed URL: %v", err)
	}
	allow, _ := New([]string{"127.0.0.0/8", "::1"}, "--allow-net")
	if err := allow.CheckURL(ctx, "url", "http://localhost:9/"); err != nil {
		t.Errorf("allowed loopback: %v", err)
	}
}

// A name the URL check never saw (or that resolves differently later) is
// checked again at dial time, address by address: localhost resolves to
// loopback, which the policy refuses unless allowed by address or name.
func TestDialerRefusesAtDialTime(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	client := &http.Client{Transport: &http.Transport{DialContext: Dialer(&net.Dialer{}), DisableKeepAlives: true}}
	get := func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://localhost:"+port+"/", nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(context.Background()); err != nil {
		t.Fatalf("no policy in the context: %v", err)
	}
	refuse, _ := New(nil, "--allow-net")
	if err := get(With(context.Background(), refuse)); !errors.Is(err, ErrRefused) {
		t.Fatalf("localhost under a policy refusing loopback: %v, want ErrRefused", err)
	}
	byAddr, _ := New([]string{"127.0.0.0/8", "::1/128"}, "--allow-net")
	if err := get(With(context.Background(), byAddr)); err != nil {
		t.Fatalf("loopback allowed by prefix: %v", err)
	}
	byName, _ := New([]string{"localhost"}, "--allow-net")
	if err := get(With(context.Background(), byName)); err != nil {
		t.Fatalf("localhost allowed by name: %v", err)
	}
}
