package assemble_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/sandbox/host"
)

// proxyUnix forwards every connection on listener ln to the unix socket
// at target, byte for byte (hijacked attach streams included), until ln
// is closed; then it closes the connections still open.
func proxyUnix(ln net.Listener, target string) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	defer func() {
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("unix", target)
		if err != nil {
			_ = c.Close()
			continue
		}
		mu.Lock()
		conns = append(conns, c, up)
		mu.Unlock()
		wg.Go(func() {
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
			go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
			<-done
			_ = c.Close()
			_ = up.Close()
			<-done
		})
	}
}

// The server's shared Docker backend whose engine was unreachable for the
// first sandbox starts once the engine answers: a failed start is not kept
// until the server restarts.
func TestSharedBackendRetriesAFailedStart(t *testing.T) {
	ref, _ := needDocker(t)
	real, ok := strings.CutPrefix(dockerclient.Host(), "unix://")
	if !ok {
		t.Skipf("the engine is at %s, not on a unix socket", dockerclient.Host())
	}
	if real == "" {
		real = strings.TrimPrefix(client.DefaultDockerHost, "unix://")
	}
	sock := filepath.Join(t.TempDir(), "docker.sock")
	t.Setenv("DOCKER_HOST", "unix://"+sock)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := assemble.NewShared(docker.Options{Options: host.Options{Logger: slog.New(slog.DiscardHandler), Instance: "startretry", ReapInterval: -1}}, 0)
	defer func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	if _, err := s.Create(ctx, sandbox.Spec{Image: ref}); !errors.Is(err, dockerclient.ErrUnreachable) {
		t.Fatalf("create with no engine at %s: %v, want %v", sock, err, dockerclient.ErrUnreachable)
	}

	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	proxied := make(chan struct{})
	go func() { proxyUnix(ln, real); close(proxied) }()
	defer func() { _ = ln.Close(); <-proxied }()

	t0 := time.Now()
	var sb sandbox.Sandbox
	for sb == nil {
		sb, err = s.Create(ctx, sandbox.Spec{Image: ref})
		if err != nil {
			// The failed start is retried after 5 s (startGate).
			if !errors.Is(err, dockerclient.ErrUnreachable) || time.Since(t0) > 20*time.Second {
				t.Fatalf("create once the engine answers, after %v: %v", time.Since(t0).Round(time.Second), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	t.Logf("started after %v", time.Since(t0))
	r, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"echo", "up"}})
	if err != nil || r.ExitCode != 0 || strings.TrimSpace(string(r.Stdout)) != "up" {
		t.Fatalf("exec in the sandbox: %+v, %v", r, err)
	}
	t.Logf("exec after %v", time.Since(t0))
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("closed after %v", time.Since(t0))
}
