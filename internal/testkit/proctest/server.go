package proctest

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// StartServer starts a long-running child (argv from args) on a free
// loopback port and waits until ready reports it serving. A child that
// exits during startup (the port was taken in between) is retried on
// another port, three times at most. The child is stopped with SIGTERM
// (then SIGKILL after a minute, a test error) when the test ends; its
// output is logged when the test failed.
func StartServer(ctx context.Context, t *testing.T, name string, args func(port int) []string, ready func(port int) bool) int {
	t.Helper()
	var lastOut string
	for attempt := 1; attempt <= 3; attempt++ {
		port := FreePort(t)
		argv := args(port)
		cmd := exec.Command(argv[0], argv[1:]...)
		out := &Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		stopped := false
		t.Cleanup(func() {
			if stopped {
				return
			}
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-exited:
				if err != nil {
					t.Logf("%s exited after SIGTERM: %v", name, err)
				}
			case <-time.After(time.Minute):
				_ = cmd.Process.Kill()
				<-exited
				t.Errorf("%s ignored SIGTERM for a minute and was killed", name)
			}
			if t.Failed() {
				t.Logf("%s output:\n%s", name, out.String())
			}
		})
		if waitReady(ctx, t, name, port, exited, out, ready) {
			return port
		}
		stopped = true
		lastOut = out.String()
	}
	t.Fatalf("%s could not start:\n%s", name, lastOut)
	return 0
}

// waitReady polls ready until it reports the child serving (true) or the
// child exits (false).
func waitReady(ctx context.Context, t *testing.T, name string, port int, exited <-chan error, out *Buffer, ready func(int) bool) bool {
	t.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			t.Logf("%s on port %d ended during startup (%v):\n%s", name, port, err, out.String())
			return false
		case <-deadline.C:
			t.Fatalf("%s did not come up within a minute on port %d:\n%s", name, port, out.String())
		case <-ctx.Done():
			t.Fatalf("%s: %v", name, ctx.Err())
		case <-tick.C:
			if ready(port) {
				return true
			}
		}
	}
}

// Listening reports whether something accepts TCP connections on the
// loopback port (e.g. rollout serve).
func Listening(port int) bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
