package atropos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	"github.com/rollout-rl/rollout/runner"
)

// control registers the env and runs the /status-env loop until the
// bridge's context ends.
func (b *Bridge) control() {
	defer b.wg.Done()
	ctx := b.ctx
	defer close(b.controlDone)
	timer := time.NewTimer(b.opts.PollInterval)
	defer timer.Stop()
	lost := 0 // registrations in a row whose env_id the API disowned at once
	for ctx.Err() == nil {
		b.mu.Lock()
		registered, fatal := b.st.registered, b.st.fatal
		b.mu.Unlock()
		if fatal != nil && errors.Is(fatal, ErrConfig) {
			return // nothing to poll for: the run cannot be fed
		}
		if !registered {
			if err := b.register(ctx); err != nil {
				if ctx.Err() == nil {
					b.setFatal(err)
				}
				return
			}
		}
		if !b.poll(ctx) {
			// The API forgot the env: register again now, unless it keeps
			// disowning fresh registrations (a sick API), then back off.
			if lost++; lost > 1 && !sleep(ctx, b.backoff(lost)) {
				return
			}
			continue
		}
		b.mu.Lock()
		if b.st.haveStatus {
			lost = 0
		}
		b.mu.Unlock()
		timer.Reset(b.opts.PollInterval)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-b.verify:
		}
	}
}

