package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// childProcess is a server of the bench's (`rollout sim`, or the gateway
// of `rollout bench gateway-serve`) running in a child process, so that a
// measure of the client counts none of the server's CPU or memory. Its
// output goes to a file (handed to the child as its stdout and stderr, so
// this process copies nothing); Close stops it and removes the file.
type childProcess struct {
	URL  string
	what string // what the child is, for errors ("simulator", "gateway")
	cmd  *exec.Cmd
	dir  string
	log  string
	done chan struct{} // closed when the child has exited
	err  error         // the child's exit status, valid once done is closed
	// release lets go of the OS thread the child was started from (its
	// parent-death signal is tied to that thread on Linux).
	release func()
}

// simBenchConfig is the YAML simulator config of the concurrent-loops
// workload: Hermes output, a fixed time to first token, and turns turns of
// one call to the no-op tool each, then a final answer.
func simBenchConfig(turns int, ttft time.Duration) string {
	return fmt.Sprintf(`family: hermes
latency:
  ttft: %s
bench:
  tool: noop
  calls_per_turn: 1
  turns: %d
  arguments: {path: a.txt}
`, ttft, turns)
}

// simBinary is the rollout executable that serves `rollout sim`:
// Options.SimBinary, else this executable unless it is a test binary
// (which has no sim command; running it with "sim" would run its tests).
func (r *runCtx) simBinary() (string, error) {
	if r.opts.SimBinary != "" {
		return r.opts.SimBinary, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the rollout executable: %w", err)
	}
	if strings.HasSuffix(filepath.Base(exe), ".test") {
		return "", errors.New("running inside a test binary: Options.SimBinary must name a rollout binary")
	}
	return exe, nil
}

// startSimProcess runs `exe sim --host 127.0.0.1 --port P --config FILE`
// with config as FILE, on a free port, and waits until /health answers.
func startSimProcess(ctx context.Context, exe, config string) (_ *childProcess, err error) {
	dir, err := os.MkdirTemp("", "rollout-bench-sim-*")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	cfgPath := filepath.Join(dir, "sim.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return nil, err
	}
	return startChildOnFreePort(ctx, exe, dir, "sim.log", "simulator", func(port int) []string {
		return []string{"sim", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--config", cfgPath}
	})
}

// startChildOnFreePort spawns exe with args(port) on a free loopback port,
// its output in dir/logName, and waits until /health answers. Another
// process may take the port between freePort and the child's listen, so a
// child that fails with "address already in use" is retried on a new port
// (three attempts in all). what names the child in errors.
func startChildOnFreePort(ctx context.Context, exe, dir, logName, what string, args func(port int) []string) (*childProcess, error) {
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		p, err := spawnChild(exe, args(port), port, dir, logName, what)
		if err != nil {
			return nil, err
		}
		herr := p.waitHealthy(ctx, 30*time.Second)
		if herr == nil {
			return p, nil
		}
		p.stop()
		out := p.output()
		if attempt < 3 && strings.Contains(out, "address already in use") && ctx.Err() == nil {
			continue
		}
		if out != "" {
			return nil, fmt.Errorf("%w; %s output:\n%s", herr, what, out)
		}
		return nil, herr
	}
}

// freePort asks the kernel for a free TCP port on the loopback interface.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}

// spawnChild starts exe with args as a child serving on port of the
// loopback interface, its output in dir/logName.
func spawnChild(exe string, args []string, port int, dir, logName, what string) (*childProcess, error) {
	logPath := filepath.Join(dir, logName)
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	release, err := startTied(cmd)
	if err != nil {
		return nil, fmt.Errorf("start %s %s: %w", exe, args[0], err)
	}
	p := &childProcess{URL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), what: what, cmd: cmd, dir: dir, log: logPath,
		done: make(chan struct{}), release: sync.OnceFunc(release)}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitHealthy polls /health until it answers 200, the child exits, ctx
// ends or timeout passes.
func (p *childProcess) waitHealthy(ctx context.Context, timeout time.Duration) error {
	// No keep-alive: nothing is left behind (idle connections, their
	// goroutines) once the server is up.
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/health", nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before answering /health: %v", p.what, p.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("%s at %s did not answer /health within %s", p.what, p.URL, timeout)
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM, waits for the child (SIGKILL after 10 s) and
// returns its exit error, if any.
func (p *childProcess) stop() error {
	defer p.release()
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-p.done:
		return p.err
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within 10 s of SIGTERM; killed", p.what)
	}
}

// Close stops the child and removes its config and log.
func (p *childProcess) Close() error {
	err := p.stop()
	if err != nil {
		if out := p.output(); out != "" {
			err = fmt.Errorf("%w; %s output:\n%s", err, p.what, out)
		}
	}
	return errors.Join(err, os.RemoveAll(p.dir))
}

// output is the child's log, shortened to its first and last lines (a
// usage error comes first, a late failure last).
func (p *childProcess) output() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	const keep = 8
	if len(lines) > 2*keep+1 {
		lines = append(append(lines[:keep:keep], "…"), lines[len(lines)-keep:]...)
	}
	for i, l := range lines {
		if len(l) > 300 {
			lines[i] = l[:300] + "…"
		}
	}
	return strings.Join(lines, "\n")
}

// cpu is the CPU time the child has used so far.
func (p *childProcess) cpu() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/stat")
	if err != nil {
		return 0, false
	}
	_, cpu, ok := parseStatCPU(b)
	return cpu, ok
}

// peakRSS is the child's peak resident set size so far (VmHWM).
func (p *childProcess) peakRSS() (int64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}
