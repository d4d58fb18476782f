package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/datasets"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/util/netpolicy"
	"github.com/rollout-rl/rollout/runner"
)

// pending is an item waiting for a credit.
type pending struct {
	item datasets.Item
	opts runner.GroupOptions
}

// collector is the state of one CollectGroups stream.
type collector struct {
	s      *Server
	j      *assemble.Job
	env    string
	stream rolloutv1.RolloutService_CollectGroupsServer
	// ctx is the stream's, cancelled early when the stream fails or the
	// server shuts down with cancel-in-flight.
	ctx    context.Context
	cancel context.CancelFunc
	// compact: the stream asked for TOKEN_LAYOUT_COMPACT.
	compact bool

	sendMu sync.Mutex
	wg     sync.WaitGroup
	// changed is signalled when a group finished (the drain waits on it).
	changed chan struct{}

	mu        sync.Mutex
	credits   int
	inFlight  int
	queue     []pending
	sent      int
	started   int
	dataset   []datasets.Item
	cursor    int
	loaded    bool
	exhausted bool
	draining  bool // the server is shutting down: no new groups start
	failed    error
	// done holds the groups already in the run directory of a resumed
	// stream (start.from_sequence): `next` skips them.
	done map[string]bool
	// id is start.stream_id (policy updates address the stream by it).
	id string
	// tenant started the stream; only it may address the stream.
	tenant string
	// rows is the rollouts of the groups queued or started so far, bound
	// by the tenant's rows quota (rowsLimit, 0: none). quotaErr, once set,
	// ends the stream after its in-flight groups are sent.
	rows, rowsLimit int64
	quotaErr        error
	// Groups outside async.max_staleness, by what was done.
	staleDropped, staleRegenerated, staleMarked int
}

// bound re-checks a finished group against async.max_staleness with the
// current version — the service's or the trainer's (credit
// trainer_version), whichever is newer — right before it is handed over:
// the runner checked it at completion, but the version may have moved
// since. A stale group is regenerated, dropped or marked per on_stale.
func (c *collector) bound(idx int, p pending, g *runner.Group) *runner.Group {
	u := c.j.Updater()
	r := c.j.Runner
	for u != nil && !g.StaleDropped && c.ctx.Err() == nil {
		g.Versions = runner.Versions(g, u.PolicyVersion())
		if !r.OutsideBound(g.Versions) {
			break
		}
		if r.Config().Async.Policy() == runner.OnStaleMark {
			g.Stale = true
			break
		}
		if r.Config().Async.Policy() == runner.OnStaleRegenerate && g.Regenerated < r.Config().Async.MaxRegenerationsOrDefault() {
			n := g.Regenerated + 1
			c.s.log.Info("group went stale before delivery; generating it again", "group_id", g.ID, "lag", g.Versions.Lag, "attempt", n)
			g = r.RunGroup(c.ctx, idx, p.item, p.opts)
			g.Regenerated += n
			continue
		}
		g.StaleDropped = true
	}
	c.mu.Lock()
	if g.Stale {
		c.staleMarked++
		metricStale.WithLabelValues("marked").Inc()
	}
	if !g.StaleDropped {
		c.staleRegenerated += g.Regenerated
	}
	c.mu.Unlock()
	if g.Regenerated > 0 {
		metricStale.WithLabelValues("regenerated").Add(float64(g.Regenerated))
	}
	return g
}