// register loops on POST /register-env until the API accepts the env:
// through connection errors and 5xx while the API is down, and through
// "wait for trainer to start" until the trainer's first GET /batch. Then it
// reads /info. It fails only on ctx or a configuration the trainer cannot
// take.
func (b *Bridge) register(ctx context.Context) error {
	req := registerEnvRequest{
		MaxTokenLength: b.opts.MaxTokenLength, DesiredName: b.opts.Name, Weight: b.opts.Weight,
		GroupSize: b.opts.GroupSize, MinBatchAllocation: b.opts.MinBatchAllocation,
	}
	var reg Registration
	for failures := 0; ; {
		var err error
		reg, err = b.api.registerEnv(ctx, req)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := b.opts.RegisterInterval
		switch {
		case err == nil && reg.Status == "success":
		case err == nil && reg.Status == statusWaitForTrainer:
			b.mu.Lock()
			b.st.down = false
			if !b.st.waitingLogged {
				b.st.waitingLogged = true
				b.log.Info("API up; waiting for the trainer to start (its first GET /batch)")
			}
			b.mu.Unlock()
		case errors.Is(err, ErrRejected):
			return fmt.Errorf("%w: register-env refused: %w", ErrConfig, err)
		default:
			if err == nil {
				err = fmt.Errorf("POST %s: unexpected status %q", pathRegisterEnv, reg.Status)
			}
			failures++
			b.markDown(err, failures == 1)
			wait = b.backoff(failures)
		}
		if err == nil && reg.Status == "success" {
			break
		}
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
	}
	var info Info
	for failures := 0; ; {
		var err error
		info, err = b.api.info(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil && info.BatchSize > 0 {
			break
		}
		if err == nil {
			err = fmt.Errorf("GET %s: batch_size %d: the trainer has not registered", pathInfo, info.BatchSize)
		}
		failures++
		b.markDown(err, failures == 1)
		if !sleep(ctx, b.backoff(failures)) {
			return ctx.Err()
		}
	}
	if g := b.opts.GroupSize; g > info.BatchSize || info.BatchSize%g != 0 {
		return fmt.Errorf("%w: group size %d must divide the trainer's batch size %d, or Atropos never packs its groups into a batch", ErrConfig, g, info.BatchSize)
	}
	b.mu.Lock()
	b.st.registered, b.st.suspect, b.st.down, b.st.waitingLogged = true, false, false, false
	b.st.reg, b.st.info, b.st.haveStatus = reg, info, false
	b.st.registrations++
	n := b.st.registrations
	b.notify()
	b.mu.Unlock()
	b.log.Info("registered with the Atropos API", "env_id", reg.EnvID, "wandb_name", reg.WandbName,
		"batch_size", info.BatchSize, "max_token_len", info.MaxTokenLen, "starting_step", reg.StartingStep,
		"num_steps", reg.NumSteps, "registration", n, "pending", b.spool.len())
	return nil
}

// markDown records that the API could not be reached; the first failure of
// a streak is logged at warn, the rest at debug.
func (b *Bridge) markDown(err error, first bool) {
	b.mu.Lock()
	b.st.down = true
	b.mu.Unlock()
	if first {
		b.log.Warn("Atropos API unavailable; retrying", "error", err)
	} else {
		b.log.Debug("Atropos API still unavailable", "error", err)
	}
}

// poll runs one /status-env round: it updates the throttle and stop state
// and detects an API restart (the env_id is unknown, or current_step went
// backwards), after which the env registers again. It reports false when
// the registration was dropped.
func (b *Bridge) poll(ctx context.Context) bool {
	b.mu.Lock()
	envID, wasDown, delivered, gen := b.st.reg.EnvID, b.st.down, b.st.delivered, b.st.suspectGen
	b.mu.Unlock()
	st, err := b.api.statusEnv(ctx, envID)
	if ctx.Err() != nil {
		return true
	}
	if err != nil {
		if unknownEnv(err) {
			// Atropos answers an unknown env_id with a 500 (IndexError);
			// tell that apart from a sick API with /info.
			if _, ierr := b.api.info(ctx); ierr == nil {
				b.unregister(fmt.Sprintf("the API does not know env_id %d any more (restarted?): %v", envID, err))
				return false
			}
		}
		b.suspect()
		b.markDown(err, !wasDown)
		return true
	}
	b.mu.Lock()
	if prev := b.st.status.CurrentStep; b.st.haveStatus && st.CurrentStep < prev {
		b.mu.Unlock()
		b.unregister(fmt.Sprintf("current_step went back from %d to %d: the API restarted", prev, st.CurrentStep))
		return false
	}
	defer b.mu.Unlock()
	if wasDown {
		b.log.Info("Atropos API reachable again", "env_id", envID, "pending", b.spool.len())
	}
	b.st.status, b.st.haveStatus, b.st.down = st, true, false
	b.st.deliveredAtStatus = delivered
	// A failure seen after this request left may be a restart this answer
	// predates: only a later poll may clear it.
	if b.st.suspectGen == gen {
		b.st.suspect = false
	}
	if t := b.throttledLocked(); t != b.st.throttled {
		b.st.throttled = t
		if t {
			b.log.Info("trainer queue full: pausing intake (running rollouts continue)", "queue_size", st.QueueSize,
				"pending", b.spool.len(), "admitted", b.st.reserved, "batch_size", b.st.info.BatchSize)
		} else {
			b.log.Info("trainer queue has room: resuming intake", "queue_size", st.QueueSize, "pending", b.spool.len())
		}
	}
	total := b.opts.TotalSteps
	if total == 0 {
		total = b.st.reg.NumSteps
	}
	if b.st.stopped == nil && total > 0 && st.CurrentStep+st.QueueSize*b.opts.GroupSize/b.st.info.BatchSize > total {
		b.st.stopped = fmt.Errorf("atropos: trainer at step %d with %d groups queued reaches its %d steps: %w",
			st.CurrentStep, st.QueueSize, total, runner.ErrIntakeStopped)
		b.log.Info("trainer step budget reached; stopping intake", "current_step", st.CurrentStep, "total_steps", total)
	}
	b.notify()
	return true
}

// suspect holds sending until a /status-env poll that starts after now
// confirms the registration.
func (b *Bridge) suspect() {
	b.mu.Lock()
	b.st.suspect = true
	b.st.suspectGen++
	b.mu.Unlock()
}

// unregister forgets the registration; the control loop registers again
// and the sender holds spooled groups until then.
func (b *Bridge) unregister(why string) {
	b.mu.Lock()
	envID := b.st.reg.EnvID
	b.st.registered, b.st.haveStatus, b.st.suspect = false, false, true
	b.st.suspectGen++
	b.notify()
	b.mu.Unlock()
	b.log.Warn("re-registering with the Atropos API", "old_env_id", envID, "reason", why)
}

// checkRegistration asks the control loop to poll now.
func (b *Bridge) checkRegistration() {
	select {
	case b.verify <- struct{}{}:
	default:
	}
}

// sender delivers spooled groups in order until the bridge's context ends.
func (b *Bridge) sender() {
	defer b.wg.Done()
	defer close(b.senderDone)
	ctx := b.ctx
	failures := 0
	forceSingle := 0 // send this many entries one by one (a list was refused)
	for {
		envID, list, ok := b.waitSendable(ctx)
		if !ok {
			return
		}
		n := 1
		if list && forceSingle == 0 {
			n = b.opts.ListBatch
		}
		refs, entries, groups, err := b.nextBatch(n)
		if err != nil {
			b.setFatal(err)
			return
		}
		if len(refs) == 0 {
			continue
		}
		path := pathScoredData
		if len(refs) > 1 {
			path = pathScoredDataList
		}
		body, err := scoredBody(groups, envID, len(refs) > 1)
		if err != nil {
			b.setFatal(fmt.Errorf("atropos: group %s: %w", entries[0].GroupID, err))
			return
		}
		reply, err := b.api.postScored(ctx, path, body)
		if ctx.Err() != nil {
			return
		}
		var ae *APIError
		switch {
		case err == nil:
			if err := b.delivered(refs); err != nil {
				b.setFatal(err)
				return
			}
			failures = 0
			forceSingle = max(0, forceSingle-len(refs))
			b.log.Debug("groups delivered", "env_id", envID, "groups", len(refs), "first", entries[0].GroupID,
				"status", reply.Status, "bytes_gzip", len(body))
			if reply.GroupsProcessed != nil && *reply.GroupsProcessed != len(refs) {
				b.log.Warn("the API processed a different number of groups than sent", "sent", len(refs), "processed", *reply.GroupsProcessed)
			}
		case path == pathScoredDataList && errors.As(err, &ae) && (ae.Status == http.StatusNotFound || ae.Status == http.StatusMethodNotAllowed):
			// Atropos removed /scored_data_list once (PR #223) and restored it.
			b.log.Info("the API has no /scored_data_list; sending groups one by one", "error", err)
			b.mu.Lock()
			b.st.useList = false
			b.mu.Unlock()
		case errors.Is(err, ErrRejected) && path == pathScoredDataList:
			// Find the refused group: resend this batch one group at a time.
			forceSingle = len(refs)
		case errors.Is(err, ErrRejected):
			errors.As(err, &ae)
			b.deadLetter(refs[0], &entries[0], ae.Status, err.Error(), !b.opts.ContinueOnReject)
			forceSingle = max(0, forceSingle-1)
		default:
			// 5xx, 404/409/410, 408/429, connection errors: maybe a restart.
			// Hold everything until /status-env confirms the env_id.
			failures++
			b.suspect()
			b.checkRegistration()
			if failures == 1 {
				b.log.Warn("sending groups failed; they stay spooled and are retried", "env_id", envID,
					"group", entries[0].GroupID, "groups", len(refs), "error", err)
			} else {
				b.log.Debug("sending groups failed again", "attempt", failures, "error", err)
			}
			if !sleep(ctx, b.backoff(failures)) {
				return
			}
		}
	}
}

// nextBatch reads up to n spooled groups to send together, in order. A
// group that fails the pre-send check ends the batch before it; when it is
// the first, it goes to the dead letters and the batch is empty.
func (b *Bridge) nextBatch(n int) ([]entryRef, []spoolEntry, []json.RawMessage, error) {
	refs := b.spool.peek(n, maxListBytes)
	entries := make([]spoolEntry, 0, len(refs))
	groups := make([]json.RawMessage, 0, len(refs))
	for i, ref := range refs {
		e, err := b.spool.read(ref)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("atropos: %w", err)
		}
		if reason := b.precheck(&e); reason != "" {
			if i == 0 {
				b.deadLetter(ref, &e, 0, reason, false)
			}
			refs = refs[:i]
			break
		}
		entries = append(entries, e)
		groups = append(groups, e.Group)
	}
	return refs, entries, groups, nil
}

