package trajectory

// The writer goroutine: requests in order, rows into the open part file,
// fsync batching for durable groups, failure and shutdown.

import (
	"fmt"
	"os"
	"time"
)

func (w *Writer) loop() {
	defer close(w.done)
	defer func() {
		close(w.syncCh)
		<-w.syncDone
	}()
	tick := time.NewTicker(tickEvery(w.opts.MaxFileAge))
	defer tick.Stop()
	for {
		select {
		case req := <-w.in:
			// Take everything queued, then ask for one fsync for all of it
			// (group commit); control requests flush first.
			for {
				if req.ctrl != ctrlNone {
					w.requestSync()
				}
				switch req.ctrl {
				case ctrlNone:
					w.handleRequest(req)
				case ctrlCheckpoint:
					err := w.err()
					if err == nil {
						err = w.finishPart()
					}
					req.reply <- err
				case ctrlClose:
					w.final = w.shutdown()
					return
				}
				var more bool
				select {
				case req, more = <-w.in:
				default:
				}
				if !more {
					break
				}
			}
			w.requestSync()
		case <-tick.C:
			if w.cur != nil && w.err() == nil && time.Since(w.cur.opened) >= w.opts.MaxFileAge {
				w.finishPart()
			}
		}
	}
}

// handleRequest writes one unit: its journal frame first, then its rows.
func (w *Writer) handleRequest(req request) {
	recs := req.group
	if recs == nil {
		recs = []*Record{req.rec}
	}
	reply := func(err error) {
		if req.durable != nil {
			req.durable <- durableResult{seq: -1, err: err}
		}
	}
	if p := w.syncFailed.Load(); p != nil {
		w.fail(*p)
	}
	if err := w.err(); err != nil {
		w.manifest.Counts.Lost += int64(len(recs))
		reply(err)
		return
	}
	if w.cur == nil {
		if err := w.openPartNamed("", !w.opts.NoJournal); err != nil {
			w.fail(err)
			w.manifest.Counts.Lost += int64(len(recs))
			reply(err)
			return
		}
	}
	p := w.cur
	if j := p.journal; j != nil {
		frame, err := req.frame, error(nil)
		if frame == nil {
			frame, err = encodeFrame(recs)
		}
		if err == nil {
			var n int
			n, err = j.f.Write(frame)
			j.bytes += int64(n)
			w.journalBytes.Add(int64(n))
		}
		if err != nil {
			err = fmt.Errorf("append to journal %s: %w", j.path, err)
			w.fail(err)
			reply(err)
			return
		}
		seq := w.groups
		if w.cur.rows > 0 && recs[0].GroupID == w.lastGroup {
			seq-- // continues the group of the previous unit
		}
		if req.durable != nil {
			w.pending = append(w.pending, req.durable)
			w.pendingSeq = append(w.pendingSeq, seq)
		}
		p.journaled += int64(len(recs))
	} else {
		reply(nil)
	}
	for i, rec := range recs {
		w.handleRecord(rec, i == len(recs)-1)
	}
}

// requestSync hands the waiters of the frames written since the last call
// to the sync goroutine.
func (w *Writer) requestSync() {
	if len(w.pending) == 0 {
		return
	}
	w.syncCh <- syncReq{j: w.cur.journal, waiters: w.pending, seqs: w.pendingSeq}
	w.pending, w.pendingSeq = nil, nil
}

// syncBarrier waits until every journal fsync requested so far is done.
func (w *Writer) syncBarrier() {
	w.requestSync()
	b := make(chan struct{})
	w.syncCh <- syncReq{barrier: b}
	<-b
}

// syncLoop fsyncs journals for the writer goroutine, so that encoding the
// next groups overlaps the fsync of the previous ones; requests queued
// meanwhile share one fsync.
func (w *Writer) syncLoop() {
	defer close(w.syncDone)
	for req := range w.syncCh {
		if req.barrier != nil {
			close(req.barrier)
			continue
		}
		batch := []syncReq{req}
		var barrier chan struct{}
	more:
		for {
			select {
			case r, ok := <-w.syncCh:
				if !ok {
					break more
				}
				if r.barrier != nil {
					barrier = r.barrier
					break more
				}
				batch = append(batch, r)
			default:
				break more
			}
		}
		var err error
		if p := w.syncFailed.Load(); p != nil {
			err = *p
		} else {
			synced := map[*journalFile]bool{}
			for _, r := range batch {
				if synced[r.j] {
					continue
				}
				synced[r.j] = true
				if serr := r.j.f.Sync(); serr != nil {
					err = fmt.Errorf("sync journal %s: %w", r.j.path, serr)
					w.syncFailed.Store(&err)
					break
				}
			}
		}
		for _, r := range batch {
			for i, c := range r.waiters {
				res := durableResult{seq: r.seqs[i], err: err}
				if err != nil {
					res.seq = -1
				}
				c <- res
			}
		}
		if barrier != nil {
			close(barrier)
		}
	}
}

