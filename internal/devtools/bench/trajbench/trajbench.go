// Package trajbench measures the trajectory writer for `rollout bench
// output`: write throughput of records and of durable groups, and the size
// of the Parquet files against the same records as Atropos saves them
// (WritePythonAtropos).
package trajbench

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/rollout-rl/rollout/trajectory"
)

// TokenBytesPerPosition is the raw size of the per-token columns of one
// position (tokens int32 + loss_mask int8 + masks int32 + logprobs float32),
// the unit of the MB/s figure.
const TokenBytesPerPosition = 13

// WriteResult is one measured write of a batch of records.
type WriteResult struct {
	Rows          int
	TokenValues   int64
	Elapsed       time.Duration
	RowsPerSec    float64
	TokenMBPerSec float64 // raw per-token column bytes (TokenBytesPerPosition) per second, MB = 1e6 bytes
	FileBytes     int64
}

// MeasureWrite writes recs through a Writer into a fresh run directory under
// dir (removed afterwards) and times it from the first Write to the end of
// Close (files fsynced and renamed).
func MeasureWrite(ctx context.Context, dir string, recs []trajectory.Record, opts trajectory.WriterOptions) (WriteResult, error) {
	runDir, err := os.MkdirTemp(dir, "bench-write-*")
	if err != nil {
		return WriteResult{}, fmt.Errorf("bench dir: %w", err)
	}
	defer os.RemoveAll(runDir)
	var res WriteResult
	start := time.Now()
	w, tokens, err := writeRun(ctx, runDir, recs, opts)
	if err != nil {
		return res, err
	}
	res.Elapsed = time.Since(start)
	res.Rows = len(recs)
	res.TokenValues = tokens
	for _, f := range w.Manifest().Files {
		res.FileBytes += f.Bytes
	}
	if s := res.Elapsed.Seconds(); s > 0 {
		res.RowsPerSec = float64(res.Rows) / s
		res.TokenMBPerSec = float64(res.TokenValues*TokenBytesPerPosition) / 1e6 / s
	}
	return res, nil
}

// writeRun writes recs through a new Writer on runDir and closes it; it
// returns the closed writer (for its manifest) and the token positions
// written.
func writeRun(ctx context.Context, runDir string, recs []trajectory.Record, opts trajectory.WriterOptions) (*trajectory.Writer, int64, error) {
	w, err := trajectory.NewWriter(ctx, runDir, opts)
	if err != nil {
		return nil, 0, err
	}
	var tokens int64
	for i := range recs {
		if err := w.Write(ctx, recs[i]); err != nil {
			_ = w.Close(context.WithoutCancel(ctx))
			return nil, 0, err
		}
		tokens += int64(len(recs[i].Tokens))
	}
	if err := w.Close(ctx); err != nil {
		return nil, 0, err
	}
	return w, tokens, nil
}

// SizeComparison compares the Parquet files of a set of records with the
// same records as Atropos ScoredDataGroup JSONL, gzip-compressed (default
// level), the way Atropos envs save and send groups.
type SizeComparison struct {
	Rows             int
	TokensPerRow     float64
	ParquetBytes     int64
	AtroposGzipBytes int64
	AtroposRawBytes  int64
	Ratio            float64 // ParquetBytes / AtroposGzipBytes
	// ColumnBytes is the compressed size of each top-level column (its
	// column chunks, page headers included) over the part files: where
	// ParquetBytes goes. The footer and file magic are not in any column.
	ColumnBytes map[string]int64
}

// ColumnSizes adds the compressed size of every top-level column of the
// Parquet file at path to sizes (nested and list columns count under
// their top-level name). Only the footer is read.
func ColumnSizes(path string, sizes map[string]int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	pf, err := parquet.OpenFile(f, st.Size(), parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true))
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	for _, rg := range pf.Metadata().RowGroups {
		for _, c := range rg.Columns {
			if len(c.MetaData.PathInSchema) == 0 {
				return fmt.Errorf("%s: column chunk without a path", path)
			}
			sizes[c.MetaData.PathInSchema[0]] += c.MetaData.TotalCompressedSize
		}
	}
	return nil
}