// collectStart checks the start message that opens a CollectGroups stream
// and returns it with its run config; errors are gRPC statuses naming the
// field.
func (s *Server) collectStart(ctx context.Context, first *rolloutv1.CollectGroupsRequest) (*rolloutv1.CollectStart, runner.Config, error) {
	start := first.GetStart()
	switch {
	case start == nil:
		return nil, runner.Config{}, status.Error(codes.InvalidArgument, "start: the first message of CollectGroups must be start")
	case start.FromSequence != nil && *start.FromSequence < 0:
		return nil, runner.Config{}, status.Error(codes.InvalidArgument, "start.from_sequence: must not be negative")
	case start.InitialCredits < 0:
		return nil, runner.Config{}, status.Error(codes.InvalidArgument, "start.initial_credits: must not be negative")
	}
	if err := checkLayout("start.token_layout", start.TokenLayout); err != nil {
		return nil, runner.Config{}, err
	}
	if strings.TrimSpace(start.ConfigYaml) == "" {
		return nil, runner.Config{}, status.Error(codes.InvalidArgument, "start.config_yaml: empty")
	}
	cfg, err := runner.ParseConfig([]byte(start.ConfigYaml))
	if err != nil {
		return nil, runner.Config{}, fieldStatus("start.config_yaml", err)
	}
	if err := s.checkConfig(&cfg, "start.config_yaml: ", false); err != nil {
		return nil, runner.Config{}, fieldStatus("start.config_yaml", err)
	}
	if err := s.checkURLs(ctx, start.ConfigYaml, "start.config_yaml: "); err != nil {
		return nil, runner.Config{}, err
	}
	return start, cfg, nil
}

// CollectGroups implements RolloutServiceServer.
func (s *Server) CollectGroups(stream rolloutv1.RolloutService_CollectGroupsServer) error {
	if !s.track() {
		return errShuttingDown
	}
	defer s.wg.Done()
	// Every connection the stream's groups make is confined by the
	// server's network policy.
	ctx := netpolicy.With(stream.Context(), s.opts.NetPolicy)
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start, cfg, err := s.collectStart(ctx, first)
	if err != nil {
		return err
	}
	owner := fmt.Sprintf("collect stream %p", stream)
	if err := s.claimOutput(cfg.Output.Dir, owner); err != nil {
		return err
	}
	defer s.releaseOutput(cfg.Output.Dir, owner)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := &collector{s: s, stream: stream, ctx: cctx, cancel: cancel, credits: int(start.InitialCredits), changed: make(chan struct{}, 1),
		compact: compactLayout(start.TokenLayout)}
	j, err := assemble.Open(ctx, cfg, assemble.Options{Mode: assemble.ModeCollect, Logger: s.log.With("stream", "collect"), Sandboxes: s.sandboxes, Images: s.images,
		Progress: func(e runner.Event) {
			if e.Rollout != nil {
				observeRollout(c.env, e.Rollout)
			}
		}})
	if err != nil {
		return fieldStatus("start.config_yaml", err)
	}
	c.tenant = tenantOf(ctx)
	if q := s.quota.of(c.tenant); q.Rows > 0 {
		c.rowsLimit = q.Rows
	}
	release, err := s.quota.reserve(c.tenant, sandboxesOf(j.Runner), 0)
	if err != nil {
		_ = j.Close(context.WithoutCancel(ctx))
		return err
	}
	defer release()
	// As a job's Run would: a wrong model, key or endpoint fails the
	// stream now, not every group the trainer asks for.
	if err := j.StartCheck(ctx); err != nil {
		_ = j.Close(context.WithoutCancel(ctx))
		return fieldStatus("start.config_yaml", err)
	}
	c.j, c.env = j, j.Env.Name()
	if start.FromSequence != nil {
		if err := c.resume(cfg, *start.FromSequence); err != nil {
			_ = j.Close(context.WithoutCancel(ctx))
			return err
		}
	}
	c.id = start.StreamId
	s.mu.Lock()
	if c.id != "" {
		taken := s.jobs[c.id] != nil
		for o := range s.collectors {
			taken = taken || o.id == c.id
		}
		if taken {
			s.mu.Unlock()
			_ = j.Close(context.WithoutCancel(ctx))
			return status.Errorf(codes.AlreadyExists, "start.stream_id: %q names a job or an open stream already", c.id)
		}
	}
	s.collectors[c] = true
	s.mu.Unlock()
	metricCollectStreams.Inc()
	defer func() {
		metricCollectStreams.Dec()
		s.mu.Lock()
		delete(s.collectors, c)
		s.mu.Unlock()
	}()
	err = c.loop()
	if err != nil {
		cancel() // the stream failed: nobody will read in-flight groups
	}
	c.wg.Wait()
	c.mu.Lock()
	if c.failed != nil {
		err = c.failed // the cause, rather than the cancellation it led to
	}
	c.mu.Unlock()
	if cerr := j.Close(context.WithoutCancel(ctx)); cerr != nil && err == nil {
		err = toStatus(fmt.Errorf("close output: %w", cerr))
	}
	return err
}

