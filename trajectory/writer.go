package trajectory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress/zstd"
)

// WriterOptions configures a Writer. Zero values take the defaults noted.
type WriterOptions struct {
	// RunID is stamped on records that have none.
	RunID string
	// Config is stored verbatim in run.json (the run's effective config).
	Config json.RawMessage
	// Versions (service version, commit, model, …) are stored in run.json.
	Versions map[string]string
	// Sampler is the run's effective sampler (run.json "sampler"); a JSON
	// object, e.g. an inference.SamplerReport. SetSampler replaces it later.
	Sampler json.RawMessage

	// MaxRowsPerFile rotates the part file after this many rows (10,000).
	MaxRowsPerFile int64
	// MaxBytesPerFile rotates the part file once this many bytes have been
	// written to it (256 MiB). Checked after each row group flush.
	MaxBytesPerFile int64
	// MaxFileAge rotates a non-empty part file this long after its first row
	// (5 minutes), bounding what a crash can lose in a slow run.
	MaxFileAge time.Duration
	// RowGroupRows bounds the rows buffered in memory per row group (1,000).
	RowGroupRows int64
	// RowGroupBytes bounds the estimated bytes buffered per row group
	// (64 MiB); long token sequences flush sooner than RowGroupRows.
	RowGroupBytes int64
	// QueueSize is the capacity of the channel feeding the writer goroutine
	// (64). A full queue blocks Write: back-pressure to the runner.
	QueueSize int
	// Logger receives rotation and failure logs (slog.Default()).
	Logger *slog.Logger
	// NoJournal turns the journal off (durability off): WriteGroup then
	// returns once the group is queued, and a crash loses every record not
	// yet in a finished part file. For measurements and throwaway runs.
	NoJournal bool
}

