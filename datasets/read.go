package datasets

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/parquet-go/parquet-go"
)

// findFiles lists the data files at path, filtered by split.
func findFiles(path, split string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("dataset %s: %w", path, err)
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	var files []string
	splits := map[string]bool{}
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && p != path {
				return filepath.SkipDir
			}
			return nil
		}
		if formatOf(p) == "" {
			return nil
		}
		rel, _ := filepath.Rel(path, p)
		splits[splitOf(rel)] = true
		if split == "" || inSplit(rel, split) {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dataset %s: %w", path, err)
	}
	if len(files) == 0 {
		known := make([]string, 0, len(splits))
		for s := range splits {
			known = append(known, s)
		}
		sort.Strings(known)
		if split != "" {
			return nil, fmt.Errorf("%w: %s: no files for split %q (splits found: %s)", ErrInvalid, path, split, strings.Join(known, ", "))
		}
		return nil, fmt.Errorf("%w: %s: no .jsonl, .json or .parquet files", ErrInvalid, path)
	}
	sort.Strings(files)
	return files, nil
}

func inSplit(rel, split string) bool {
	for _, part := range strings.Split(filepath.ToSlash(rel), "/") {
		stem := part
		if i := strings.IndexByte(stem, '.'); i > 0 {
			stem = stem[:i]
		}
		if stem == split || strings.HasPrefix(stem, split+"-") || strings.HasPrefix(stem, split+"_") {
			return true
		}
	}
	return false
}

// splitOf guesses the split name of a file, for error messages.
func splitOf(rel string) string {
	parts := strings.Split(filepath.ToSlash(rel), "/")
	if len(parts) > 1 && parts[0] != "data" {
		return parts[0]
	}
	stem := parts[len(parts)-1]
	if i := strings.IndexAny(stem, ".-_"); i > 0 {
		stem = stem[:i]
	}
	return stem
}

func formatOf(p string) string {
	switch {
	case strings.HasSuffix(p, ".jsonl"), strings.HasSuffix(p, ".json"), strings.HasSuffix(p, ".ndjson"):
		return FormatJSONL
	case strings.HasSuffix(p, ".parquet"):
		return FormatParquet
	}
	return ""
}

func readFile(path, format string) ([]Item, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("dataset file: %w", err)
	}
	defer f.Close()
	kind := formatOf(path)
	if format == FormatJSONL || format == FormatParquet {
		kind = format
	}
	switch kind {
	case FormatJSONL:
		return ReadJSONL(f, path)
	case FormatParquet:
		st, err := f.Stat()
		if err != nil {
			return nil, fmt.Errorf("dataset file %s: %w", path, err)
		}
		return ReadParquet(f, st.Size(), path)
	}
	return nil, fmt.Errorf("%w: %s: unknown file type (want .jsonl, .json or .parquet, or set format)", ErrInvalid, path)
}

// ReadJSONL reads one JSON object per line; blank lines are skipped. A
// whole-file JSON array is accepted too (a common ".json" layout). name is
// used in errors.
func ReadJSONL(r io.Reader, name string) ([]Item, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	if first, err := peekNonSpace(br); err == nil && first == '[' {
		var rows []json.RawMessage
		dec := json.NewDecoder(br)
		if err := dec.Decode(&rows); err != nil {
			return nil, fmt.Errorf("%w: %s: JSON array: %v", ErrInvalid, name, err)
		}
		items := make([]Item, 0, len(rows))
		for i, raw := range rows {
			it, err := decodeRow(raw, name, i+1)
			if err != nil {
				return nil, err
			}
			items = append(items, it)
		}
		return items, nil
	}
	var items []Item
	line := 0
	for {
		b, err := br.ReadBytes('\n')
		if len(b) > 0 {
			line++
			if t := bytes.TrimSpace(b); len(t) > 0 {
				it, derr := decodeRow(t, name, line)
				if derr != nil {
					return nil, derr
				}
				items = append(items, it)
			}
		}
		if err == io.EOF {
			return items, nil
		}
		if err != nil {
			return nil, fmt.Errorf("dataset %s line %d: %w", name, line+1, err)
		}
	}
}

func peekNonSpace(br *bufio.Reader) (byte, error) {
	for i := 1; ; i++ {
		b, err := br.Peek(i)
		if err != nil {
			return 0, err
		}
		c := b[i-1]
		if c != ' ' && c != '\n' && c != '\r' && c != '\t' && c != 0xEF && c != 0xBB && c != 0xBF {
			return c, nil
		}
	}
}

func decodeRow(raw []byte, name string, row int) (Item, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return Item{}, fmt.Errorf("%w: %s row %d: invalid JSON: %v", ErrInvalid, name, row, err)
	}
	if dec.More() {
		return Item{}, fmt.Errorf("%w: %s row %d: trailing data after the JSON object", ErrInvalid, name, row)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return Item{}, fmt.Errorf("%w: %s row %d: a row must be a JSON object, got %s", ErrInvalid, name, row, jsonKind(v))
	}
	return Item{Data: normalize(m).(map[string]any), Source: name, Row: row}, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// normalize turns decoded values into the JSON-like set documented on Item:
// json.Number becomes int64 when integral, else float64; valid UTF-8 byte
// slices (Parquet BYTE_ARRAY without a string annotation) become strings.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
		return x
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
		f, _ := x.Float64()
		return f
	case []byte:
		if utf8.Valid(x) {
			return string(x)
		}
		return x
	case int:
		return int64(x)
	case int32:
		return int64(x)
	case float32:
		return float64(x)
	}
	return v
}

// ReadParquet reads every row of a Parquet file of any schema.
func ReadParquet(r io.ReaderAt, size int64, name string) (items []Item, err error) {
	pf, err := parquet.OpenFile(r, size)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: not a readable Parquet file: %v", ErrInvalid, name, err)
	}
	// parquet-go may panic on schemas it cannot map; a bad file must be an
	// error naming the file, not a crash.
	defer func() {
		if p := recover(); p != nil {
			items, err = nil, fmt.Errorf("%w: %s: unsupported Parquet schema: %v", ErrInvalid, name, p)
		}
	}()
	rd := parquet.NewGenericReader[map[string]any](r, pf.Schema())
	defer rd.Close()
	buf := make([]map[string]any, 64)
	row := 0
	for {
		for i := range buf {
			buf[i] = map[string]any{}
		}
		n, rerr := rd.Read(buf)
		for i := range n {
			row++
			items = append(items, Item{Data: normalize(buf[i]).(map[string]any), Source: name, Row: row})
		}
		if rerr == io.EOF {
			return items, nil
		}
		if rerr != nil {
			return nil, fmt.Errorf("%w: %s row %d: %v", ErrInvalid, name, row+1, rerr)
		}
	}
}
