package docker

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/internal/testkit/sandboxtest"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/host"
)

// TestFaults runs each hostile command in its own sandbox and checks that
// the sandbox records it, stays usable, and that a witness sandbox, the
// agent and this process are unaffected.
func TestFaults(t *testing.T) {
	witness := newSandbox(t, sandbox.Spec{})
	ctx := context.Background()
	alive := func(t *testing.T, s sandbox.Sandbox, who string) {
		t.Helper()
		r, err := s.Exec(ctx, sandbox.ExecRequest{Argv: []string{"echo", "ok"}})
		if err != nil || string(r.Stdout) != "ok\n" {
			t.Fatalf("%s not usable afterwards: %q %v", who, r.Stdout, err)
		}
	}
	tests := []struct {
		name  string
		spec  sandbox.Spec
		req   sandbox.ExecRequest
		Check func(t *testing.T, s sandbox.Sandbox, r sandbox.ExecResult)
	}{
		{
			name: "fork bomb",
			spec: sandbox.Spec{Limits: sandbox.Limits{PIDs: 64}},
			req:  sandbox.ExecRequest{Command: "bomb() { bomb | bomb & }; bomb; sleep 1000", Timeout: 3 * time.Second},
			Check: func(t *testing.T, s sandbox.Sandbox, r sandbox.ExecResult) {
				if !r.TimedOut || r.ExitCode != 124 {
					t.Errorf("fork bomb: %+v stderr %.200q", r, r.Stderr)
				}
				ps, err := s.Exec(ctx, sandbox.ExecRequest{Command: "ps -o pid | wc -l"})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("processes after the bomb was killed: %s", strings.TrimSpace(string(ps.Stdout)))
			},
		},
		{
			name: "memory hog",
			spec: sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 64 << 20}},
			req:  sandbox.ExecRequest{Command: `x=$(head -c 400000000 /dev/zero | tr '\0' a); echo survived ${#x}`, Timeout: time.Minute},
			Check: func(t *testing.T, s sandbox.Sandbox, r sandbox.ExecResult) {
				if r.ExitCode == 0 || strings.Contains(string(r.Stdout), "survived") {
					t.Errorf("memory hog was not stopped: %+v %q", r, r.Stdout)
				}
			},
		},
		{
			name: "1 GB output flood",
			req:  sandbox.ExecRequest{Command: "head -c 1073741824 /dev/zero; echo; echo end", OutputCap: 64 << 10, Timeout: 2 * time.Minute},
			Check: func(t *testing.T, s sandbox.Sandbox, r sandbox.ExecResult) {
				if r.ExitCode != 0 || r.StdoutTotal != 1<<30+5 || !r.StdoutTruncated || len(r.Stdout) != 64<<10 || !strings.HasSuffix(string(r.Stdout), "\nend\n") {
					t.Errorf("flood: exit %d total %d truncated %v kept %d", r.ExitCode, r.StdoutTotal, r.StdoutTruncated, len(r.Stdout))
				}
			},
		},
		{
			name: "kill -9 -1",
			// kill(-1) spares the caller itself; everything else of the
			// user dies, the root agent does not.
			req: sandbox.ExecRequest{Command: "sleep 1000 & p=$!; kill -9 -1; wait $p; echo sleep status $?"},
			Check: func(t *testing.T, s sandbox.Sandbox, r sandbox.ExecResult) {
				if r.ExitCode != 0 || string(r.Stdout) != "sleep status 137\n" {
					t.Errorf("kill -9 -1: %+v %q", r, r.Stdout)
				}
			},
		},
		{
			name: "ignores SIGTERM",
			req:  sandbox.ExecRequest{Command: `trap "" TERM INT HUP; while :; do sleep 1; done`, Timeout: time.Second},
			Check: func(t *testing.T, s sandbox.Sandbox, r sandbox.ExecResult) {
				if !r.TimedOut || r.ExitCode != 124 {
					t.Errorf("timeout: %+v", r)
				}
			},
		},
		{
			name: "fill the workspace disk",
			spec: sandbox.Spec{Limits: sandbox.Limits{ReadOnlyRoot: true, DiskBytes: 16 << 20}},
			req:  sandbox.ExecRequest{Command: "head -c 100000000 /dev/zero > /workspace/fill"},
			Check: func(t *testing.T, s sandbox.Sandbox, r sandbox.ExecResult) {
				// busybox reports ENOSPC on stdout as "I/O error".
				if r.ExitCode == 0 || len(r.Stderr) == 0 {
					t.Errorf("disk fill: %+v %q", r, r.Stderr)
				}
				if err := s.WriteFile(ctx, "/workspace/more", make([]byte, 1<<20), 0); !errors.Is(err, sandbox.ErrFailed) {
					t.Errorf("write to full disk: %v, want ErrFailed", err)
				}
				if r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "touch /etc/x"}); err != nil || r.ExitCode == 0 {
					t.Errorf("read-only root was writable: %+v %v", r, err)
				}
				if r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "rm /workspace/fill && echo freed > /workspace/f && cat /workspace/f"}); err != nil || string(r.Stdout) != "freed\n" {
					t.Errorf("after freeing: %q %q %v", r.Stdout, r.Stderr, err)
				}
			},
		},
		{
			name: "network attempt",
			req:  sandbox.ExecRequest{Command: "ls /sys/class/net; wget -q -T 3 -O - http://1.1.1.1/ || nc -w 3 1.1.1.1 80 </dev/null", MergeOutput: true, Timeout: 30 * time.Second},
			Check: func(t *testing.T, s sandbox.Sandbox, r sandbox.ExecResult) {
				if r.ExitCode == 0 || r.TimedOut || !strings.HasPrefix(string(r.Stdout), "lo\n") {
					t.Errorf("network: %+v %q", r, r.Stdout)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSandbox(t, tt.spec)
			r, err := s.Exec(ctx, tt.req)
			if err != nil {
				t.Fatalf("exec: %v", err)
			}
			tt.Check(t, s, r)
			alive(t, s, "the sandbox")
			alive(t, witness, "the witness sandbox")
		})
	}
}