func (o *WriterOptions) defaults() {
	if o.MaxRowsPerFile <= 0 {
		o.MaxRowsPerFile = 10_000
	}
	if o.MaxBytesPerFile <= 0 {
		o.MaxBytesPerFile = 256 << 20
	}
	if o.MaxFileAge <= 0 {
		o.MaxFileAge = 5 * time.Minute
	}
	if o.RowGroupRows <= 0 {
		o.RowGroupRows = 1_000
	}
	if o.RowGroupBytes <= 0 {
		o.RowGroupBytes = 64 << 20
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 64
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// ErrClosed is returned by Write and Checkpoint after Close.
var ErrClosed = errors.New("trajectory writer closed")

// Writer appends records to rolling Parquet part files in one run directory.
// A single goroutine owns the files; Write hands records to it through a
// bounded channel. Part files are written as hidden temp files and become
// visible (fsynced, renamed, directory fsynced) only when complete. Every
// record is also appended to the part's journal (journal.go) and fsynced
// there before WriteGroup returns, so a crash loses nothing that was
// acknowledged: NewWriter compacts the journal into its part file on resume,
// and readers (Open) see finished parts and journals as one run.
//
// Write is safe for concurrent use. After a write error (disk full, I/O
// error) the writer stops accepting records: Write, Checkpoint and Close
// return the error, finished files stay readable and run.json records the
// failure.
type Writer struct {
	dir  string
	opts WriterOptions
	log  *slog.Logger

	mu     sync.RWMutex
	closed bool
	in     chan request

	failed atomic.Pointer[error]
	done   chan struct{}
	final  error // set before done is closed

	// owned by the goroutine
	manifest   RunManifest
	next       int
	cur        *partFile
	pending    []chan durableResult // waiters of frames written since the last sync request
	pendingSeq []int64              // their sequence numbers
	// groups is the sequence number of the next group: groups are counted
	// in read order, a new one starting wherever the group id changes or a
	// file begins (Run.EachGroup counts the same way).
	groups    int64
	lastGroup string

	syncCh       chan syncReq
	syncDone     chan struct{}
	syncFailed   atomic.Pointer[error]
	journalBytes atomic.Int64

	samplerMu sync.Mutex
	sampler   json.RawMessage // pending SetSampler value; nil: none
}

// syncReq asks the sync goroutine to fsync a journal and then answer its
// waiters; a request with barrier set only closes it once every earlier
// request is done.
type syncReq struct {
	j       *journalFile
	waiters []chan durableResult
	seqs    []int64
	barrier chan struct{}
}

type durableResult struct {
	seq int64
	err error
}

type request struct {
	rec   *Record
	group []*Record // a batch that rotation never splits (WriteGroup)
	ctrl  ctrlKind
	reply chan error
	// frame is the unit's journal frame, encoded by the caller.
	frame []byte
	// durable, when set, receives the group's sequence number once the
	// records are durable (journal fsynced), or the error that kept them
	// from it.
	durable chan durableResult
}

type ctrlKind int

const (
	ctrlNone ctrlKind = iota
	ctrlCheckpoint
	ctrlClose
)

var partName = regexp.MustCompile(`^part-(\d{5,})\.parquet$`)

// NewWriter opens (creating if needed) the run directory dir and starts the
// writer goroutine. If dir already holds a run, its manifest, files and counts
// are kept and new part files continue the numbering (resume). Leftover temp
// files from a crash are removed: they were never part of the run.
// The caller must call Close, even after an error from Write.
func NewWriter(ctx context.Context, dir string, opts WriterOptions) (*Writer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	opts.defaults()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create run dir %s: %w", dir, err)
	}
	w := &Writer{
		dir:      dir,
		opts:     opts,
		log:      opts.Logger.With("run_id", opts.RunID, "dir", dir),
		in:       make(chan request, opts.QueueSize),
		done:     make(chan struct{}),
		syncCh:   make(chan syncReq, 2*opts.QueueSize),
		syncDone: make(chan struct{}),
	}
	now := time.Now().UTC()
	if m, err := ReadManifest(dir); err == nil {
		w.manifest = *m
		if opts.RunID != "" && m.RunID != "" && m.RunID != opts.RunID {
			return nil, fmt.Errorf("run dir %s belongs to run %q, not %q", dir, m.RunID, opts.RunID)
		}
	} else if !errors.Is(err, ErrNoManifest) {
		return nil, fmt.Errorf("resume run dir: %w", err)
	} else {
		w.manifest = RunManifest{CreatedAt: now, Files: []FileEntry{}}
	}
	w.manifest.SchemaVersion = SchemaVersion
	if w.manifest.RunID == "" {
		w.manifest.RunID = opts.RunID
	}
	if opts.Config != nil {
		w.manifest.Config = opts.Config
	}
	if opts.Versions != nil {
		w.manifest.Versions = opts.Versions
	}
	if opts.Sampler != nil {
		w.manifest.Sampler = opts.Sampler
	}
	w.manifest.State = RunRunning
	w.manifest.Error = ""
	w.manifest.UpdatedAt = now

	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list run dir %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if isTempName(name) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return nil, fmt.Errorf("remove stale temp file: %w", err)
			}
			continue
		}
		if m := partName.FindStringSubmatch(name); m != nil {
			n, _ := strconv.Atoi(m[1])
			if n >= w.next {
				w.next = n + 1
			}
		}
	}
	if err := w.adoptUnlisted(); err != nil {
		return nil, err
	}
	if err := w.countGroups(); err != nil {
		return nil, err
	}
	if err := w.recoverJournals(); err != nil {
		return nil, err
	}
	if err := writeManifest(dir, &w.manifest); err != nil {
		return nil, fmt.Errorf("start run dir %s: %w", dir, err)
	}
	go w.syncLoop()
	go w.loop()
	return w, nil
}

