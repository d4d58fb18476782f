package inference

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/internal/testkit/conntest"
)

// directClient is what the pool builds, with its connection counts.
func directClient(t *testing.T) (*http.Client, *connStats) {
	t.Helper()
	st := &connStats{}
	tr := newTransport(128, st)
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}, st
}

func post(t *testing.T, ctx context.Context, c *http.Client, u, body string) (string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func echoServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s", r.URL.Path, b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestDirectReusesOneConnection(t *testing.T) {
	srv := echoServer(t)
	c, st := directClient(t)
	for i := range 20 {
		got, err := post(t, context.Background(), c, srv.URL+"/v1/x", fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("/v1/x %d", i); got != want {
			t.Fatalf("request %d: got %q, want %q", i, got, want)
		}
	}
	if d, cl := st.dials.Load(), st.closes.Load(); d != 1 || cl != 0 {
		t.Fatalf("20 sequential requests: %d dials, %d closes; want 1 and 0", d, cl)
	}

	// An idle timeout of 0 means none, as for net/http: still one
	// connection.
	st0 := &connStats{}
	std := newStdTransport(16, st0)
	std.IdleConnTimeout = 0
	tr := newDirectTransport(std, 16)
	defer tr.CloseIdleConnections()
	for i := range 3 {
		if _, err := post(t, context.Background(), &http.Client{Transport: tr}, srv.URL, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if d := st0.dials.Load(); d != 1 {
		t.Fatalf("no idle timeout: %d dials for 3 sequential requests, want 1", d)
	}
}

func TestDirectChunkedResponse(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := range 3 {
			fmt.Fprintf(w, "part%d;", i)
			w.(http.Flusher).Flush()
		}
	}))
	defer srv.Close()
	c, st := directClient(t)
	for range 3 {
		got, err := post(t, context.Background(), c, srv.URL, "")
		if err != nil || got != "part0;part1;part2;" {
			t.Fatalf("got %q, %v", got, err)
		}
	}
	if d := st.dials.Load(); d != 1 {
		t.Fatalf("chunked responses read to the end: %d dials, want 1", d)
	}
}

// rawServer answers each connection with handle, which gets the request
// number on that connection and returns false to close it unanswered.
func rawServer(t *testing.T, handle func(conn, req int, body string, w *bufio.Writer) bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	var conns atomic.Int64
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(conns.Add(1))
			wg.Go(func() {
				defer c.Close()
				br, bw := bufio.NewReader(c), bufio.NewWriter(c)
				for i := 1; ; i++ {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					b, _ := io.ReadAll(r.Body)
					if !handle(n, i, string(b), bw) {
						return
					}
					if bw.Flush() != nil {
						return
					}
				}
			})
		}
	})
	return "http://" + ln.Addr().String()
}

func ok(w *bufio.Writer, body string) {
	fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

func TestDirectNoticesServerClosedIdle(t *testing.T) {
	// Every connection answers one request (keeping it alive by the
	// protocol) and is then closed by the server, as a keep-alive timeout
	// would: the next request must not be sent on it.
	u := rawServer(t, func(conn, req int, body string, w *bufio.Writer) bool {
		ok(w, fmt.Sprint("conn", conn))
		_ = w.Flush()
		return false
	})
	c, st := directClient(t)
	for i := 1; i <= 3; i++ {
		got, err := post(t, context.Background(), c, u, "x")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if want := fmt.Sprint("conn", i); got != want {
			t.Fatalf("request %d answered by %q, want %q", i, got, want)
		}
	}
	// Found closed before it was used: even a body that cannot be sent
	// twice goes out, on a new connection.
	req, _ := http.NewRequest(http.MethodPost, u, io.NopCloser(strings.NewReader("once")))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("request after the server closed the idle connection: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if d := st.dials.Load(); d != 4 {
		t.Fatalf("%d dials, want 4", d)
	}
}

func TestDirectResendsWhenReusedConnectionDies(t *testing.T) {
	// The connection stays open after the first answer but the server
	// drops it when the second request arrives, before answering: the
	// request goes once more, whole, on a new connection.
	u := rawServer(t, func(conn, req int, body string, w *bufio.Writer) bool {
		if req > 1 {
			return false
		}
		ok(w, fmt.Sprint("conn", conn, " ", body))
		return true
	})
	c, st := directClient(t)
	if got, err := post(t, context.Background(), c, u, "first"); err != nil || got != "conn1 first" {
		t.Fatalf("first: %q, %v", got, err)
	}
	got, err := post(t, context.Background(), c, u, "second")
	if err != nil {
		t.Fatalf("second request: %v (want it re-sent on a new connection)", err)
	}
	if got != "conn2 second" {
		t.Fatalf("second request answered by %q, want %q", got, "conn2 second")
	}
	if d := st.dials.Load(); d != 2 {
		t.Fatalf("%d dials, want 2", d)
	}

	// A body that cannot be replayed is not re-sent: the error surfaces.
	req, _ := http.NewRequest(http.MethodPost, u, io.NopCloser(strings.NewReader("once")))
	if _, err := c.Do(req); err == nil {
		t.Fatal("a request whose body cannot be replayed succeeded on a dying connection")
	}
}

func TestDirectCancelEndsTheRequestAndDropsTheConnection(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		fmt.Fprint(w, "fast")
	}))
	defer srv.Close()
	defer close(release)
	c, st := directClient(t)
	if _, err := post(t, context.Background(), c, srv.URL+"/fast", ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := post(t, ctx, c, srv.URL+"/slow", "")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("cancelled request returned after %v", d)
	}
	if got, err := post(t, context.Background(), c, srv.URL+"/fast", ""); err != nil || got != "fast" {
		t.Fatalf("after the cancel: %q, %v", got, err)
	}
	if d := st.dials.Load(); d != 2 {
		t.Fatalf("%d dials, want 2 (the cancelled request's connection is not reused)", d)
	}
}