func tickEvery(age time.Duration) time.Duration {
	t := age / 4
	if t < 10*time.Millisecond {
		t = 10 * time.Millisecond
	}
	if t > 15*time.Second {
		t = 15 * time.Second
	}
	return t
}

// handleRecord appends rec to the current part file; rotation is
// considered only at the end of a unit (a lone record or a group's last).
func (w *Writer) handleRecord(rec *Record, unitEnd bool) {
	if w.err() != nil {
		if w.cur == nil || w.cur.journal == nil {
			w.manifest.Counts.Lost++
		}
		return
	}
	if err := w.appendRow(rec); err != nil {
		w.fail(err)
		return
	}
	p := w.cur
	if unitEnd && (p.rows >= w.opts.MaxRowsPerFile || p.out.n >= w.opts.MaxBytesPerFile) {
		w.finishPart()
	}
}

// appendRow writes rec to the open part file.
func (w *Writer) appendRow(rec *Record) error {
	p := w.cur
	if _, err := p.pw.Write([]Record{*rec}); err != nil {
		return fmt.Errorf("write %s: %w", p.tmp, err)
	}
	if p.rows == 0 || rec.GroupID != w.lastGroup {
		w.groups++
		p.groups++
	}
	w.lastGroup = rec.GroupID
	p.rows++
	p.rowsInGroup++
	p.tokens += int64(len(rec.Tokens))
	if rec.Status == StatusOK {
		p.ok++
	} else {
		p.infra++
	}
	sampled, unscored := sampledTokens(rec)
	p.sampled += sampled
	p.unscored += unscored
	p.groupBytes += estimateBytes(rec)
	if p.rowsInGroup >= w.opts.RowGroupRows || p.groupBytes >= w.opts.RowGroupBytes {
		if err := p.pw.Flush(); err != nil {
			return fmt.Errorf("flush row group of %s: %w", p.tmp, err)
		}
		p.rowsInGroup, p.groupBytes = 0, 0
	}
	return nil
}

// estimateBytes approximates the in-memory footprint of a record's columns.
func estimateBytes(r *Record) int64 {
	n := int64(len(r.Tokens))*13 + int64(len(r.Messages)+len(r.Tools)+len(r.SamplingParams)) + 256
	for _, te := range r.ToolErrors {
		n += int64(len(te.Message)) + 32
	}
	return n
}

// fail makes err sticky: intake stops, the open part file is dropped (its
// rows counted as lost) and run.json is marked failed if it can be written.
func (w *Writer) fail(err error) {
	if w.err() != nil {
		return
	}
	w.failed.Store(&err)
	metricErrors.Inc()
	w.log.Error("trajectory writer failed; intake stopped", "err", err)
	if p := w.cur; p != nil {
		if p.journal != nil {
			// Acknowledged groups stay in the journal: a resume compacts
			// them. The frames of groups not yet acknowledged get the error.
			w.syncBarrier()
			p.journal.f.Close()
		} else {
			w.manifest.Counts.Lost += p.rows
		}
		w.cur = nil
		p.f.Close()
		os.Remove(p.tmp)
	}
	w.manifest.State = RunFailed
	w.manifest.Error = err.Error()
	w.manifest.UpdatedAt = time.Now().UTC()
	if merr := w.saveManifest(); merr != nil {
		w.log.Error("cannot record failure in run.json", "err", merr)
	}
}

func (w *Writer) shutdown() error {
	// Drain records queued before Close took the lock.
	for {
		select {
		case req := <-w.in:
			switch req.ctrl {
			case ctrlNone:
				w.handleRequest(req)
			case ctrlCheckpoint:
				req.reply <- ErrClosed
			}
			continue
		default:
		}
		break
	}
	w.requestSync()
	if err := w.err(); err != nil {
		// Best effort: record the final lost count next to the failure.
		w.manifest.UpdatedAt = time.Now().UTC()
		if merr := w.saveManifest(); merr != nil {
			w.log.Error("cannot update run.json after failure", "err", merr)
		}
		if w.manifest.Counts.Lost > 0 {
			return fmt.Errorf("%w (%d records lost)", err, w.manifest.Counts.Lost)
		}
		return err
	}
	if err := w.finishPart(); err != nil {
		return err
	}
	w.manifest.State = RunClosed
	w.manifest.UpdatedAt = time.Now().UTC()
	if err := w.saveManifest(); err != nil {
		w.fail(fmt.Errorf("close run.json: %w", err))
		return w.err()
	}
	return nil
}
