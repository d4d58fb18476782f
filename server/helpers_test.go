package server

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/sandbox/host"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rollout-rl/rollout/assemble"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/demo"
	"github.com/rollout-rl/rollout/internal/testkit/metrictest"
	"github.com/rollout-rl/rollout/sandbox/docker"
	"github.com/rollout-rl/rollout/trajectory"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// client-go, under the Kubernetes backend (TestKubernetesJob):
		// the WebSocket exec stream's heartbeat outlives its closed
		// stream, and the API server connection of client-go's
		// process-wide transport cache stays open for reuse.
		goleak.IgnoreTopFunction("k8s.io/client-go/tools/remotecommand.(*heartbeat).start"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*clientConnReadLoop).run"),
	)
}

var quiet = slog.New(slog.DiscardHandler)

// waitLimit bounds every wait of these tests. It is generous on purpose:
// the tests assert on order and counts, never on timing.
const waitLimit = 3 * time.Minute

// gatedSim is the simulator behind a gate on its generation routes: the
// first `passes` generations go through, later ones block until open (or
// until their client gives up). It makes "a job stopped mid-way"
// deterministic without timing.
type gatedSim struct {
	URL     string
	srv     *httptest.Server
	passes  atomic.Int64
	blocked atomic.Int64
	release chan struct{}
	once    sync.Once
}

// newSim serves the simulator with the reference solutions of env's train
// items (success probability 0.7, so groups have reward variance). passes
// < 0 leaves the gate open.
func newSim(t *testing.T, env string, passes int) *gatedSim {
	t.Helper()
	ctx := context.Background()
	scripts, err := demo.EnvScripts(ctx, env, "train")
	if err != nil {
		t.Fatal(err)
	}
	h, err := sim.NewHandler(sim.Config{Family: "hermes", Seed: 7, SuccessProb: 0.7, Scripts: scripts})
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedSim{release: make(chan struct{})}
	g.passes.Store(int64(passes))
	if passes < 0 {
		g.open()
	}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/completions", "/v1/chat/completions", "/inference/v1/generate":
			if g.passes.Add(-1) < 0 {
				g.blocked.Add(1)
				select {
				case <-g.release:
				case <-r.Context().Done():
					g.blocked.Add(-1)
					return
				}
				g.blocked.Add(-1)
			}
		}
		h.ServeHTTP(w, r)
	}))
	g.URL = g.srv.URL
	t.Cleanup(func() {
		g.open()
		g.srv.Close()
	})
	return g
}

func (g *gatedSim) open() { g.once.Do(func() { close(g.release) }) }

// waitBlocked waits until n generations wait at the gate.
func (g *gatedSim) waitBlocked(t *testing.T, n int64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d generations blocked at the gate", n), func() bool { return g.blocked.Load() >= n })
}

// waitFor polls cond (a state check, not a timing assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// jobYAML is a run config of toolcall-match (no sandbox) against url.
func jobYAML(url, out string, groups, size int) string {
	s := fmt.Sprintf(`env: toolcall-match
groups: %d
group_size: %d
seed: 3
inference:
  backend: vllm
  endpoints: [%s]
  timeout: 2m
parser: hermes
sampling: {max_tokens: 256}
limits: {groups_in_flight: 1}
`, groups, size, url)
	if out != "" {
		s += "output: {dir: " + out + "}\n"
	}
	return s
}

func startReq(config, id string) *rolloutv1.StartJobRequest {
	return &rolloutv1.StartJobRequest{Config: &rolloutv1.StartJobRequest_ConfigYaml{ConfigYaml: config}, JobId: id}
}

// harness is a server on a real TCP socket with a client.
type harness struct {
	t      *testing.T
	svc    *Server
	addr   string
	cli    *Client
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

func startServer(t *testing.T, opts Options, ro RunOptions) *harness {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	if opts.DataDir == "" {
		opts.DataDir = t.TempDir()
	}
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := New(ctx, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if ro.Listener == nil {
		ln, err := Listen(ctx, "127.0.0.1:0")
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		ro.Listener = ln
	}
	ro.Logger = quiet
	ready := make(chan struct{})
	ro.Ready = func() { close(ready) }
	h := &harness{t: t, svc: svc, addr: ro.Listener.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- Run(ctx, svc, ro) }()
	<-ready
	h.cli, err = Dial(ClientOptions{Addr: h.addr, Token: ro.Token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.stop() })
	return h
}

// stop shuts the server down (gracefully, as RunOptions say) and waits.
func (h *harness) stop() error {
	h.once.Do(func() {
		h.cancel()
		h.err = <-h.done
		h.cli.Close()
	})
	return h.err
}

func (h *harness) shuttingDown() bool {
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	return h.svc.shuttingDown.Load()
}

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

func (h *harness) start(t *testing.T, req *rolloutv1.StartJobRequest) *rolloutv1.Job {
	t.Helper()
	resp, err := h.cli.StartJob(bg(t), req)
	if err != nil {
		t.Fatalf("StartJob: %v", err)
	}
	return resp.Job
}

// watch collects a WatchJob stream's events until it ends. onEvent runs
// for every event (the progress snapshot first).
type watchResult struct {
	progress []*rolloutv1.JobProgress
	groups   []*rolloutv1.Group
	finished *rolloutv1.Job
	err      error // the error that ended the stream, nil after finished
}

func (h *harness) watch(ctx context.Context, id string, groups bool, onEvent func(*rolloutv1.WatchJobResponse)) watchResult {
	var res watchResult
	stream, err := h.cli.WatchJob(ctx, &rolloutv1.WatchJobRequest{JobId: id, IncludeGroups: groups})
	if err != nil {
		res.err = err
		return res
	}
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return res
		}
		if err != nil {
			res.err = err
			return res
		}
		switch e := ev.Event.(type) {
		case *rolloutv1.WatchJobResponse_Progress:
			res.progress = append(res.progress, e.Progress)
		case *rolloutv1.WatchJobResponse_Group:
			res.groups = append(res.groups, e.Group)
		case *rolloutv1.WatchJobResponse_Finished:
			res.finished = e.Finished
		}
		if onEvent != nil {
			onEvent(ev)
		}
	}
}