// receive reads the trainer's messages on a goroutine so the loop can also
// react to a server shutdown. The goroutine ends when the stream does
// (grpc ends a blocked Recv once the handler has returned).
func (c *collector) receive() (<-chan *rolloutv1.CollectGroupsRequest, <-chan error) {
	msgs := make(chan *rolloutv1.CollectGroupsRequest)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := c.stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-c.ctx.Done():
				return
			}
		}
	}()
	return msgs, errc
}

// resume continues an earlier stream on the same run directory: its
// groups from sequence from on are sent first (they may have been made
// durable but never received), and `next` skips items already collected.
func (c *collector) resume(cfg runner.Config, from int64) error {
	if cfg.Output.Dir == "" {
		return status.Error(codes.InvalidArgument, "start.from_sequence: needs output.dir (the run directory to resume)")
	}
	done := map[string]bool{}
	err := replayGroups(c.ctx, cfg.Output.Dir, 0, cfg.Advantage.DropEqual, func(g *rolloutv1.Group) error {
		done[g.GroupId] = true
		if g.GetSequence() < from {
			return nil
		}
		if c.compact {
			g = CompactGroup(g)
		}
		c.sendMu.Lock()
		defer c.sendMu.Unlock()
		return c.stream.Send(&rolloutv1.CollectGroupsResponse{Msg: &rolloutv1.CollectGroupsResponse_Group{Group: g}})
	})
	if err != nil {
		return toStatus(err)
	}
	c.mu.Lock()
	c.done = done
	c.mu.Unlock()
	return nil
}

func (c *collector) loop() error {
	if err := c.status(); err != nil {
		return err
	}
	msgs, recvErr := c.receive()
	quit, done := c.s.quit, c.ctx.Done()
	for {
		select {
		case msg := <-msgs:
			if c.overQuota() {
				continue // the stream ends once its in-flight groups are sent
			}
			if err := c.handle(msg); err != nil {
				var qe *quotaError
				if !errors.As(err, &qe) {
					return err
				}
				// Past the rows quota: nothing more starts; the groups
				// already started are still delivered, then the stream
				// ends with the quota's error.
				c.mu.Lock()
				c.quotaErr, c.draining, c.queue = qe.err, true, nil
				c.mu.Unlock()
			}
			c.pump()
			if err := c.status(); err != nil {
				return err
			}
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil // the trainer is done asking: in-flight groups still arrive
			}
			return err
		case <-quit:
			quit = nil
			c.mu.Lock()
			c.draining = true
			c.mu.Unlock()
		case <-c.changed:
		case <-done:
			if !c.isDraining() {
				return status.FromContextError(c.ctx.Err()).Err()
			}
			done = nil // shutdown cancelled the in-flight groups: wait for them
		}
		if c.isDraining() && c.idle() {
			if c.overQuota() {
				c.mu.Lock()
				defer c.mu.Unlock()
				return c.quotaErr
			}
			return status.Error(codes.Unavailable, "server shutting down: every started group was sent; reconnect to the restarted server to continue")
		}
	}
}

// quotaError is a request past the tenant's rows quota.
type quotaError struct{ err error }

func (e *quotaError) Error() string { return e.err.Error() }

func (c *collector) overQuota() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.quotaErr != nil
}

// admitRows counts n more groups against the rows quota. c.mu is held.
func (c *collector) admitRows(n int) error {
	rows := c.rows + int64(n)*int64(max(c.j.Runner.Config().GroupSize, 1))
	if c.rowsLimit > 0 && rows > c.rowsLimit {
		return &quotaError{err: rowsExceeded(c.tenant, "this CollectGroups stream", rows, c.rowsLimit)}
	}
	c.rows = rows
	return nil
}

func (c *collector) isDraining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draining
}

func (c *collector) idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inFlight == 0
}

