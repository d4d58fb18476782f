package inference_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

func healthClient(t *testing.T, cfg inference.Config) *inference.Client {
	t.Helper()
	if cfg.Backend == "" {
		cfg.Backend = inference.BackendVLLM
	}
	c, err := inference.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// deadURL is a loopback address nothing listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

func TestReadyNamesDeadEndpoints(t *testing.T) {
	up := startSim(t, sim.Config{})
	dead := "http://127.0.0.1:1"
	c := healthClient(t, inference.Config{Endpoints: []string{up.URL, dead}, ReadyTimeout: 300 * time.Millisecond})
	err := c.Ready(context.Background(), 0)
	if !errors.Is(err, inference.ErrUnreachable) {
		t.Fatalf("Ready with a dead endpoint: %v, want ErrUnreachable", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, dead) || strings.Contains(msg, up.URL) || !strings.Contains(msg, "ready_timeout") {
		t.Errorf("the error should name the dead endpoint only and the knob: %v", err)
	}
}

func TestReadyChecksTheModel(t *testing.T) {
	a := startSim(t, sim.Config{Model: "model-a"})
	b := startSim(t, sim.Config{Model: "model-b"})
	c := healthClient(t, inference.Config{Endpoints: []string{a.URL}, Model: "model-b"})
	err := c.Ready(context.Background(), 0)
	if !errors.Is(err, inference.ErrModelNotServed) || !strings.Contains(err.Error(), "model-b") || !strings.Contains(err.Error(), "model-a") {
		t.Errorf("wrong model: %v", err)
	}
	// No model configured: the endpoints must agree on one.
	c = healthClient(t, inference.Config{Endpoints: []string{a.URL, b.URL}})
	err = c.Ready(context.Background(), 0)
	if !errors.Is(err, inference.ErrModelNotServed) || !strings.Contains(err.Error(), b.URL) {
		t.Errorf("endpoints serving different models: %v", err)
	}
	c = healthClient(t, inference.Config{Endpoints: []string{a.URL}, Model: "model-a"})
	if err := c.Ready(context.Background(), 0); err != nil {
		t.Errorf("a served model: %v", err)
	}
}

func TestReadyRefusedKeyIsNotRetried(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"invalid api key"}}`, http.StatusUnauthorized)
	}))
	defer srv.Close()
	c := healthClient(t, inference.Config{Endpoints: []string{srv.URL}, ReadyTimeout: time.Hour})
	err := c.Ready(context.Background(), 0)
	if !errors.Is(err, inference.ErrEndpointRefused) || !strings.Contains(err.Error(), "api_key") {
		t.Errorf("401: %v", err)
	}
}

func TestReadyWithoutModelsRoute(t *testing.T) {
	// A server with /health but no /v1/models (the Atropos custom server)
	// is up; its model cannot be checked.
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := healthClient(t, inference.Config{Endpoints: []string{srv.URL}, Model: "m"})
	if err := c.Ready(context.Background(), 0); err != nil {
		t.Errorf("a server without /v1/models: %v", err)
	}
}

func TestReadyWaitsForALateServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	h, err := sim.NewHandler(sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan *http.Server, 1)
	go func() {
		time.Sleep(700 * time.Millisecond)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			started <- nil
			return
		}
		hs := &http.Server{Handler: h}
		started <- hs
		_ = hs.Serve(ln)
	}()
	c := healthClient(t, inference.Config{Endpoints: []string{"http://" + addr}, ReadyTimeout: time.Minute})
	err = c.Ready(context.Background(), 0)
	if hs := <-started; hs != nil {
		defer hs.Close()
	} else {
		t.Skip("the port was taken meanwhile")
	}
	if err != nil {
		t.Errorf("a server that comes up within ready_timeout: %v", err)
	}
}

func TestReadyStopsWithContext(t *testing.T) {
	c := healthClient(t, inference.Config{Endpoints: []string{deadURL(t)}, ReadyTimeout: time.Hour})
	ctx, cancel := context.WithCancelCause(context.Background())
	why := errors.New("the job was cancelled")
	go func() { time.Sleep(200 * time.Millisecond); cancel(why) }()
	if err := c.Ready(ctx, 0); !errors.Is(err, why) {
		t.Errorf("Ready after cancel: %v", err)
	}
}

func TestWatchFailsWhenEveryEndpointIsGone(t *testing.T) {
	a := startSim(t, sim.Config{})
	b := startSim(t, sim.Config{})
	c := healthClient(t, inference.Config{Endpoints: []string{a.URL, b.URL}, UnreachableTimeout: 300 * time.Millisecond})
	if err := c.Ready(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- c.Watch(ctx, inference.WatchOptions{Interval: 50 * time.Millisecond}) }()
	// One endpoint down: the run goes on.
	a.Close()
	select {
	case err := <-res:
		t.Fatalf("Watch ended with one endpoint up: %v", err)
	case <-time.After(time.Second):
	}
	b.Close()
	err := <-res
	if !errors.Is(err, inference.ErrUnreachable) || !strings.Contains(err.Error(), a.URL) || !strings.Contains(err.Error(), b.URL) {
		t.Errorf("Watch with every endpoint gone: %v", err)
	}
}

func TestWatchStoppingShortensTheWait(t *testing.T) {
	c := healthClient(t, inference.Config{Endpoints: []string{deadURL(t)}, UnreachableTimeout: time.Hour})
	stopping := make(chan struct{})
	close(stopping)
	err := c.Watch(context.Background(), inference.WatchOptions{Interval: 50 * time.Millisecond, Stopping: stopping, StoppingAfter: 100 * time.Millisecond})
	if !errors.Is(err, inference.ErrUnreachable) {
		t.Errorf("Watch of a stopping run: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Watch(ctx, inference.WatchOptions{}); err != nil {
		t.Errorf("Watch after its context ended: %v", err)
	}
}