func TestDirectUnreadBodyClosesTheConnection(t *testing.T) {
	srv := echoServer(t)
	c, st := directClient(t)
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(strings.Repeat("y", 1000)))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close() // unread
	if _, err := post(t, context.Background(), c, srv.URL, "z"); err != nil {
		t.Fatal(err)
	}
	if d, cl := st.dials.Load(), st.closes.Load(); d != 2 || cl != 1 {
		t.Fatalf("%d dials, %d closes; want 2 and 1", d, cl)
	}
}

func TestDirectClosesIdleConnectionsAfterTimeout(t *testing.T) {
	srv := echoServer(t)
	st := &connStats{}
	std := newStdTransport(16, st)
	std.IdleConnTimeout = 50 * time.Millisecond
	tr := newDirectTransport(std, 16)
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	if _, err := post(t, context.Background(), c, srv.URL, "a"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for st.closes.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the idle connection was not closed after its timeout")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDirectLeavesProxiedAndTLSToNetHTTP(t *testing.T) {
	var proxied atomic.Value
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Store(r.URL.String()) // absolute: sent as to a proxy
		fmt.Fprint(w, "via proxy")
	}))
	defer proxy.Close()
	st := &connStats{}
	std := newStdTransport(16, st)
	pu, _ := url.Parse(proxy.URL)
	std.Proxy = func(r *http.Request) (*url.URL, error) {
		if r.URL.Hostname() == "engine.invalid" {
			return pu, nil
		}
		return nil, nil
	}
	tr := newDirectTransport(std, 16)
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	got, err := post(t, context.Background(), c, "http://engine.invalid:8000/v1/completions", "{}")
	if err != nil || got != "via proxy" {
		t.Fatalf("proxied request: %q, %v", got, err)
	}
	if u, _ := proxied.Load().(string); u != "http://engine.invalid:8000/v1/completions" {
		t.Fatalf("proxy saw %q", u)
	}

	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.Proto)
	}))
	defer tlsSrv.Close()
	std.TLSClientConfig = tlsSrv.Client().Transport.(*http.Transport).TLSClientConfig
	got, err = post(t, context.Background(), c, tlsSrv.URL, "")
	if err != nil || !strings.HasPrefix(got, "HTTP/") {
		t.Fatalf("https request: %q, %v", got, err)
	}
}

func TestDirectConcurrentRequests(t *testing.T) {
	srv := echoServer(t)
	c, st := directClient(t)
	var n atomic.Int64
	conntest.Rounds(t, 64, 20, func() error {
		body := fmt.Sprint(n.Add(1))
		got, err := post(t, context.Background(), c, srv.URL+"/p", body)
		if err == nil && got != "/p "+body {
			err = fmt.Errorf("got %q for %q", got, body)
		}
		return err
	})
	if d := st.dials.Load(); d > 64 {
		t.Fatalf("%d dials for 64 concurrent callers", d)
	}
}

// A server that answers before it has read the whole request and then
// closes (a proxy's 413 for a body over its limit) is heard: the caller
// gets its answer, not the failed write.
func TestDirectReturnsAnAnswerSentBeforeTheBodyWasRead(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			if _, err := http.ReadRequest(bufio.NewReader(nc)); err == nil {
				_, _ = io.WriteString(nc, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 9\r\nConnection: close\r\n\r\ntoo large")
			}
			_ = nc.Close() // most of the body unread: the close resets the connection
		}
	}()
	c, st := directClient(t)
	req, err := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/v1/completions", strings.NewReader(strings.Repeat("x", 32<<20)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("got error %v, want the server's 413", err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || string(b) != "too large" || err != nil {
		t.Fatalf("got %d %q (%v), want 413 %q", resp.StatusCode, b, err, "too large")
	}
	if d, cl := st.dials.Load(), st.closes.Load(); d != 1 || cl != 1 {
		t.Fatalf("%d dials, %d closes; want 1 and 1 (the connection is never reused)", d, cl)
	}
}