func (c *collector) handle(msg *rolloutv1.CollectGroupsRequest) error {
	switch m := msg.Msg.(type) {
	case *rolloutv1.CollectGroupsRequest_Credit:
		if tv := m.Credit.TrainerVersion; tv != nil {
			if *tv < 0 {
				return status.Error(codes.InvalidArgument, "credit.trainer_version: must not be negative")
			}
			if u := c.j.Updater(); u != nil {
				u.ObserveVersion(*tv)
			}
			if m.Credit.Groups == 0 {
				return nil
			}
		}
		if m.Credit.Groups <= 0 {
			return status.Error(codes.InvalidArgument, "credit.groups: must be positive")
		}
		c.mu.Lock()
		c.credits += int(m.Credit.Groups)
		c.mu.Unlock()
	case *rolloutv1.CollectGroupsRequest_Items:
		return c.enqueueItems(m.Items)
	case *rolloutv1.CollectGroupsRequest_Next:
		return c.enqueueNext(m.Next)
	case *rolloutv1.CollectGroupsRequest_Start:
		return status.Error(codes.InvalidArgument, "start: only the first message may be start")
	default:
		return status.Error(codes.InvalidArgument, "msg: empty message")
	}
	return nil
}

func (c *collector) groupOptions(reqID string, policy *int64, samplingJSON string, field string) (runner.GroupOptions, error) {
	o := runner.GroupOptions{PolicyVersion: policy, RequestID: reqID}
	if strings.TrimSpace(samplingJSON) != "" {
		// A deep copy of the run's sampling: decoding onto the config's
		// own pointers and maps would change the run's sampler for every
		// later group (a trainer's temperature written through
		// Sampling.Temperature).
		var smp inference.Sampling
		base, err := json.Marshal(c.j.Runner.Config().Sampling)
		if err == nil {
			err = json.Unmarshal(base, &smp)
		}
		if err != nil {
			return o, status.Errorf(codes.Internal, "copy the run's sampling: %v", err)
		}
		dec := json.NewDecoder(strings.NewReader(samplingJSON))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&smp); err != nil {
			return o, status.Errorf(codes.InvalidArgument, "%s.sampling_json: %v", field, err)
		}
		o.Sampling = &smp
	}
	return o, nil
}

func (c *collector) enqueueItems(m *rolloutv1.CollectItems) error {
	if len(m.ItemsJson) == 0 {
		return status.Error(codes.InvalidArgument, "items.items_json: at least one item is required")
	}
	o, err := c.groupOptions(m.RequestId, m.PolicyVersion, m.SamplingJson, "items")
	if err != nil {
		return err
	}
	name := "items"
	if m.RequestId != "" {
		name = "request " + m.RequestId
	}
	rows, err := datasets.ReadJSONL(strings.NewReader(strings.Join(m.ItemsJson, "\n")), name)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "items.items_json: %v", err)
	}
	dcfg := c.j.Runner.Config().Dataset
	rows, err = datasets.Prepare(rows, datasets.Config{Fields: dcfg.Fields, IDField: dcfg.IDField, Format: dcfg.Format})
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "items.items_json: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.admitRows(len(rows)); err != nil {
		return err
	}
	for _, it := range rows {
		if m.RequestId != "" {
			it.ID = m.RequestId + "/" + it.ID
		}
		c.queue = append(c.queue, pending{item: it, opts: o})
	}
	return nil
}

func (c *collector) enqueueNext(m *rolloutv1.CollectNext) error {
	if m.Count <= 0 {
		return status.Error(codes.InvalidArgument, "next.count: must be positive")
	}
	o, err := c.groupOptions(m.RequestId, m.PolicyVersion, m.SamplingJson, "next")
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.loaded {
		items, err := c.j.Runner.Items(c.ctx)
		if err != nil {
			return toStatus(err)
		}
		c.dataset, c.loaded = items, true
	}
	for range m.Count {
		for c.cursor < len(c.dataset) && c.done[c.dataset[c.cursor].Key()] {
			c.cursor++ // collected by the stream this one resumes
		}
		if c.cursor >= len(c.dataset) {
			c.exhausted = true
			break
		}
		if err := c.admitRows(1); err != nil {
			return err
		}
		c.queue = append(c.queue, pending{item: c.dataset[c.cursor], opts: o})
		c.cursor++
	}
	return nil
}

