package trajectory

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"github.com/parquet-go/parquet-go"
)

// Error classes of the reader; test with errors.Is. They arrive wrapped in a
// *FileError naming the file.
var (
	// ErrForeignFile: the file is not a rollout trajectory file (not
	// Parquet, or Parquet without the rollout schema marker).
	ErrForeignFile = errors.New("not a rollout trajectory file")
	// ErrNewerSchema: written by a newer rollout with a schema this build
	// does not know.
	ErrNewerSchema = errors.New("trajectory schema newer than this build")
	// ErrCorruptFile: Parquet structure damaged or truncated.
	ErrCorruptFile = errors.New("truncated or corrupt Parquet file")
)

// FileError names the file a read error is about.
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string { return e.Path + ": " + e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

// File is one opened trajectory part file.
type File struct {
	Path          string
	SchemaVersion int
	NumRows       int64
	f             *os.File
	pf            *parquet.File
}

// OpenFile opens a part file and checks that it is a trajectory file this
// build can read. The caller must Close it.
func OpenFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &FileError{Path: path, Err: err}
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, &FileError{Path: path, Err: err}
	}
	if st.IsDir() {
		f.Close()
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: is a directory", ErrForeignFile)}
	}
	if st.Size() < 12 {
		f.Close()
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: only %d bytes", ErrCorruptFile, st.Size())}
	}
	var magic [4]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil || string(magic[:]) != "PAR1" {
		f.Close()
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: not a Parquet file (no PAR1 header)", ErrForeignFile)}
	}
	if _, err := f.ReadAt(magic[:], st.Size()-4); err != nil || string(magic[:]) != "PAR1" {
		f.Close()
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: no Parquet footer (file cut short, e.g. a write interrupted)", ErrCorruptFile)}
	}
	pf, err := parquet.OpenFile(f, st.Size())
	if err != nil {
		f.Close()
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: %v", ErrCorruptFile, err)}
	}
	v, ok := pf.Lookup(MetadataSchemaVersionKey)
	if !ok {
		f.Close()
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: Parquet file without %q metadata", ErrForeignFile, MetadataSchemaVersionKey)}
	}
	ver, err := strconv.Atoi(v)
	if err != nil || ver < 1 {
		f.Close()
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: bad %s %q", ErrForeignFile, MetadataSchemaVersionKey, v)}
	}
	if ver > SchemaVersion {
		f.Close()
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: file has schema version %d, this build reads up to %d; upgrade rollout", ErrNewerSchema, ver, SchemaVersion)}
	}
	return &File{Path: path, SchemaVersion: ver, NumRows: pf.NumRows(), f: f, pf: pf}, nil
}

// Close releases the file.
func (f *File) Close() error { return f.f.Close() }

// Each calls fn for every record in file order. fn must not retain rec's
// slices beyond the call only if it mutates them; records are not reused.
func (f *File) Each(ctx context.Context, fn func(rec *Record) error) (err error) {
	defer func() {
		// parquet-go can panic on malformed pages; input must never crash us.
		if p := recover(); p != nil {
			err = &FileError{Path: f.Path, Err: fmt.Errorf("%w: %v", ErrCorruptFile, p)}
		}
	}()
	r := parquet.NewGenericReader[Record](f.pf)
	defer r.Close()
	buf := make([]Record, 64)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := r.Read(buf)
		for i := range n {
			buf[i].Normalize()
			if err := fn(&buf[i]); err != nil {
				return err
			}
			buf[i] = Record{}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return &FileError{Path: f.Path, Err: fmt.Errorf("%w: %v", ErrCorruptFile, rerr)}
		}
	}
}

// ReadFile reads every record of one part file.
func ReadFile(path string) ([]Record, error) {
	f, err := OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := make([]Record, 0, f.NumRows)
	err = f.Each(context.Background(), func(rec *Record) error {
		out = append(out, *rec)
		return nil
	})
	return out, err
}

// Run is an opened run directory (or a single part file).
type Run struct {
	Dir      string
	Manifest *RunManifest // nil when a single file was opened
	// Files are the finished part files, in order.
	Files []string
	// Unlisted are finished part files not (yet) in run.json: a crash
	// between rename and manifest update leaves at most one.
	Unlisted []string
	// Journals hold the groups not yet compacted into a part file (the
	// open part of a running run, or what a crash left for the resume);
	// they are read after Files.
	Journals []string
	// JournalRecords counts the records in Journals when Open ran.
	JournalRecords int
}