// delivered acks the groups the API accepted and counts them, under mu
// together: the throttle must never see a delivered group in neither
// pending nor delivered.
func (b *Bridge) delivered(refs []entryRef) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.spool.ack(refs); err != nil {
		return fmt.Errorf("atropos: %w", err)
	}
	b.st.delivered += int64(len(refs))
	b.notify()
	return nil
}

// waitSendable blocks until there is something to send and a confirmed
// registration to send it with.
func (b *Bridge) waitSendable(ctx context.Context) (envID int, list, ok bool) {
	for {
		b.mu.Lock()
		ready := b.st.registered && !b.st.suspect && b.spool.len() > 0
		envID, list = b.st.reg.EnvID, b.st.useList
		ch := b.changed
		b.mu.Unlock()
		if ready {
			return envID, list, true
		}
		select {
		case <-ctx.Done():
			return 0, false, false
		case <-ch:
		}
	}
}

// precheck refuses, before sending, a group the trainer would drop: one
// with a sequence of at least the trainer's max_token_len tokens.
func (b *Bridge) precheck(e *spoolEntry) string {
	b.mu.Lock()
	limit := b.st.info.MaxTokenLen
	b.mu.Unlock()
	if limit > 0 && e.MaxLen >= limit {
		return fmt.Sprintf("a sequence of %d tokens reaches the trainer's max_token_len %d", e.MaxLen, limit)
	}
	return ""
}

// deadLetter moves the oldest spooled group to rejected.jsonl with the
// reason; fatal also stops intake with the reason.
func (b *Bridge) deadLetter(ref entryRef, e *spoolEntry, status int, reason string, fatal bool) {
	if err := b.spool.reject(ref, e, status, reason); err != nil {
		b.setFatal(fmt.Errorf("atropos: dead letter for group %s: %w", e.GroupID, err))
		return
	}
	b.log.Error("group refused; kept in the spool's dead letters", "group", e.GroupID, "seq", e.Seq,
		"status", status, "reason", reason, "file", filepath.Join(b.opts.SpoolDir, rejectedName))
	b.mu.Lock()
	defer b.mu.Unlock()
	b.st.rejected++
	if fatal && b.st.fatal == nil {
		b.st.fatal = fmt.Errorf("atropos: group %s %w: %s (kept in %s)", e.GroupID, ErrRejected, reason, filepath.Join(b.opts.SpoolDir, rejectedName))
		b.log.Error("atropos bridge failed; intake stops", "error", b.st.fatal)
	}
	b.notify()
}