// CompareSize writes recs as Parquet (default writer settings) and as
// Atropos JSONL (with messages) + gzip under dir and returns the sizes.
func CompareSize(ctx context.Context, dir string, recs []trajectory.Record) (SizeComparison, error) {
	var c SizeComparison
	runDir, err := os.MkdirTemp(dir, "bench-size-*")
	if err != nil {
		return c, fmt.Errorf("bench dir: %w", err)
	}
	defer os.RemoveAll(runDir)
	w, tokens, err := writeRun(ctx, runDir, recs, trajectory.WriterOptions{})
	if err != nil {
		return c, err
	}
	c.ColumnBytes = map[string]int64{}
	for _, f := range w.Manifest().Files {
		c.ParquetBytes += f.Bytes
		if err := ColumnSizes(filepath.Join(runDir, f.Name), c.ColumnBytes); err != nil {
			return c, err
		}
	}
	c.AtroposRawBytes, c.AtroposGzipBytes, err = gzipAtropos(filepath.Join(runDir, "atropos.jsonl.gz"), recs)
	if err != nil {
		return c, err
	}
	c.Rows = len(recs)
	if c.Rows > 0 {
		c.TokensPerRow = float64(tokens) / float64(c.Rows)
	}
	if c.AtroposGzipBytes > 0 {
		c.Ratio = float64(c.ParquetBytes) / float64(c.AtroposGzipBytes)
	}
	return c, nil
}

// gzipAtropos writes recs to path as Python-layout Atropos JSONL through
// gzip and returns the uncompressed and the file's size.
func gzipAtropos(path string, recs []trajectory.Record) (raw, gz int64, err error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, 0, fmt.Errorf("create %s: %w", path, err)
	}
	zw := gzip.NewWriter(f)
	err = WritePythonAtropos(zw, recs)
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, 0, fmt.Errorf("write atropos jsonl.gz: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return 0, 0, err
	}
	raw, err = gunzippedSize(path)
	return raw, st.Size(), err
}

// gunzippedSize is the size of the gzip file's content: read back rather
// than counted on the way in, the file being on disk anyway.
func gunzippedSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	n, err := io.Copy(io.Discard, zr)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	return n, nil
}

// GroupWriteResult is one measured write of groups through WriteGroup.
type GroupWriteResult struct {
	Groups       int
	Elapsed      time.Duration
	GroupsPerSec float64
	FileBytes    int64 // Parquet part files
	JournalBytes int64 // journal frames (0 with NoJournal)
}

// MeasureGroupWrite writes groups through a Writer into a fresh run
// directory under dir (removed afterwards) from writers concurrent callers,
// the way the runner hands finished groups to its durable sink, and times
// it from the first WriteGroup to the end of Close.
func MeasureGroupWrite(ctx context.Context, dir string, groups [][]trajectory.Record, writers int, opts trajectory.WriterOptions) (GroupWriteResult, error) {
	runDir, err := os.MkdirTemp(dir, "bench-groups-*")
	if err != nil {
		return GroupWriteResult{}, fmt.Errorf("bench dir: %w", err)
	}
	defer os.RemoveAll(runDir)
	var res GroupWriteResult
	start := time.Now()
	w, err := trajectory.NewWriter(ctx, runDir, opts)
	if err != nil {
		return res, err
	}
	next := make(chan []trajectory.Record)
	errc := make(chan error, writers)
	for range max(writers, 1) {
		go func() {
			var first error
			for g := range next {
				if err := w.WriteGroup(ctx, g); err != nil && first == nil {
					first = err
				}
			}
			errc <- first
		}()
	}
	for _, g := range groups {
		next <- g
	}
	close(next)
	var werr error
	for range max(writers, 1) {
		if err := <-errc; err != nil && werr == nil {
			werr = err
		}
	}
	if err := w.Close(ctx); err != nil && werr == nil {
		werr = err
	}
	if werr != nil {
		return res, werr
	}
	res.Elapsed = time.Since(start)
	res.Groups = len(groups)
	for _, f := range w.Manifest().Files {
		res.FileBytes += f.Bytes
	}
	res.JournalBytes = w.JournalBytes()
	if s := res.Elapsed.Seconds(); s > 0 {
		res.GroupsPerSec = float64(res.Groups) / s
	}
	return res, nil
}
