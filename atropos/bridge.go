package atropos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

var (
	// ErrConfig is wrapped by invalid Options and by a trainer
	// configuration the bridge cannot feed (a batch size the group size
	// does not divide, groups without tokens or logprobs).
	ErrConfig = errors.New("atropos bridge: invalid configuration")
	// ErrRejected is matched by API answers a retry cannot fix (4xx other
	// than 404, 408, 409, 410, 429).
	ErrRejected = errors.New("rejected by the Atropos API")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("atropos bridge closed")
)

// maxListBytes bounds one /scored_data_list body before gzip.
const maxListBytes = 16 << 20

// Bridge acts as one Atropos environment: a runner.Sink whose groups go to
// the API's /scored_data through an on-disk spool, and a runner.Admitter
// that pauses intake while the trainer's queue is full.
type Bridge struct {
	opts   Options
	api    *client
	log    *slog.Logger
	spool  *spool
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// verify wakes the control loop to check the registration now (the
	// sender saw a failure that may be an API restart).
	verify      chan struct{}
	senderDone  chan struct{}
	controlDone chan struct{}
	ownHTTP     bool
	closeOnce   sync.Once

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every state change
	st      state
}

type state struct {
	registered bool
	// suspect: a request failed in a way an API restart would explain;
	// nothing is sent until /status-env confirms the registration.
	suspect    bool
	suspectGen int64 // bumped whenever suspect is set
	down       bool  // the last control request could not reach the API
	reg        Registration
	info       Info
	status     EnvStatus
	haveStatus bool
	// deliveredAtStatus is delivered when the last /status-env request
	// was sent: groups delivered since may be missing from its queue_size.
	deliveredAtStatus int64
	throttled         bool
	reserved          int // admitted groups not yet written
	fatal             error
	stopped           error
	closing           bool
	useList           bool

	delivered, rejected, skipped int64
	registrations                int
	waitingLogged                bool
}

// Stats is a snapshot of the bridge.
type Stats struct {
	Registered    bool
	EnvID         int // valid when Registered
	Registrations int // 1 + re-registrations after API restarts
	Throttled     bool
	Down          bool // the API is unreachable right now
	QueueSize     int  // last /status-env queue_size
	CurrentStep   int  // last /status-env current_step
	BatchSize     int  // /info batch_size
	Delivered     int64
	Pending       int   // spooled, not yet accepted by the API
	Rejected      int64 // dead letters written by this bridge
	Skipped       int64 // groups not sent: equal scores, no successful rollout
}

var (
	_ runner.Sink     = (*Bridge)(nil)
	_ runner.Admitter = (*Bridge)(nil)
)

// New opens the spool in opts.SpoolDir and starts the bridge: a control
// loop that registers with the API (retrying until it is up, waiting while
// the trainer has not started), polls /status-env and re-registers after an
// API restart, and a sender that delivers spooled groups in order (groups
// left by an earlier process first). New does not wait for the
// registration: Admit does. ctx bounds the background work; Close must be
// called in any case.
func New(ctx context.Context, opts Options) (*Bridge, error) {
	opts.defaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	sp, err := openSpool(opts.SpoolDir, opts.segmentBytes)
	if err != nil {
		return nil, fmt.Errorf("atropos bridge: %w", err)
	}
	hc, own := opts.HTTPClient, false
	if hc == nil {
		// An own transport, so Close can release its idle connections.
		tr := &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true, IdleConnTimeout: 90 * time.Second}
		if dt, ok := http.DefaultTransport.(*http.Transport); ok {
			tr = dt.Clone()
		}
		hc, own = &http.Client{Transport: tr}, true
	}
	b := &Bridge{
		opts:        opts,
		api:         &client{base: opts.URL, hc: hc, timeout: opts.RequestTimeout},
		log:         opts.Logger.With("component", "atropos", "api", opts.URL),
		spool:       sp,
		verify:      make(chan struct{}, 1),
		senderDone:  make(chan struct{}),
		controlDone: make(chan struct{}),
		ownHTTP:     own,
		changed:     make(chan struct{}),
	}
	b.st.useList = opts.ListBatch > 1
	b.ctx, b.cancel = context.WithCancel(ctx)
	if n := sp.len(); n > 0 {
		b.log.Info("spool holds undelivered groups from an earlier run; they are sent first", "pending", n, "dir", opts.SpoolDir)
	}
	b.wg.Add(2)
	go b.control()
	go b.sender()
	return b, nil
}

// notify wakes every waiter; call with mu held.
func (b *Bridge) notify() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// Admit implements runner.Admitter: it blocks until the bridge is
// registered, knows the queue, the trainer's queue is below the off-policy
// bound and the spool below MaxPending, then reserves room for one group.
// It returns an error wrapping runner.ErrIntakeStopped once the trainer's
// step budget is reached, and the bridge's fatal error (a configuration
// error, a refused group) if there is one.
func (b *Bridge) Admit(ctx context.Context) error {
	for {
		b.mu.Lock()
		if err := b.admitErrLocked(); err != nil {
			b.mu.Unlock()
			return err
		}
		if b.admissibleLocked() {
			b.st.reserved++
			b.mu.Unlock()
			return nil
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-b.ctx.Done():
			return fmt.Errorf("%w: %w", ErrClosed, context.Cause(b.ctx))
		case <-ch:
		}
	}
}

