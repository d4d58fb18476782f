package sandboxtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/sandbox"
)

// TunnelSuite checks a backend's tunnel (sandbox.Tunneler): a process in a
// sandbox without network reaches an HTTP server on the host through
// 127.0.0.1:PORT inside the sandbox. newSandbox makes a sandbox of Image
// (busybox: wget, nc) with network "none", closed when the test ends.
func TunnelSuite(t *testing.T, newSandbox func(t *testing.T) sandbox.Sandbox) {
	tunnelSuite(t, newSandbox, true)
}

// TunnelSuitePods is TunnelSuite for sandboxes whose network "none" still
// has an interface (the Kubernetes lab's bridge CNI: docs/kubernetes.md);
// it does not check that only lo exists.
func TunnelSuitePods(t *testing.T, newSandbox func(t *testing.T) sandbox.Sandbox) {
	tunnelSuite(t, newSandbox, false)
}

func tunnelSuite(t *testing.T, newSandbox func(t *testing.T) sandbox.Sandbox, onlyLo bool) {
	t.Run("http", func(t *testing.T) { tunnelHTTP(t, newSandbox(t), onlyLo) })
	t.Run("large bodies both ways", func(t *testing.T) { tunnelLarge(t, newSandbox(t)) })
	t.Run("parallel connections", func(t *testing.T) { tunnelParallel(t, newSandbox(t)) })
	t.Run("loopback only", func(t *testing.T) { tunnelLoopbackOnly(t, newSandbox(t)) })
	t.Run("listener close ends connections", func(t *testing.T) { tunnelListenerClose(t, newSandbox(t)) })
	t.Run("sandbox closed mid-connection", func(t *testing.T) { tunnelSandboxClosed(t, newSandbox(t)) })
	t.Run("context ends the listener", func(t *testing.T) { tunnelContext(t, newSandbox(t)) })
	t.Run("dial a server in the sandbox", func(t *testing.T) { tunnelDial(t, newSandbox(t)) })
}

