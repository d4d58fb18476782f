package trajectory

// Part files: their Parquet settings, opening one (with its journal),
// finishing it (flush, fsync, rename, manifest) and listing them.

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress/zstd"
)

var partName = regexp.MustCompile(`^part-(\d{5,})\.parquet$`)

type partFile struct {
	name, tmp, final string
	f                partWriter
	out              *countingWriter
	pw               *parquet.GenericWriter[Record]
	opened           time.Time
	rows, ok, infra  int64
	sampled          int64 // sampled ids of ok rows (RunCounts.SampledTokens)
	unscored         int64
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
	w.manifest.Counts.SampledTokens += p.sampled
	w.manifest.Counts.UnscoredTokens += p.unscored
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