// Open opens a run directory written by Writer, or a single part file. Every
// file is checked (header, footer, schema version) before Open returns, so a
// truncated, foreign or too-new file is reported up front, by name.
func Open(path string) (*Run, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("open run: %w", err)
	}
	if !st.IsDir() {
		f, err := OpenFile(path)
		if err != nil {
			return nil, err
		}
		f.Close()
		return &Run{Dir: filepath.Dir(path), Files: []string{path}}, nil
	}
	m, err := ReadManifest(path)
	if err != nil {
		return nil, err
	}
	// Journals are listed before the part files: a part file finished in
	// between then shows up in both lists and is read from the part file.
	pending, _, _, err := pendingJournals(path)
	if err != nil {
		return nil, fmt.Errorf("list run dir %s: %w", path, err)
	}
	onDisk, err := partFiles(path)
	if err != nil {
		return nil, fmt.Errorf("list run dir %s: %w", path, err)
	}
	run := &Run{Dir: path, Manifest: m}
	listed := map[string]bool{}
	for _, fe := range m.Files {
		listed[fe.Name] = true
	}
	present := map[string]bool{}
	for _, n := range onDisk {
		present[n] = true
		if !listed[n] {
			run.Unlisted = append(run.Unlisted, n)
		}
		run.Files = append(run.Files, filepath.Join(path, n))
	}
	for _, fe := range m.Files {
		if !present[fe.Name] {
			return nil, &FileError{Path: filepath.Join(path, fe.Name), Err: errors.New("listed in run.json but missing from the run directory")}
		}
	}
	for _, p := range run.Files {
		f, err := OpenFile(p)
		if err != nil {
			return nil, err
		}
		f.Close()
	}
	for _, name := range pending {
		if present[partOfJournal(name)] {
			continue
		}
		jp := filepath.Join(path, name)
		st, err := readJournal(jp, slog.Default(), func([]Record) error { return nil })
		if errors.Is(err, os.ErrNotExist) {
			continue // compacted meanwhile: its part file is there now
		}
		if err != nil {
			return nil, err
		}
		run.Journals = append(run.Journals, jp)
		run.JournalRecords += st.Records
	}
	return run, nil
}

// Each calls fn for every record of the run, file by file: the finished
// part files, then the journals. A journal compacted since Open is read
// from its part file instead.
func (r *Run) Each(ctx context.Context, fn func(rec *Record) error) error {
	return r.walk(ctx, fn, func() error { return nil })
}

// walk is the one loop over a run's files behind Each and EachGroup: fn for
// every record (the part files, then the journals; a journal compacted
// since Open from its part file), and endFile after each file's last
// record, because a group never spans two files.
func (r *Run) walk(ctx context.Context, fn func(rec *Record) error, endFile func() error) error {
	eachPart := func(p string) error {
		f, err := OpenFile(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := f.Each(ctx, fn); err != nil {
			return err
		}
		return endFile()
	}
	for _, p := range r.Files {
		if err := eachPart(p); err != nil {
			return err
		}
	}
	for _, jp := range r.Journals {
		if err := ctx.Err(); err != nil {
			return err
		}
		_, err := readJournal(jp, slog.Default(), func(recs []Record) error {
			for i := range recs {
				if err := fn(&recs[i]); err != nil {
					return err
				}
			}
			return nil
		})
		if errors.Is(err, os.ErrNotExist) {
			err = eachPart(filepath.Join(filepath.Dir(jp), partOfJournal(filepath.Base(jp))))
		} else if err == nil {
			err = endFile()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ReadAll loads every record of the run into memory.
func (r *Run) ReadAll(ctx context.Context) ([]Record, error) {
	var out []Record
	err := r.Each(ctx, func(rec *Record) error {
		out = append(out, *rec)
		return nil
	})
	return out, err
}

// EachGroup calls fn for every group of the run in order, with its
// sequence number: the 0-based position that Writer.WriteGroupSeq returned
// for it. A group is a run of records with the same group id within one
// file (WriteGroup never splits a group across files).
func (r *Run) EachGroup(ctx context.Context, fn func(seq int64, recs []Record) error) error {
	var seq int64
	var cur []Record
	flush := func() error {
		if len(cur) == 0 {
			return nil
		}
		err := fn(seq, cur)
		seq++
		cur = nil
		return err
	}
	add := func(rec *Record) error {
		if len(cur) > 0 && rec.GroupID != cur[0].GroupID {
			if err := flush(); err != nil {
				return err
			}
		}
		cur = append(cur, *rec)
		return nil
	}
	return r.walk(ctx, add, flush)
}