func TestContainerKilledMidCommand(t *testing.T) {
	d := needDocker(t)
	s := newSandbox(t, sandbox.Spec{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Exec(ctx, sandbox.ExecRequest{Command: "echo started; sleep 1000"})
		errc <- err
	}()
	// Wait until the command runs, then kill the container from outside.
	for {
		r, err := s.Exec(ctx, sandbox.ExecRequest{Command: "ps -o comm | grep -c sleep || true"})
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(r.Stdout)) != "0" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := d.Client().ContainerKill(context.Background(), s.ID(), client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	if !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("exec in killed container: %v, want ErrUnavailable", err)
	}
	if _, err := s.ReadFile(ctx, "/etc/passwd"); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("later call: %v, want ErrUnavailable", err)
	}
	t.Logf("error: %v", err)
}

// TestCyclesLeaveNothing runs create/exec/close cycles with random
// cancellations on a backend of its own and then lists containers by its
// instance label.
func TestCyclesLeaveNothing(t *testing.T) {
	needDocker(t)
	n := 200
	if testing.Short() {
		n = 40
	}
	ctx := context.Background()
	d, err := New(ctx, Options{Options: host.Options{Instance: "cycles-" + sandbox.RandomID(4), ReapInterval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(ctx)
	var wg sync.WaitGroup
	jobs := make(chan int)
	var mu sync.Mutex
	outcomes := map[string]int{}
	for range 6 {
		wg.Go(func() {
			for i := range jobs {
				rng := rand.New(rand.NewPCG(uint64(i), 7))
				cctx, cancel := context.WithTimeout(ctx, time.Duration(rng.IntN(1500))*time.Millisecond)
				outcome := "ok"
				s, err := d.Create(cctx, sandbox.Spec{Image: sandboxtest.Image, Labels: map[string]string{sandbox.LabelRollout: "cycle"}})
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
						t.Errorf("cycle %d: create: %v", i, err)
					}
					outcome = "create cancelled"
				} else {
					if _, err := s.Exec(cctx, sandbox.ExecRequest{Command: "echo hi; sleep 0.0$RANDOM"}); err != nil {
						if !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("cycle %d: exec: %v", i, err)
						}
						outcome = "exec cancelled"
					}
					if rng.IntN(2) == 0 {
						cancel() // Close must work with a cancelled ctx
					}
					if err := s.Close(cctx); err != nil {
						t.Errorf("cycle %d: close: %v", i, err)
					}
				}
				cancel()
				mu.Lock()
				outcomes[outcome]++
				mu.Unlock()
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	t.Logf("outcomes of %d cycles: %v", n, outcomes)
	res, err := d.Client().ContainerList(ctx, client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", sandbox.LabelInstance+"="+d.Instance())})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Items) != 0 {
		t.Fatalf("%d containers left with this instance's label", len(res.Items))
	}
}