func (b *Bridge) admitErrLocked() error {
	switch {
	case b.st.fatal != nil:
		return b.st.fatal
	case b.st.stopped != nil:
		return b.st.stopped
	case b.st.closing:
		return ErrClosed
	}
	return nil
}

func (b *Bridge) admissibleLocked() bool {
	return b.st.registered && b.st.haveStatus && !b.throttledLocked() &&
		b.spool.len()+b.st.reserved < b.opts.MaxPending
}

// throttledLocked applies Atropos' off-policy bound to the API's queue plus
// what this bridge added since that queue was measured and will still add:
// delivered since, undelivered and admitted groups. It errs on the side of
// pausing until the next poll.
func (b *Bridge) throttledLocked() bool {
	if !b.st.haveStatus || b.st.info.BatchSize <= 0 {
		return true
	}
	queued := b.st.status.QueueSize + int(b.st.delivered-b.st.deliveredAtStatus) + b.spool.len() + b.st.reserved
	return queued*b.opts.GroupSize >= b.opts.MaxBatchesOffPolicy*b.st.info.BatchSize
}

// WriteGroup implements runner.Sink: it converts the group to an Atropos
// ScoredDataGroup (the trajectory export's conversion, so the trainer sees
// exactly the Parquet records) and spools it durably; the sender delivers
// it. It returns once the group is on disk. A group the runner did not
// admit (trainer-driven collection) waits while the spool holds MaxPending
// groups. Groups with equal scores or no successful rollout are skipped.
// Once the bridge failed (Err), the group is still spooled, for the next
// bridge on the directory, and the failure is returned.
func (b *Bridge) WriteGroup(ctx context.Context, run *runner.RunInfo, g *runner.Group) error {
	defer b.release()
	b.mu.Lock()
	closing, reserved := b.st.closing, b.st.reserved > 0
	b.mu.Unlock()
	log := b.log.With("group", g.ID, "run", run.RunID)
	e, skip, err := b.convert(run, g)
	if err != nil {
		return err
	}
	if skip != "" {
		b.mu.Lock()
		b.st.skipped++
		b.mu.Unlock()
		log.Debug("group not sent", "reason", skip)
		if err := b.spool.markHanded([]string{g.ID}); err != nil {
			return fmt.Errorf("atropos: group %s: %w", g.ID, err)
		}
		return nil
	}
	if !reserved && !closing && b.Err() == nil {
		b.waitRoom(ctx)
	}
	if err := b.spool.append(e); err != nil {
		return fmt.Errorf("atropos: spool group %s: %w", g.ID, err)
	}
	log.Debug("group spooled", "seq", e.Seq, "sequences", e.Sequences)
	return b.Err()
}

// release turns one admission into a spooled (or skipped) group.
func (b *Bridge) release() {
	b.mu.Lock()
	if b.st.reserved > 0 {
		b.st.reserved--
	}
	b.notify()
	b.mu.Unlock()
}

// waitRoom blocks while the spool is full; it gives up (and the group is
// spooled beyond the bound, never dropped) when ctx or the bridge ends.
func (b *Bridge) waitRoom(ctx context.Context) {
	for {
		b.mu.Lock()
		full := b.spool.len()+b.st.reserved >= b.opts.MaxPending && !b.st.closing
		ch := b.changed
		b.mu.Unlock()
		if !full {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-b.ctx.Done():
			return
		case <-ch:
		}
	}
}

// convert builds the spool entry of g, or says why g is not sent.
func (b *Bridge) convert(run *runner.RunInfo, g *runner.Group) (*spoolEntry, string, error) {
	recs := make([]trajectory.Record, 0, len(g.Rollouts))
	for i := range g.Rollouts {
		// Every branch of a gateway session is its own token sequence in
		// the group (docs/atropos.md).
		rows, err := assemble.Records(run, g, &g.Rollouts[i])
		if err != nil {
			return nil, "", fmt.Errorf("atropos: %w", err)
		}
		recs = append(recs, rows...)
	}
	return b.convertRecords(g.ID, run.RunID, recs)
}