// countGroups sets the next group sequence number from run.json; files
// listed by an older release without a group count are read.
func (w *Writer) countGroups() error {
	w.groups = 0
	for i := range w.manifest.Files {
		fe := &w.manifest.Files[i]
		if fe.Groups == 0 && fe.Rows > 0 {
			n, err := countFileGroups(filepath.Join(w.dir, fe.Name))
			if err != nil {
				return fmt.Errorf("resume run dir: %w", err)
			}
			fe.Groups = n
		}
		w.groups += fe.Groups
	}
	return nil
}

func countFileGroups(path string) (int64, error) {
	f, err := OpenFile(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var n int64
	last, first := "", true
	err = f.Each(context.Background(), func(rec *Record) error {
		if first || rec.GroupID != last {
			n++
		}
		first, last = false, rec.GroupID
		return nil
	})
	return n, err
}

// recoverJournals compacts the journals a crash left without their part
// file into that part file, and deletes journals whose part file exists
// (the crash came between the rename and the delete).
func (w *Writer) recoverJournals() error {
	pending, obsolete, maxNum, err := pendingJournals(w.dir)
	if err != nil {
		return fmt.Errorf("list run dir %s: %w", w.dir, err)
	}
	for _, name := range obsolete {
		if err := os.Remove(filepath.Join(w.dir, name)); err != nil {
			return fmt.Errorf("remove compacted journal: %w", err)
		}
	}
	if maxNum >= w.next {
		w.next = maxNum + 1
	}
	for _, name := range pending {
		path := filepath.Join(w.dir, name)
		recs, st, err := ReadJournal(path, w.log)
		if err != nil {
			return fmt.Errorf("resume run dir: %w", err)
		}
		if len(recs) > 0 {
			if err := w.openPartNamed(partOfJournal(name), false); err != nil {
				return fmt.Errorf("resume run dir: compact %s: %w", name, err)
			}
			for i := range recs {
				if err := w.appendRow(&recs[i]); err != nil {
					return fmt.Errorf("resume run dir: compact %s: %w", name, err)
				}
			}
			if err := w.finishPart(); err != nil {
				return fmt.Errorf("resume run dir: compact %s: %w", name, err)
			}
			w.log.Info("trajectory journal compacted into its part file", "journal", name, "groups", st.Frames, "rows", st.Records)
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove compacted journal: %w", err)
		}
	}
	if len(pending) > 0 {
		if err := syncDir(w.dir); err != nil {
			return err
		}
	}
	return nil
}

// adoptUnlisted adds finished part files that a crash left out of run.json
// (renamed, manifest not yet rewritten) so that counts stay exact on resume.
func (w *Writer) adoptUnlisted() error {
	names, err := partFiles(w.dir)
	if err != nil {
		return fmt.Errorf("list run dir %s: %w", w.dir, err)
	}
	listed := map[string]bool{}
	for _, fe := range w.manifest.Files {
		listed[fe.Name] = true
	}
	for _, name := range names {
		if listed[name] {
			continue
		}
		path := filepath.Join(w.dir, name)
		f, err := OpenFile(path)
		if err != nil {
			return fmt.Errorf("resume run dir: %w", err)
		}
		fe := FileEntry{Name: name, FinishedAt: time.Now().UTC()}
		var ok, infra int64
		last := ""
		err = f.Each(context.Background(), func(rec *Record) error {
			if fe.Rows == 0 || rec.GroupID != last {
				fe.Groups++
			}
			last = rec.GroupID
			fe.Rows++
			fe.TokenValues += int64(len(rec.Tokens))
			if rec.Status == StatusOK {
				ok++
			} else {
				infra++
			}
			return nil
		})
		f.Close()
		if err != nil {
			return fmt.Errorf("resume run dir: %w", err)
		}
		if st, err := os.Stat(path); err == nil {
			fe.Bytes = st.Size()
		}
		w.manifest.Files = append(w.manifest.Files, fe)
		w.manifest.Counts.Rows += fe.Rows
		w.manifest.Counts.OK += ok
		w.manifest.Counts.InfraFailed += infra
		w.log.Warn("adopted part file missing from run.json", "file", name, "rows", fe.Rows)
	}
	return nil
}

func isTempName(name string) bool {
	return len(name) > 0 && name[0] == '.' && filepath.Ext(name) == ".tmp"
}

// Dir returns the run directory.
func (w *Writer) Dir() string { return w.dir }

// Write queues rec for the current part file. It blocks while the queue is
// full (back-pressure) until ctx is done. An invalid record is refused with
// ErrInvalidRecord and does not stop the writer. A nil return means the
// record was accepted into memory; it becomes durable (journal fsynced)
// moments later without the caller waiting for it. Use WriteGroup to know.
func (w *Writer) Write(ctx context.Context, rec Record) error {
	if err := w.prepare(&rec); err != nil {
		return err
	}
	req := request{rec: &rec}
	if !w.opts.NoJournal {
		var err error
		if req.frame, err = encodeFrame([]*Record{&rec}); err != nil {
			return err
		}
	}
	return w.send(ctx, req)
}

// encodeFrame encodes the journal frame of one unit.
func encodeFrame(recs []*Record) ([]byte, error) {
	var buf bytes.Buffer
	if err := appendFrame(&buf, recs); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteGroup writes the records of one GRPO group as a unit: they land in
// the same part file (rotation happens only between units) and in one
// journal frame, so a crash leaves either the whole group on disk or none
// of it, and resume never sees a partial group. Every record is validated
// first; one invalid record refuses the whole group.
//
// WriteGroup returns nil only once the group is durable: its journal frame
// written and fsynced (groups written concurrently share one fsync). With
// NoJournal it returns once the group is queued.
func (w *Writer) WriteGroup(ctx context.Context, recs []Record) error {
	_, err := w.WriteGroupSeq(ctx, recs)
	return err
}

// WriteGroupSeq is WriteGroup that also returns the group's sequence
// number: its 0-based position among the groups of the run directory in
// the order Run.EachGroup reads them (-1 with NoJournal, or for an empty
// group).
func (w *Writer) WriteGroupSeq(ctx context.Context, recs []Record) (int64, error) {
	batch := make([]*Record, len(recs))
	for i := range recs {
		rec := recs[i]
		if err := w.prepare(&rec); err != nil {
			return -1, err
		}
		batch[i] = &rec
	}
	if len(batch) == 0 {
		return -1, nil
	}
	if w.opts.NoJournal {
		return -1, w.send(ctx, request{group: batch})
	}
	frame, err := encodeFrame(batch)
	if err != nil {
		return -1, err
	}
	durable := make(chan durableResult, 1)
	start := time.Now()
	if err := w.send(ctx, request{group: batch, frame: frame, durable: durable}); err != nil {
		return -1, err
	}
	select {
	case res := <-durable:
		if res.err == nil {
			metricDurableWait.Observe(time.Since(start).Seconds())
		}
		return res.seq, res.err
	case <-ctx.Done():
		return -1, fmt.Errorf("write trajectory group: waiting for the journal: %w", ctx.Err())
	}
}

// Journaled reports whether WriteGroup waits for durability (the journal
// is on).
func (w *Writer) Journaled() bool { return !w.opts.NoJournal }

// JournalBytes is the number of bytes appended to journals so far (the
// price of durability, on top of the Parquet files).
func (w *Writer) JournalBytes() int64 { return w.journalBytes.Load() }

// prepare stamps defaults and validates rec.
func (w *Writer) prepare(rec *Record) error {
	if rec.SchemaVersion == 0 {
		rec.SchemaVersion = SchemaVersion
	}
	if rec.RunID == "" {
		rec.RunID = w.opts.RunID
	}
	if rec.CreatedAt.IsZero() {
		rec.CreatedAt = time.Now()
	}
	rec.CreatedAt = rec.CreatedAt.UTC().Truncate(time.Microsecond)
	if rec.SchemaVersion != SchemaVersion {
		return fmt.Errorf("%w: schema_version %d, this writer writes %d", ErrInvalidRecord, rec.SchemaVersion, SchemaVersion)
	}
	return rec.Validate()
}

func (w *Writer) send(ctx context.Context, req request) error {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		return ErrClosed
	}
	if err := w.err(); err != nil {
		return err
	}
	select {
	case w.in <- req:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("write trajectory: %w", ctx.Err())
	case <-w.done:
		if err := w.err(); err != nil {
			return err
		}
		return ErrClosed
	}
}

func (w *Writer) err() error {
	if p := w.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Checkpoint finishes the current part file (if it has rows) so that every
// record written before the call is durable and visible, and updates
// run.json.
func (w *Writer) Checkpoint(ctx context.Context) error {
	reply := make(chan error, 1)
	if err := w.send(ctx, request{ctrl: ctrlCheckpoint, reply: reply}); err != nil {
		return err
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return fmt.Errorf("checkpoint trajectory: %w", ctx.Err())
	}
}

// Close drains the queue, finishes the current part file, marks run.json
// closed (or failed) and stops the goroutine. It returns the first write
// error, if any. If ctx ends first, Close returns its error and the goroutine
// still finishes the file in the background.
func (w *Writer) Close(ctx context.Context) error {
	w.mu.Lock()
	already := w.closed
	w.closed = true
	w.mu.Unlock()
	if !already {
		// No sender can be blocked now (Lock waited for them), and the
		// goroutine handles this after every queued record.
		w.in <- request{ctrl: ctrlClose}
	}
	select {
	case <-w.done:
		return w.final
	case <-ctx.Done():
		return fmt.Errorf("close trajectory writer: %w", ctx.Err())
	}
}

// SetSampler replaces run.json's "sampler" (e.g. once the server has
// reported its own view of it). It takes effect at the next rewrite of
// run.json: the next finished part file, or Close. Safe for concurrent use.
func (w *Writer) SetSampler(raw json.RawMessage) {
	w.samplerMu.Lock()
	w.sampler = append(json.RawMessage(nil), raw...)
	w.samplerMu.Unlock()
}

// saveManifest writes run.json from the writer goroutine, applying a
// pending SetSampler first.
func (w *Writer) saveManifest() error {
	w.samplerMu.Lock()
	if w.sampler != nil {
		w.manifest.Sampler, w.sampler = w.sampler, nil
	}
	w.samplerMu.Unlock()
	return writeManifest(w.dir, &w.manifest)
}

// Manifest returns a copy of run.json as last written. Only valid after
// Close returned.
func (w *Writer) Manifest() RunManifest {
	<-w.done
	m := w.manifest
	m.Files = append([]FileEntry(nil), w.manifest.Files...)
	return m
}

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

type partFile struct {
	name, tmp, final string
	f                partWriter
	out              *countingWriter
	pw               *parquet.GenericWriter[Record]
	opened           time.Time
	rows, ok, infra  int64
	rowsInGroup      int64
	groupBytes       int64
	tokens           int64
	groups           int64
	journal          *journalFile // nil without journal (NoJournal, compaction)
	journaled        int64        // rows in the journal
}

// partWriter is what the writer needs from a part file; tests substitute
// one that fails like a full disk.
type partWriter interface {
	io.Writer
	Sync() error
	Close() error
}

var createPart = func(path string) (partWriter, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// blobColumns hold long free text.
var blobColumns = []string{"messages", "tools", "sampling_params"}

// parquetWriterOptions are the settings every part file is written with.
func parquetWriterOptions(rowGroupRows int64) []parquet.WriterOption {
	opts := []parquet.WriterOption{
		parquet.Compression(&zstd.Codec{Level: zstd.SpeedDefault}),
		parquet.MaxRowsPerRowGroup(rowGroupRows),
		// v1 pages are what pyarrow writes by default and what every reader
		// supports.
		parquet.DataPageVersion(1),
		parquet.KeyValueMetadata(MetadataSchemaVersionKey, strconv.Itoa(SchemaVersion)),
		parquet.CreatedBy("rollout", serviceVersion(), ""),
	}
	// Min/max of long text is useless for pruning and is stored
	// uncompressed in every page header and the column index: it doubled
	// the size of the messages column.
	for _, c := range blobColumns {
		opts = append(opts, parquet.SkipPageStatistics(c), parquet.SkipPageBounds(c))
	}
	return opts
}

// openPartNamed opens the next part file (or the named one, for the
// compaction of a journal), with its journal when journal is set.
func (w *Writer) openPartNamed(name string, journal bool) error {
	if name == "" {
		name = fmt.Sprintf("part-%05d.parquet", w.next)
		w.next++
	}
	p := &partFile{
		name:   name,
		tmp:    filepath.Join(w.dir, "."+name+".tmp"),
		final:  filepath.Join(w.dir, name),
		opened: time.Now(),
	}
	if journal {
		j, err := createJournal(w.dir, name)
		if err != nil {
			return err
		}
		p.journal = j
	}
	f, err := createPart(p.tmp)
	if err != nil {
		if p.journal != nil {
			p.journal.f.Close()
			os.Remove(p.journal.path)
		}
		return fmt.Errorf("create part file: %w", err)
	}
	p.f = f
	p.out = &countingWriter{w: f}
	p.pw = parquet.NewGenericWriter[Record](p.out, parquetWriterOptions(w.opts.RowGroupRows)...)
	w.cur = p
	return nil
}

// finishPart closes, fsyncs and renames the current part file and records it
// in run.json, then deletes its journal (the rename made it obsolete). On
// error the writer fails and the temp file is removed; the journal stays for
// the resume to compact.
func (w *Writer) finishPart() error {
	p := w.cur
	if p == nil {
		return nil
	}
	if p.journal != nil {
		w.syncBarrier()
	}
	w.cur = nil
	err := p.pw.Close()
	if err == nil {
		err = p.f.Sync()
	}
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(p.tmp, p.final)
	}
	if err == nil {
		err = syncDir(w.dir)
	}
	if err != nil {
		os.Remove(p.tmp)
		err = fmt.Errorf("finish %s: %w", p.final, err)
		if p.journal != nil {
			p.journal.f.Close()
		} else {
			w.manifest.Counts.Lost += p.rows
		}
		w.fail(err)
		return err
	}
	if p.journal != nil {
		p.journal.f.Close()
		if rerr := os.Remove(p.journal.path); rerr != nil {
			// Harmless: a journal whose part file exists is ignored and
			// deleted by the next NewWriter.
			w.log.Warn("cannot delete compacted journal", "file", p.journal.path, "err", rerr)
		}
	}
	w.manifest.Files = append(w.manifest.Files, FileEntry{
		Name: p.name, Rows: p.rows, Groups: p.groups, Bytes: p.out.n, TokenValues: p.tokens, FinishedAt: time.Now().UTC(),
	})
	w.manifest.Counts.Rows += p.rows
	w.manifest.Counts.OK += p.ok
	w.manifest.Counts.InfraFailed += p.infra
	w.manifest.UpdatedAt = time.Now().UTC()
	metricRows.Add(float64(p.rows))
	metricFiles.Inc()
	metricBytes.Add(float64(p.out.n))
	w.log.Info("trajectory part file finished", "file", p.name, "rows", p.rows, "bytes", p.out.n)
	if err := w.saveManifest(); err != nil {
		w.fail(fmt.Errorf("update run.json: %w", err))
		return err
	}
	return nil
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

// partFiles lists the finished part files of dir in order.
func partFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() && partName.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}
