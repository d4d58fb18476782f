package datasets

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/parquet-go/parquet-go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func write(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func ids(items []Item) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.Key()
	}
	return out
}

func TestLoadJSONL(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, "tasks.jsonl", `{"id":"a","q":"one","n":1}

{"id":"b","q":"two","n":2.5,"meta":{"tags":["x","y"]}}
`)
	items, err := Load(context.Background(), Config{Path: p, Fields: map[string]string{"prompt": "q"}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a", "b"}, ids(items)); diff != "" {
		t.Fatal(diff)
	}
	if items[1].Row != 3 {
		t.Errorf("row of b = %d, want 3 (blank lines count)", items[1].Row)
	}
	if got := items[0].Data["n"]; got != int64(1) {
		t.Errorf("n = %#v, want int64 1", got)
	}
	if got := items[1].Data["n"]; got != 2.5 {
		t.Errorf("n = %#v, want 2.5", got)
	}
	if s, _ := items[1].String("prompt"); s != "two" {
		t.Errorf("mapped prompt = %q", s)
	}
	if v, ok := items[1].Get("meta.tags.1"); !ok || v != "y" {
		t.Errorf("meta.tags.1 = %v %v", v, ok)
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, file, body string
		cfg              Config
		want             string
	}{
		{"invalid json", "a.jsonl", "{\"id\":1}\n{oops\n", Config{}, "a.jsonl row 2: invalid JSON"},
		{"not an object", "b.jsonl", "{\"id\":1}\n[1,2]\n", Config{}, "b.jsonl row 2: a row must be a JSON object, got an array"},
		{"trailing data", "c.jsonl", "{\"id\":1} {\"id\":2}\n", Config{}, "c.jsonl row 1: trailing data"},
		{"missing mapped field", "d.jsonl", "{\"id\":1,\"q\":\"x\"}\n{\"id\":2}\n", Config{Fields: map[string]string{"prompt": "q"}}, `d.jsonl row 2: mapped field prompt <- "q" is missing`},
		{"duplicate id", "e.jsonl", "{\"id\":1}\n{\"id\":1}\n", Config{}, `e.jsonl row 2: duplicate item id "1"`},
		{"id not text", "f.jsonl", "{\"key\":{\"a\":1}}\n", Config{IDField: "key"}, `f.jsonl row 1: field "key" is map[string]interface {}, not text`},
		{"foreign parquet", "g.parquet", "this is not parquet", Config{}, "g.parquet: not a readable Parquet file"},
		{"negative limit", "h.jsonl", "{\"id\":1}\n", Config{Limit: -1}, "must not be negative"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.Path = write(t, dir, c.file, c.body)
			_, err := Load(context.Background(), c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("err is not ErrInvalid: %v", err)
			}
		})
	}
	if _, err := Load(context.Background(), Config{Path: filepath.Join(dir, "missing.jsonl")}); err == nil || errors.Is(err, ErrInvalid) {
		t.Errorf("missing file: err = %v, want an I/O error", err)
	}
}

type verlMsg struct {
	Role    string `parquet:"role"`
	Content string `parquet:"content"`
}
type verlRM struct {
	GroundTruth string `parquet:"ground_truth"`
	Style       string `parquet:"style"`
}
type verlExtra struct {
	Index int64  `parquet:"index"`
	Split string `parquet:"split"`
}
type verlRow struct {
	DataSource  string    `parquet:"data_source"`
	Prompt      []verlMsg `parquet:"prompt,list"`
	Ability     string    `parquet:"ability"`
	RewardModel verlRM    `parquet:"reward_model"`
	ExtraInfo   verlExtra `parquet:"extra_info"`
}

func TestVerlParquetInHFLayout(t *testing.T) {
	dir := t.TempDir()
	writeVerl := func(name string, rows []verlRow) {
		p := filepath.Join(dir, "data", name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := parquet.WriteFile(p, rows); err != nil {
			t.Fatal(err)
		}
	}
	row := func(i int64, q, a string) verlRow {
		return verlRow{DataSource: "gsm8k", Prompt: []verlMsg{{"user", q}}, Ability: "math",
			RewardModel: verlRM{a, "rule"}, ExtraInfo: verlExtra{i, "train"}}
	}
	writeVerl("train-00000-of-00001.parquet", []verlRow{row(0, "1+1?", "2"), row(1, "2+2?", "4")})
	writeVerl("test-00000-of-00001.parquet", []verlRow{row(7, "3+3?", "6")})
	write(t, dir, "README.md", "not data")

	items, err := Load(context.Background(), Config{Path: dir, Split: "train", Format: FormatVerl})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"0", "1"}, ids(items)); diff != "" {
		t.Fatalf("ids (from extra_info.index): %s", diff)
	}
	if a, _ := items[1].String("answer"); a != "4" {
		t.Errorf("answer = %q", a)
	}
	if c, _ := items[0].String("category"); c != "gsm8k" {
		t.Errorf("category = %q", c)
	}
	if q, _ := items[0].String("prompt.0.content"); q != "1+1?" {
		t.Errorf("prompt.0.content = %q", q)
	}
	_, err = Load(context.Background(), Config{Path: dir, Split: "validation"})
	if err == nil || !strings.Contains(err.Error(), `no files for split "validation" (splits found: test, train)`) {
		t.Errorf("unknown split: %v", err)
	}
}

func TestSampling(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	for i := range 20 {
		b.WriteString(`{"id":"t` + string(rune('a'+i)) + `"}` + "\n")
	}
	p := write(t, dir, "x.jsonl", b.String())
	load := func(cfg Config) []string {
		cfg.Path = p
		items, err := Load(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return ids(items)
	}
	plain := load(Config{})
	s1 := load(Config{Shuffle: true, Seed: 7})
	s2 := load(Config{Shuffle: true, Seed: 7})
	s3 := load(Config{Shuffle: true, Seed: 8})
	if !cmp.Equal(s1, s2) {
		t.Error("same seed gave different orders")
	}
	if cmp.Equal(s1, plain) || cmp.Equal(s1, s3) {
		t.Error("shuffle did not change the order, or seeds 7 and 8 agree")
	}
	lim := load(Config{Limit: 3, Offset: 2})
	if diff := cmp.Diff([]string{"tc", "td", "te"}, lim); diff != "" {
		t.Error(diff)
	}
	ep := load(Config{Limit: 2, Epochs: 2})
	if diff := cmp.Diff([]string{"ta", "tb", "ta@1", "tb@1"}, ep); diff != "" {
		t.Error(diff)
	}
}

func TestJSONArrayFile(t *testing.T) {
	p := write(t, t.TempDir(), "rows.json", `[{"q":"a"},{"q":"b"}]`)
	items, err := Load(context.Background(), Config{Path: p})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"rows:1", "rows:2"}, ids(items)); diff != "" {
		t.Error(diff)
	}
}