// watchAsync runs watch on a goroutine; the channel yields its result.
func (h *harness) watchAsync(t *testing.T, id string, groups bool, onEvent func(*rolloutv1.WatchJobResponse)) <-chan watchResult {
	ch := make(chan watchResult, 1)
	ctx := bg(t)
	go func() { ch <- h.watch(ctx, id, groups, onEvent) }()
	return ch
}

// progressAtLeast returns an onEvent that closes reached once groups_done
// reaches n.
func progressAtLeast(n int32, reached chan struct{}) func(*rolloutv1.WatchJobResponse) {
	var once sync.Once
	return func(ev *rolloutv1.WatchJobResponse) {
		if p := ev.GetProgress(); p != nil && p.GroupsDone >= n {
			once.Do(func() { close(reached) })
		}
	}
}

func wait[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLimit):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// readRun returns a run directory's records by group, failing on a
// duplicate (group, rollout).
func readRun(t *testing.T, dir string) map[string][]trajectory.Record {
	t.Helper()
	run, err := trajectory.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]trajectory.Record{}
	seen := map[string]bool{}
	for _, r := range recs {
		k := fmt.Sprintf("%s/%d", r.GroupID, r.RolloutIndex)
		if seen[k] {
			t.Fatalf("duplicate record %s", k)
		}
		seen[k] = true
		out[r.GroupID] = append(out[r.GroupID], r)
	}
	return out
}

// wantCode checks err's gRPC code and that its message names field.
func wantCode(t *testing.T, what string, err error, code codes.Code, field string) {
	t.Helper()
	st, _ := status.FromError(err)
	t.Logf("%s: %v: %s", what, st.Code(), st.Message())
	if st.Code() != code {
		t.Errorf("%s: code %v (%v), want %v", what, st.Code(), err, code)
		return
	}
	if field != "" && !strings.Contains(st.Message(), field) {
		t.Errorf("%s: message %q does not name %q", what, st.Message(), field)
	}
}

// checkSandboxedRun reads a finished job's run directory and checks that it
// holds wantGroups groups of ok rollouts of at least two turns, at least one
// of them rewarded (its sandboxed tool calls took effect).
func checkSandboxedRun(t *testing.T, dir string, wantGroups int, backend string) map[string][]trajectory.Record {
	t.Helper()
	recs := readRun(t, dir)
	if len(recs) != wantGroups {
		t.Fatalf("%d groups on disk, want %d", len(recs), wantGroups)
	}
	rewarded := 0
	for g, rows := range recs {
		for _, r := range rows {
			if r.Status != trajectory.StatusOK || r.Turns < 2 {
				t.Errorf("group %s rollout %d: %s, %d turns, %+v", g, r.RolloutIndex, r.Status, r.Turns, r.Failure)
			}
			if r.Manifest.Backend != backend {
				t.Errorf("group %s rollout %d: manifest backend %q, want %q", g, r.RolloutIndex, r.Manifest.Backend, backend)
			}
			if r.Reward > 0 {
				rewarded++
			}
		}
	}
	if rewarded == 0 {
		t.Error("no rollout earned a reward: the sandboxed tool calls did not take effect")
	}
	return recs
}

// histogramCount is the sample count of the process's histogram name with
// label = value (0 when it has none yet).
func histogramCount(t *testing.T, name, label, value string) uint64 {
	t.Helper()
	return metrictest.Find(t, name, label, value).GetHistogram().GetSampleCount()
}

// newShared returns the server's shared sandbox backends under a fresh
// instance name (prefix + random suffix), and that name; they are closed
// when the test ends.
func newShared(t *testing.T, prefix string) (shared *assemble.Shared, instance string) {
	t.Helper()
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	instance = prefix + "-" + hex.EncodeToString(b)
	shared = assemble.NewShared(docker.Options{Options: host.Options{Instance: instance, Logger: quiet}}, 16)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = shared.Close(ctx)
	})
	return shared, instance
}
