package trajectory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
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
	rec.Normalize()
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