// convertRecords is convert from a group's trajectory records.
func (b *Bridge) convertRecords(groupID, runID string, recs []trajectory.Record) (*spoolEntry, string, error) {
	groups, _, err := trajectory.AtroposGroups(recs, trajectory.AtroposOptions{
		GroupSize:                 b.opts.GroupSize,
		ZeroAdvantageOnTruncation: b.opts.ZeroAdvantageOnTruncation,
		IncludeMessages:           !b.opts.OmitMessages,
	})
	if errors.Is(err, trajectory.ErrNoTokens) {
		return nil, "", b.setFatal(fmt.Errorf("%w: group %s: %w (the inference backend must run in tokens mode)", ErrConfig, groupID, err))
	}
	if err != nil {
		return nil, "", fmt.Errorf("atropos: group %s: %w", groupID, err)
	}
	if len(groups) == 0 {
		return nil, "no successful rollout", nil
	}
	sd := &groups[0]
	if !b.opts.SendEqualScores && allEqual(sd.Scores) {
		return nil, "all scores equal", nil
	}
	if sd.InferenceLogprobs == nil && !b.opts.AllowMissingLogprobs {
		return nil, "", b.setFatal(fmt.Errorf("%w: group %s has no inference_logprobs, which the Atropos GRPO trainer requires (use a backend that returns logprobs, or AllowMissingLogprobs)", ErrConfig, groupID))
	}
	data, err := marshalLine(sd)
	if err != nil {
		return nil, "", fmt.Errorf("atropos: encode group %s: %w", groupID, err)
	}
	maxLen := 0
	for _, t := range sd.Tokens {
		maxLen = max(maxLen, len(t))
	}
	return &spoolEntry{
		GroupID: groupID, RunID: runID, SpooledAt: time.Now().UTC(),
		Sequences: len(sd.Tokens), MaxLen: maxLen, Group: json.RawMessage(data[:len(data)-1]),
	}, "", nil
}

func allEqual(xs []float64) bool {
	for _, x := range xs[1:] {
		if math.Abs(x-xs[0]) > 1e-12 {
			return false
		}
	}
	return true
}

func (b *Bridge) setFatal(err error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st.fatal == nil {
		b.st.fatal = err
		b.log.Error("atropos bridge failed; intake stops", "error", err)
		b.notify()
	}
	return b.st.fatal
}

// Stats returns a snapshot of the bridge's state and counters.
func (b *Bridge) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return Stats{
		Registered: b.st.registered, EnvID: b.st.reg.EnvID, Registrations: b.st.registrations,
		Throttled: b.st.registered && b.throttledLocked(), Down: b.st.down,
		QueueSize: b.st.status.QueueSize, CurrentStep: b.st.status.CurrentStep, BatchSize: b.st.info.BatchSize,
		Delivered: b.st.delivered, Pending: b.spool.len(), Rejected: b.st.rejected, Skipped: b.st.skipped,
	}
}

// Err returns the error that stopped the bridge (nil while healthy).
func (b *Bridge) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st.fatal
}

// Close stops admitting groups, waits until the spool is delivered or ctx
// ends, stops the goroutines and waits for them, disconnects from the API
// (POST /disconnect-env) and closes the spool. Undelivered groups stay in
// SpoolDir and are sent first by the next bridge on that directory.
func (b *Bridge) Close(ctx context.Context) error {
	var err error
	b.closeOnce.Do(func() { err = b.close(ctx) })
	return err
}

func (b *Bridge) close(ctx context.Context) error {
	b.mu.Lock()
	b.st.closing = true
	b.notify()
	b.mu.Unlock()
	b.drain(ctx)
	b.cancel()
	b.wg.Wait()

	b.mu.Lock()
	registered, suspect, envID := b.st.registered, b.st.suspect, b.st.reg.EnvID
	b.mu.Unlock()
	// After a suspected restart the id may belong to another env now.
	if registered && !suspect {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := b.api.disconnectEnv(dctx, envID); err != nil {
			b.log.Warn("disconnect from the API", "env_id", envID, "error", err)
		} else {
			b.log.Info("disconnected from the API", "env_id", envID)
		}
		cancel()
	}
	if n := b.spool.len(); n > 0 {
		b.log.Warn("groups not delivered at close; they stay in the spool and are sent by the next bridge on it", "pending", n, "dir", b.opts.SpoolDir)
	}
	if b.ownHTTP {
		b.api.hc.CloseIdleConnections()
	}
	if err := b.spool.close(); err != nil {
		return fmt.Errorf("atropos: %w", err)
	}
	return nil
}

// drain waits until the sender emptied the spool, ctx ends, the bridge's
// context does, or delivery became impossible (the sender stopped on a
// disk error, the control loop on a configuration error).
func (b *Bridge) drain(ctx context.Context) {
	for {
		b.mu.Lock()
		empty := b.spool.len() == 0
		registered := b.st.registered
		ch := b.changed
		b.mu.Unlock()
		if empty {
			return
		}
		// Unregistered, nothing can be sent once the control loop gave up.
		var ctrl chan struct{}
		if !registered {
			ctrl = b.controlDone
		}
		select {
		case <-ctx.Done():
			return
		case <-b.ctx.Done():
			return
		case <-b.senderDone:
			return
		case <-ctrl:
			return
		case <-ch:
		}
	}
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// backoff is the wait before retry n (1-based): exponential from RetryMin,
// capped at RetryMax, with "equal jitter" (half fixed, half random) so
// envs restarted together do not retry in lockstep.
func (b *Bridge) backoff(n int) time.Duration {
	d := float64(b.opts.RetryMin) * math.Pow(2, float64(min(n, 30)-1))
	d = min(d, float64(b.opts.RetryMax))
	half := time.Duration(d / 2)
	if half <= 0 {
		return time.Duration(d)
	}
	return half + rand.N(half+1)
}
