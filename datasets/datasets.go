// Package datasets reads dataset items — JSONL, Parquet, a directory of those
// laid out like a local Hugging Face dataset, and verl-style rows — maps
// their fields to the names an env expects, and samples them (split,
// shuffle with a seed, limit, epochs). It knows nothing about envs.
package datasets

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// ErrInvalid is wrapped by every error caused by the data or the config
// (as opposed to I/O failures).
var ErrInvalid = errors.New("invalid dataset")

// Formats for Config.Format.
const (
	FormatAuto    = "auto"    // by file extension
	FormatJSONL   = "jsonl"   // one JSON object per line
	FormatParquet = "parquet" // any schema; nested lists and structs become []any / map[string]any
	FormatVerl    = "verl"    // verl rows (Parquet or JSONL): prompt as messages, data_source, reward_model.ground_truth, extra_info
)

// Config selects and shapes the items of a dataset.
type Config struct {
	// Path is a .jsonl/.json/.parquet file or a directory holding such files
	// (searched recursively, like a local Hugging Face dataset).
	Path   string `yaml:"path" json:"path"`
	Format string `yaml:"format,omitempty" json:"format,omitempty"`
	// Split keeps the files of one split in a directory: a file matches when
	// a path element or the file name's stem starts with the split name
	// ("train.jsonl", "data/train-00000-of-00001.parquet", "test/x.jsonl").
	Split string `yaml:"split,omitempty" json:"split,omitempty"`
	// IDField is the dotted path of the item id; empty means "id" when rows
	// have one, else "<file>:<row>".
	IDField string `yaml:"id_field,omitempty" json:"id_field,omitempty"`
	// Fields maps the names an env reads to dotted source paths, e.g.
	// {prompt: question, answer: reward_model.ground_truth}. A mapped field
	// missing from a row is an error naming the file and row.
	Fields  map[string]string `yaml:"fields,omitempty" json:"fields,omitempty"`
	Shuffle bool              `yaml:"shuffle,omitempty" json:"shuffle,omitempty"`
	Seed    uint64            `yaml:"seed,omitempty" json:"seed,omitempty"`
	// Offset skips that many items (after shuffling, before Limit).
	Offset int `yaml:"offset,omitempty" json:"offset,omitempty"`
	// Limit keeps at most that many items per epoch (0 = all).
	Limit int `yaml:"limit,omitempty" json:"limit,omitempty"`
	// Epochs repeats the (re-shuffled) items; 0 means 1.
	Epochs int `yaml:"epochs,omitempty" json:"epochs,omitempty"`
}

// Item is one dataset row.
type Item struct {
	ID    string
	Epoch int
	// Data is the row as JSON-like values (string, float64, int64, bool,
	// []any, map[string]any, nil) with mapped fields added under their
	// target names.
	Data   map[string]any
	Source string // file the row came from
	Row    int    // 1-based row (line) number in Source
}

// Key identifies the item within a run: the id, plus the epoch after the
// first. Resume keys groups on it.
func (it Item) Key() string {
	if it.Epoch == 0 {
		return it.ID
	}
	return it.ID + "@" + strconv.Itoa(it.Epoch)
}

// Get returns the value at a dotted path ("reward_model.ground_truth",
// "prompt.0.content").
func (it Item) Get(path string) (any, bool) { return lookup(it.Data, path) }

// String returns the value at path as text: strings as they are, numbers and
// booleans formatted, anything else an error.
func (it Item) String(path string) (string, error) {
	v, ok := it.Get(path)
	if !ok {
		return "", fmt.Errorf("%w: %s row %d: field %q missing", ErrInvalid, it.Source, it.Row, path)
	}
	s, ok := scalarText(v)
	if !ok {
		return "", fmt.Errorf("%w: %s row %d: field %q is %T, not text", ErrInvalid, it.Source, it.Row, path, v)
	}
	return s, nil
}

func scalarText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), true
	case int64:
		return strconv.FormatInt(x, 10), true
	case bool:
		return strconv.FormatBool(x), true
	}
	return "", false
}

