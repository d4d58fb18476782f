package trajectory

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// TokenBytesPerPosition is the raw size of the per-token columns of one
// position (tokens int32 + loss_mask int8 + masks int32 + logprobs float32),
// the unit of the MB/s figure.
const TokenBytesPerPosition = 13

// WriteBenchResult is one measured write of a batch of records.
type WriteBenchResult struct {
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
func MeasureWrite(ctx context.Context, dir string, recs []Record, opts WriterOptions) (WriteBenchResult, error) {
	runDir, err := os.MkdirTemp(dir, "bench-write-*")
	if err != nil {
		return WriteBenchResult{}, fmt.Errorf("bench dir: %w", err)
	}
	defer os.RemoveAll(runDir)
	var res WriteBenchResult
	start := time.Now()
	w, err := NewWriter(ctx, runDir, opts)
	if err != nil {
		return res, err
	}
	for i := range recs {
		if err := w.Write(ctx, recs[i]); err != nil {
			_ = w.Close(context.WithoutCancel(ctx))
			return res, err
		}
		res.TokenValues += int64(len(recs[i].Tokens))
	}
	if err := w.Close(ctx); err != nil {
		return res, err
	}
	res.Elapsed = time.Since(start)
	res.Rows = len(recs)
	for _, f := range w.Manifest().Files {
		res.FileBytes += f.Bytes
	}
	if s := res.Elapsed.Seconds(); s > 0 {
		res.RowsPerSec = float64(res.Rows) / s
		res.TokenMBPerSec = float64(res.TokenValues*TokenBytesPerPosition) / 1e6 / s
	}
	return res, nil
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
// their top-level name).
func ColumnSizes(path string, sizes map[string]int64) error {
	f, err := OpenFile(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, rg := range f.pf.Metadata().RowGroups {
		for _, c := range rg.Columns {
			if len(c.MetaData.PathInSchema) == 0 {
				return &FileError{Path: path, Err: fmt.Errorf("%w: column chunk without a path", ErrCorruptFile)}
			}
			sizes[c.MetaData.PathInSchema[0]] += c.MetaData.TotalCompressedSize
		}
	}
	return nil
}

// CompareSize writes recs as Parquet (default writer settings) and as
// Atropos JSONL (with messages) + gzip under dir and returns the sizes.
func CompareSize(ctx context.Context, dir string, recs []Record) (SizeComparison, error) {
	var c SizeComparison
	runDir, err := os.MkdirTemp(dir, "bench-size-*")
	if err != nil {
		return c, fmt.Errorf("bench dir: %w", err)
	}
	defer os.RemoveAll(runDir)
	w, err := NewWriter(ctx, runDir, WriterOptions{})
	if err != nil {
		return c, err
	}
	var tokens int64
	for i := range recs {
		if err := w.Write(ctx, recs[i]); err != nil {
			_ = w.Close(context.WithoutCancel(ctx))
			return c, err
		}
		tokens += int64(len(recs[i].Tokens))
	}
	if err := w.Close(ctx); err != nil {
		return c, err
	}
	c.ColumnBytes = map[string]int64{}
	for _, f := range w.Manifest().Files {
		c.ParquetBytes += f.Bytes
		if err := ColumnSizes(filepath.Join(runDir, f.Name), c.ColumnBytes); err != nil {
			return c, err
		}
	}
	gzPath := filepath.Join(runDir, "atropos.jsonl.gz")
	f, err := os.Create(gzPath)
	if err != nil {
		return c, fmt.Errorf("create %s: %w", gzPath, err)
	}
	raw := &countingWriter{w: nil}
	zw := gzip.NewWriter(f)
	raw.w = zw
	err = writeAtroposPython(raw, recs)
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return c, fmt.Errorf("write atropos jsonl.gz: %w", err)
	}
	st, err := os.Stat(gzPath)
	if err != nil {
		return c, err
	}
	c.Rows = len(recs)
	if c.Rows > 0 {
		c.TokensPerRow = float64(tokens) / float64(c.Rows)
	}
	c.AtroposGzipBytes = st.Size()
	c.AtroposRawBytes = raw.n
	if c.AtroposGzipBytes > 0 {
		c.Ratio = float64(c.ParquetBytes) / float64(c.AtroposGzipBytes)
	}
	return c, nil
}

// WriteAtroposPythonJSON writes recs as the JSON lines Atropos itself
// sends and saves (one ScoredDataGroup per group, Python's json.dumps
// layout): the size baseline of `rollout bench output`.
func WriteAtroposPythonJSON(out io.Writer, recs []Record) error { return writeAtroposPython(out, recs) }

// writeAtroposPython writes recs as Atropos itself saves groups
// (data_path_to_save_groups: json.dumps per group): Python separators, every
// ScoredDataGroup key, and logprobs as the float64 repr of the float32 values
// vLLM returns. It is the size baseline, not an export format.
func writeAtroposPython(out io.Writer, recs []Record) error {
	bw := bufio.NewWriterSize(out, 1<<20)
	for _, g := range groupRecords(recs) {
		bw.WriteString(`{"tokens": [`)
		for i, r := range g {
			if i > 0 {
				bw.WriteString(", ")
			}
			writePyInts(bw, r.Tokens)
		}
		bw.WriteString(`], "masks": [`)
		for i, r := range g {
			if i > 0 {
				bw.WriteString(", ")
			}
			writePyInts(bw, r.Masks)
		}
		bw.WriteString(`], "scores": [`)
		for i, r := range g {
			if i > 0 {
				bw.WriteString(", ")
			}
			bw.WriteString(pyFloat(r.Reward))
		}
		bw.WriteString(`], "advantages": null, "ref_logprobs": null, "messages": [`)
		for i, r := range g {
			if i > 0 {
				bw.WriteString(", ")
			}
			m, err := pyJSON([]byte(r.Messages))
			if err != nil {
				return fmt.Errorf("%s: messages: %w", recordRef(r), err)
			}
			bw.WriteString(m)
		}
		bw.WriteString(`], "generation_params": {"temperature": 1.0}, "inference_logprobs": [`)
		for i, r := range g {
			if i > 0 {
				bw.WriteString(", ")
			}
			bw.WriteByte('[')
			for j, lp := range r.Logprobs {
				if j > 0 {
					bw.WriteString(", ")
				}
				bw.WriteString(pyFloat(float64(lp)))
			}
			bw.WriteByte(']')
		}
		bw.WriteString(`], "group_overrides": null, "overrides": null, "images": null}` + "\n")
	}
	return bw.Flush()
}

func writePyInts(w *bufio.Writer, xs []int32) {
	w.WriteByte('[')
	var buf [16]byte
	for i, x := range xs {
		if i > 0 {
			w.WriteString(", ")
		}
		w.Write(strconv.AppendInt(buf[:0], int64(x), 10))
	}
	w.WriteByte(']')
}

// pyFloat formats like Python's repr(float).
func pyFloat(x float64) string {
	s := strconv.FormatFloat(x, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eIN") {
		s += ".0"
	}
	return s
}

var _ io.Writer = (*countingWriter)(nil)

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
func MeasureGroupWrite(ctx context.Context, dir string, groups [][]Record, writers int, opts WriterOptions) (GroupWriteResult, error) {
	runDir, err := os.MkdirTemp(dir, "bench-groups-*")
	if err != nil {
		return GroupWriteResult{}, fmt.Errorf("bench dir: %w", err)
	}
	defer os.RemoveAll(runDir)
	var res GroupWriteResult
	start := time.Now()
	w, err := NewWriter(ctx, runDir, opts)
	if err != nil {
		return res, err
	}
	next := make(chan []Record)
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