// tunnelDial: the host connects to a server listening on the sandbox's
// loopback (busybox nc as an echo server) through sandbox.Dial; a port
// nobody listens on is refused as a failed operation, not a broken
// sandbox.
func tunnelDial(t *testing.T, sb sandbox.Sandbox) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := sandbox.Dial(ctx, sb, 9124); !errors.Is(err, sandbox.ErrFailed) {
		t.Fatalf("dial a closed port: %v, want ErrFailed", err)
	}
	if _, err := sb.Start(ctx, sandbox.ExecRequest{Command: "nc -ll -p 9123 -e cat"}); err != nil {
		t.Fatal(err)
	}
	var c net.Conn
	for {
		var err error
		if c, err = sandbox.Dial(ctx, sb, 9123); err == nil {
			break
		}
		if !errors.Is(err, sandbox.ErrFailed) || ctx.Err() != nil {
			t.Fatalf("dial the echo server: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // nc not listening yet
	}
	payload := strings.Repeat("tunnel dial ", 100_000)
	go func() {
		_, _ = io.WriteString(c, payload)
		_ = c.(interface{ CloseWrite() error }).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read the echo: %v", err)
	}
	if string(got) != payload {
		t.Fatalf("echo: %d bytes back of %d", len(got), len(payload))
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// serve serves h on a tunnel listener of sb until the test ends.
func serve(t *testing.T, sb sandbox.Sandbox, h http.Handler) (port int, ln net.Listener) {
	t.Helper()
	ln, err := sandbox.Listen(context.Background(), sb, 0)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	port, _ = strconv.Atoi(p)
	if port <= 0 {
		t.Fatalf("listener address %q", ln.Addr())
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = srv.Close()
		<-done
	})
	return port, ln
}

func run(t *testing.T, sb sandbox.Sandbox, cmd string) sandbox.ExecResult {
	t.Helper()
	r, err := sb.Exec(context.Background(), sandbox.ExecRequest{Command: cmd, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return r
}

func tunnelHTTP(t *testing.T, sb sandbox.Sandbox, onlyLo bool) {
	port, _ := serve(t, sb, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the host: %s %s", r.Method, r.URL.Path)
	}))
	r := run(t, sb, fmt.Sprintf("wget -q -O - http://127.0.0.1:%d/a/b", port))
	if r.ExitCode != 0 || string(r.Stdout) != "hello from the host: GET /a/b" {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	if !onlyLo {
		return
	}
	// The sandbox's network is still none: nothing but lo.
	r = run(t, sb, "ls /sys/class/net")
	if strings.TrimSpace(string(r.Stdout)) != "lo" {
		t.Fatalf("interfaces in the sandbox: %q", r.Stdout)
	}
}

func tunnelLarge(t *testing.T, sb sandbox.Sandbox) {
	const size = 8 << 20
	// Up: text (busybox wget's --post-file stops at a NUL byte); down:
	// any bytes.
	raw := make([]byte, size/2)
	_, _ = rand.Read(raw)
	up := []byte(hex.EncodeToString(raw))
	down := make([]byte, size)
	_, _ = rand.Read(down)
	var got []byte
	var mu sync.Mutex
	port, _ := serve(t, sb, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		mu.Lock()
		got = b
		mu.Unlock()
		_, _ = w.Write(down)
	}))
	if err := sb.WriteFile(context.Background(), "/tmp/in", up, 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, sb, fmt.Sprintf("wget -q -O /tmp/out --post-file /tmp/in http://127.0.0.1:%d/echo && sha256sum /tmp/out", port))
	if r.ExitCode != 0 {
		t.Fatalf("exit %d: %s", r.ExitCode, r.Stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	if !bytes.Equal(got, up) {
		t.Fatalf("the host received %d bytes, not the %d the sandbox sent (or they differ)", len(got), len(up))
	}
	sum := sha256.Sum256(down)
	if f := strings.Fields(string(r.Stdout)); len(f) == 0 || f[0] != hex.EncodeToString(sum[:]) {
		t.Fatalf("the sandbox received other bytes: %q", r.Stdout)
	}
}

func tunnelParallel(t *testing.T, sb sandbox.Sandbox) {
	const n = 32
	var mu sync.Mutex
	seen := map[string]int{}
	port, _ := serve(t, sb, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path]++
		mu.Unlock()
		// Large enough to interleave with the others.
		_, _ = w.Write(bytes.Repeat([]byte(r.URL.Path+"\n"), 20000))
	}))
	cmd := fmt.Sprintf(`for i in $(seq 1 %d); do wget -q -O /tmp/p$i http://127.0.0.1:%d/n$i & done; wait
for i in $(seq 1 %d); do n=$(grep -c "^/n$i\$" /tmp/p$i); [ "$n" = 20000 ] || echo "bad $i $n"; done; echo checked`, n, port, n)
	r := run(t, sb, cmd)
	if r.ExitCode != 0 || strings.TrimSpace(string(r.Stdout)) != "checked" {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Fatalf("the host served %d distinct paths, want %d", len(seen), n)
	}
}

func tunnelLoopbackOnly(t *testing.T, sb sandbox.Sandbox) {
	port, _ := serve(t, sb, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	// Bound to 127.0.0.1 only: another loopback address of the sandbox
	// finds no listener.
	r := run(t, sb, fmt.Sprintf("wget -q -T 5 -O - http://127.0.0.2:%d/ ; echo exit=$?", port))
	if !strings.Contains(string(r.Stdout), "exit=1") || strings.Contains(string(r.Stdout), "ok") {
		t.Fatalf("127.0.0.2 reached the tunnel: %q %q", r.Stdout, r.Stderr)
	}
	// A port the tunnel does not serve is closed.
	r = run(t, sb, fmt.Sprintf("wget -q -T 5 -O - http://127.0.0.1:%d/ ; echo exit=$?", port+1))
	if !strings.Contains(string(r.Stdout), "exit=1") {
		t.Fatalf("port %d answered: %q", port+1, r.Stdout)
	}
	// A port outside 0-65535 is refused before it reaches the sandbox.
	if _, err := sandbox.Listen(context.Background(), sb, 70000); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("port 70000: %v", err)
	}
	// The port is taken: a second listener on it fails in the sandbox.
	if ln, err := sandbox.Listen(context.Background(), sb, port); err == nil {
		_ = ln.Close()
		t.Fatal("a second listener bound the same port")
	} else if !errors.Is(err, sandbox.ErrFailed) {
		t.Fatalf("second listener: %v, want ErrFailed", err)
	}
}