func lookup(data map[string]any, path string) (any, bool) {
	var cur any = data
	for _, part := range strings.Split(path, ".") {
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[part]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			cur = c[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// Load reads, maps and samples the dataset described by cfg.
func Load(ctx context.Context, cfg Config) ([]Item, error) {
	if cfg.Path == "" {
		return nil, fmt.Errorf("%w: dataset path is empty", ErrInvalid)
	}
	files, err := findFiles(cfg.Path, cfg.Split)
	if err != nil {
		return nil, err
	}
	var rows []Item
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		got, err := readFile(f, cfg.Format)
		if err != nil {
			return nil, err
		}
		rows = append(rows, got...)
	}
	return Prepare(rows, cfg)
}

// Prepare applies the id, field mapping and sampling parts of cfg to rows
// already read (e.g. an env's embedded dataset).
func Prepare(rows []Item, cfg Config) ([]Item, error) {
	if cfg.Limit < 0 || cfg.Offset < 0 || cfg.Epochs < 0 {
		return nil, fmt.Errorf("%w: limit, offset and epochs must not be negative", ErrInvalid)
	}
	fields := cfg.Fields
	if cfg.Format == FormatVerl {
		fields = withVerlFields(fields)
	}
	seen := make(map[string]string, len(rows))
	for i := range rows {
		it := &rows[i]
		if err := mapFields(it, fields); err != nil {
			return nil, err
		}
		id, err := itemID(*it, cfg.IDField)
		if err != nil {
			return nil, err
		}
		if prev, dup := seen[id]; dup {
			return nil, fmt.Errorf("%w: %s row %d: duplicate item id %q (first at %s)", ErrInvalid, it.Source, it.Row, id, prev)
		}
		seen[id] = fmt.Sprintf("%s row %d", it.Source, it.Row)
		it.ID = id
	}
	epochs := max(cfg.Epochs, 1)
	out := make([]Item, 0, len(rows)*epochs)
	for e := range epochs {
		order := make([]Item, len(rows))
		copy(order, rows)
		if cfg.Shuffle {
			r := rand.New(rand.NewPCG(cfg.Seed, uint64(e)))
			r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		if cfg.Offset >= len(order) {
			order = nil
		} else {
			order = order[cfg.Offset:]
		}
		if cfg.Limit > 0 && len(order) > cfg.Limit {
			order = order[:cfg.Limit]
		}
		for _, it := range order {
			it.Epoch = e
			out = append(out, it)
		}
	}
	return out, nil
}

// withVerlFields adds verl's conventional mapping under any user mapping.
func withVerlFields(user map[string]string) map[string]string {
	m := map[string]string{
		"prompt":   "prompt",
		"answer":   "reward_model.ground_truth",
		"category": "data_source",
	}
	for k, v := range user {
		m[k] = v
	}
	return m
}

func mapFields(it *Item, fields map[string]string) error {
	for target, src := range fields {
		v, ok := lookup(it.Data, src)
		if !ok {
			return fmt.Errorf("%w: %s row %d: mapped field %s <- %q is missing", ErrInvalid, it.Source, it.Row, target, src)
		}
		it.Data[target] = v
	}
	return nil
}

func itemID(it Item, field string) (string, error) {
	if field == "" {
		if v, ok := it.Data["id"]; ok {
			if s, ok := scalarText(v); ok && s != "" {
				return s, nil
			}
		}
		if v, ok := lookup(it.Data, "extra_info.index"); ok {
			if s, ok := scalarText(v); ok && s != "" {
				return s, nil
			}
		}
		return fmt.Sprintf("%s:%d", baseName(it.Source), it.Row), nil
	}
	s, err := it.String(field)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", fmt.Errorf("%w: %s row %d: id field %q is empty", ErrInvalid, it.Source, it.Row, field)
	}
	return s, nil
}

func baseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		p = p[i+1:]
	}
	if i := strings.IndexByte(p, '.'); i > 0 {
		p = p[:i]
	}
	return p
}