// pump starts queued groups while credits last.
func (c *collector) pump() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.credits > 0 && len(c.queue) > 0 && c.ctx.Err() == nil && !c.draining {
		p := c.queue[0]
		c.queue = c.queue[1:]
		c.credits--
		c.inFlight++
		metricCollectInFlight.Inc()
		idx := c.started
		c.started++
		c.wg.Go(func() { c.run(idx, p) })
	}
}

func (c *collector) run(idx int, p pending) {
	defer func() {
		select {
		case c.changed <- struct{}{}:
		default:
		}
	}()
	g := c.j.Runner.RunGroup(c.ctx, idx, p.item, p.opts)
	g = c.bound(idx, p, g)
	if g.StaleDropped && !interrupted(g) {
		// Outside async.max_staleness: never handed over; the credit is
		// returned so the trainer's budget is not spent on it.
		c.j.Runner.CountStale(g)
		metricStale.WithLabelValues("dropped").Inc()
		c.mu.Lock()
		c.inFlight--
		c.credits++
		c.staleDropped++
		c.staleRegenerated += g.Regenerated
		c.mu.Unlock()
		metricCollectInFlight.Dec()
		c.s.log.Info("stale group dropped", "group_id", g.ID, "err", runner.StaleError(g))
		c.pump()
		_ = c.status()
		return
	}
	if c.ctx.Err() != nil && interrupted(g) {
		// Cut short by cancellation (the stream ended, or shutdown with
		// cancel-in-flight): like the runner, never deliver a partial
		// group as if it were a result.
		c.mu.Lock()
		c.inFlight--
		c.mu.Unlock()
		metricCollectInFlight.Dec()
		return
	}
	// Deliver returns once the group is durable in the run directory (when
	// the stream has one); only then is it counted and sent.
	err := c.j.Deliver(context.WithoutCancel(c.ctx), g)
	if err == nil {
		observeGroup(c.env, "collect", g)
	}
	var pg *rolloutv1.Group
	if err == nil {
		pg, err = groupProto(c.j.Runner.Info(), g)
	}
	if err == nil && c.compact {
		pg = CompactGroup(pg)
	}
	if err != nil {
		c.mu.Lock()
		c.inFlight--
		if c.failed == nil {
			c.failed = toStatus(fmt.Errorf("group %s: %w", g.ID, err))
		}
		c.mu.Unlock()
		metricCollectInFlight.Dec()
		c.cancel() // the stream ends with the error
		return
	}
	c.sendMu.Lock()
	serr := c.stream.Send(&rolloutv1.CollectGroupsResponse{Msg: &rolloutv1.CollectGroupsResponse_Group{Group: pg}})
	c.sendMu.Unlock()
	// A group counts as in flight until it is sent, so the trainer never
	// sees more groups outstanding than it granted.
	c.mu.Lock()
	c.inFlight--
	if serr == nil {
		c.sent++
	}
	c.mu.Unlock()
	metricCollectInFlight.Dec()
	if serr == nil {
		_ = c.status()
	}
}

func (c *collector) status() error {
	c.mu.Lock()
	st := &rolloutv1.CollectStatus{Credits: int32(c.credits), InFlight: int32(c.inFlight), Queued: int32(len(c.queue)),
		Sent: int32(c.sent), Exhausted: c.exhausted, StaleDropped: int32(c.staleDropped), StaleRegenerated: int32(c.staleRegenerated),
		StaleMarked: int32(c.staleMarked)}
	if u := c.j.Updater(); u != nil {
		st.PolicyVersion = u.PolicyVersion()
	}
	c.mu.Unlock()
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.stream.Send(&rolloutv1.CollectGroupsResponse{Msg: &rolloutv1.CollectGroupsResponse_Status{Status: st}})
}

// interrupted reports a group with a rollout cut short by cancellation
// (the runner's rule for not writing a group).
func interrupted(g *runner.Group) bool {
	for i := range g.Rollouts {
		if f := g.Rollouts[i].Failure; f != nil && f.Kind == runner.FailCancelled {
			return true
		}
	}
	return false
}