// blocked is a handler that answers its first bytes, then holds the
// connection until release is closed.
func blocked(release <-chan struct{}, entered chan<- struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "partial\n")
		w.(http.Flusher).Flush()
		entered <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
}

func tunnelListenerClose(t *testing.T, sb sandbox.Sandbox) {
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{}, 1)
	port, ln := serve(t, sb, blocked(release, entered))
	ctx := context.Background()
	if _, err := sb.Start(ctx, sandbox.ExecRequest{Command: fmt.Sprintf("wget -q -O /tmp/partial http://127.0.0.1:%d/", port)}); err != nil {
		t.Fatal(err)
	}
	<-entered
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	// The in-sandbox client sees its connection end (wget fails on the
	// short body) and the port is no longer served.
	r := run(t, sb, fmt.Sprintf(`for i in $(seq 1 100); do pidof wget >/dev/null || break; sleep 0.1; done; pidof wget && echo still running
wget -q -T 5 -O - http://127.0.0.1:%d/ ; echo exit=$?`, port))
	if strings.Contains(string(r.Stdout), "still running") || !strings.Contains(string(r.Stdout), "exit=1") {
		t.Fatalf("after the listener closed: %q %q", r.Stdout, r.Stderr)
	}
}

// greeted listens on a free port of sb, starts a command there that
// connects to it, writes "hi\n" and stays, and returns the listener, the
// accepted connection with the greeting read, and the port.
func greeted(ctx context.Context, t *testing.T, sb sandbox.Sandbox) (net.Listener, net.Conn, string) {
	t.Helper()
	ln, err := sandbox.Listen(ctx, sb, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	if _, err := sb.Start(ctx, sandbox.ExecRequest{Command: "echo hi | nc 127.0.0.1 " + port + "; sleep 1000"}); err != nil {
		_ = ln.Close()
		t.Fatal(err)
	}
	c, err := ln.Accept()
	if err != nil {
		_ = ln.Close()
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hi\n" {
		_ = c.Close()
		_ = ln.Close()
		t.Fatalf("read %q: %v", buf, err)
	}
	return ln, c, port
}

func tunnelSandboxClosed(t *testing.T, sb sandbox.Sandbox) {
	ctx := context.Background()
	ln, c, _ := greeted(ctx, t, sb)
	defer ln.Close()
	defer c.Close()
	buf := make([]byte, 3)
	accepted := make(chan error, 1)
	go func() {
		c2, err := ln.Accept()
		if err == nil {
			_ = c2.Close()
		}
		accepted <- err
	}()
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(buf); err == nil {
		t.Fatal("read on a connection of a closed sandbox succeeded")
	}
	if _, err := c.Write([]byte("x")); err == nil {
		// A write may be accepted locally before the end is known; a
		// second one after the read failed must not be.
		if _, err := c.Write([]byte("x")); err == nil {
			t.Fatal("write on a connection of a closed sandbox succeeded")
		}
	}
	if err := <-accepted; err == nil {
		t.Fatal("accept on a closed sandbox succeeded")
	}
	if _, err := sandbox.Listen(ctx, sb, 0); err == nil {
		t.Fatal("listen on a closed sandbox succeeded")
	}
}

func tunnelContext(t *testing.T, sb sandbox.Sandbox) {
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := sandbox.Listen(ctx, sb, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cancel()
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after the context ended: %v, want net.ErrClosed", err)
	}
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	// The agent closed the in-sandbox listener: the port is free again.
	port, _ := strconv.Atoi(p)
	var ln2 net.Listener
	for range 50 {
		if ln2, err = sandbox.Listen(context.Background(), sb, port); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("the port stayed bound after the context ended: %v", err)
	}
	_ = ln2.Close()
}

// HostBusybox is the host's static busybox, the baseline client of the
// tunnel benchmarks ("" when missing).
func HostBusybox() string {
	p, err := exec.LookPath("busybox")
	if err != nil {
		return ""
	}
	return p
}

// TunnelResetInPlace checks that a sandbox reset in place for its next
// holder (a pool with Reuse over b) keeps nothing of its previous holder's
// tunnel: the listener and its connections end, and the port is free.
func TunnelResetInPlace(t *testing.T, b sandbox.PoolSource) {
	ctx, p := ReusePoolOn(t, b, sandbox.PoolOptions{Reuse: true, MaxIdle: 2})
	spec := sandbox.Spec{Image: Image, Limits: sandbox.Limits{ReadOnlyRoot: true}}
	first, err := p.Acquire(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	ln, c, port := greeted(ctx, t, first)
	defer ln.Close()
	defer c.Close()
	buf := make([]byte, 3)
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := p.Acquire(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close(context.Background())
	if second.ID() != first.ID() {
		t.Skipf("not reset in place (%s then %s): nothing to check", first.ID(), second.ID())
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the previous holder's listener accepted after the reset: %v", err)
	}
	if _, err := c.Read(buf); err == nil {
		t.Fatal("the previous holder's connection still reads after the reset")
	}
	r := run(t, second, "wget -q -T 5 -O - http://127.0.0.1:"+port+"/ ; echo exit=$?")
	if !strings.Contains(string(r.Stdout), "exit=1") {
		t.Fatalf("the next holder reached the previous holder's port: %q %q", r.Stdout, r.Stderr)
	}
	n, _ := strconv.Atoi(port)
	ln2, err := sandbox.Listen(ctx, second, n)
	if err != nil {
		t.Fatalf("the next holder cannot bind the previous holder's port: %v", err)
	}
	_ = ln2.Close()
}

// BenchTunnel measures the tunnel against a plain loopback TCP connection
// on the host, with the same client (busybox wget) and the same Go HTTP
// server: throughput of one large GET (MB/s) and the time of one small
// GET on a new connection (µs/conn, wget's process start included on both
// sides). Each b.N iteration is one batch.
func BenchTunnel(b *testing.B, sb sandbox.Sandbox) {
	bb := HostBusybox()
	if bb == "" {
		b.Skip("no busybox on the host for the baseline")
	}
	const big = 64 << 20
	payload := make([]byte, big)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = w.Write(payload)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	ctx := context.Background()
	tln, err := sandbox.Listen(ctx, sb, 0)
	if err != nil {
		b.Fatal(err)
	}
	hln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var srvs []*http.Server
	for _, ln := range []net.Listener{tln, hln} {
		srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
		srvs = append(srvs, srv)
		wg.Go(func() { _ = srv.Serve(ln) })
	}
	defer func() {
		for _, srv := range srvs {
			_ = srv.Close()
		}
		wg.Wait()
	}()
	const conns = 50
	loop := func(port string) string {
		return fmt.Sprintf("for i in $(seq 1 %d); do wget -q -O /dev/null http://127.0.0.1:%s/small || exit 1; done", conns, port)
	}
	get := func(port string) string {
		return fmt.Sprintf("wget -q -O /dev/null http://127.0.0.1:%s/big", port)
	}
	_, tport, _ := net.SplitHostPort(tln.Addr().String())
	_, hport, _ := net.SplitHostPort(hln.Addr().String())
	inSandbox := func(cmd string) time.Duration {
		r, err := sb.Exec(ctx, sandbox.ExecRequest{Command: cmd, Timeout: 5 * time.Minute})
		if err != nil || r.ExitCode != 0 {
			b.Fatalf("%s: %v %d %s", cmd, err, r.ExitCode, r.Stderr)
		}
		return r.Duration
	}
	onHost := func(cmd string) time.Duration {
		start := time.Now()
		c := exec.Command(bb, "sh", "-c", cmd)
		c.Env = []string{"PATH=/nonexistent"} // busybox's own applets
		if out, err := c.CombinedOutput(); err != nil {
			b.Fatalf("%s: %v %s", cmd, err, out)
		}
		return time.Since(start)
	}
	// busybox sh runs its own applets (wget, seq) without PATH.
	var tGet, hGet, tConn, hConn time.Duration
	for b.Loop() {
		tGet += inSandbox(get(tport))
		hGet += onHost(get(hport))
		tConn += inSandbox(loop(tport))
		hConn += onHost(loop(hport))
	}
	n := float64(b.N)
	mb := float64(big) / (1 << 20)
	b.ReportMetric(mb*n/tGet.Seconds(), "tunnel-MB/s")
	b.ReportMetric(mb*n/hGet.Seconds(), "loopback-MB/s")
	b.ReportMetric(float64(tConn.Microseconds())/n/conns, "tunnel-µs/conn")
	b.ReportMetric(float64(hConn.Microseconds())/n/conns, "loopback-µs/conn")
}
