package trajectory

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
)

func syntheticBatch(n, tokens int) []Record {
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Synthetic(11, i, SyntheticOptions{Tokens: tokens})
	}
	return recs
}

// BenchmarkWrite8k measures writer throughput on 8k-token agent
// trajectories, reporting rows/s and MB/s of raw per-token column data.
// The baseline in the same run is BenchmarkEncodeAtroposJSONL8k.
func BenchmarkWrite8k(b *testing.B) {
	recs := syntheticBatch(64, 8192)
	dir := b.TempDir()
	ctx := context.Background()
	b.ResetTimer()
	var rows, tokMB, secs float64
	for b.Loop() {
		res, err := MeasureWrite(ctx, dir, recs, WriterOptions{})
		if err != nil {
			b.Fatal(err)
		}
		rows += float64(res.Rows)
		tokMB += float64(res.TokenValues*TokenBytesPerPosition) / 1e6
		secs += res.Elapsed.Seconds()
	}
	b.ReportMetric(rows/secs, "rows/s")
	b.ReportMetric(tokMB/secs, "tokenMB/s")
}

// BenchmarkEncodeAtroposJSONL8k is the baseline: the same records encoded
// as Atropos JSONL (no compression, no disk).
func BenchmarkEncodeAtroposJSONL8k(b *testing.B) {
	recs := syntheticBatch(64, 8192)
	b.ResetTimer()
	var rows int
	for b.Loop() {
		cw := &countingWriter{w: discard{}}
		if _, err := WriteAtropos(cw, recs, AtroposOptions{IncludeMessages: true}); err != nil {
			b.Fatal(err)
		}
		rows += len(recs)
	}
	b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// TestSizeVersusAtroposJSONL guards the file size on a deterministic
// sample against the same records as Atropos JSONL gzip. The target
// is 0.5×; this synthetic data measures about 0.76× (see
// docs/trajectory-schema.md), so the guard catches regressions only.
func TestSizeVersusAtroposJSONL(t *testing.T) {
	if testing.Short() {
		t.Skip("writes ~10 MB")
	}
	c, err := CompareSize(context.Background(), t.TempDir(), syntheticBatch(48, 8192))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("48 × 8k: parquet %d B, atropos jsonl %d B raw, %d B gzip, ratio %.3f; columns %v", c.ParquetBytes, c.AtroposRawBytes, c.AtroposGzipBytes, c.Ratio, c.ColumnBytes)
	var cols int64
	for _, n := range c.ColumnBytes {
		cols += n
	}
	if cols <= 0 || cols > c.ParquetBytes || c.ColumnBytes["tokens"] <= 0 || c.ColumnBytes["messages"] <= 0 {
		t.Errorf("column bytes %v (sum %d) do not account for a %d B file", c.ColumnBytes, cols, c.ParquetBytes)
	}
	if c.Ratio > 0.8 {
		t.Errorf("parquet/atropos-gzip size ratio %.3f > 0.8 (regression)", c.Ratio)
	}
}

// TestSyntheticSharedPrompt: with SharedPrompt the rollouts of a group
// share their prompt ids and system and user messages, groups differ, and
// the rest of each record is the record drawn without the option.
func TestSyntheticSharedPrompt(t *testing.T) {
	opts := SyntheticOptions{Tokens: 2048, GroupSize: 4, SharedPrompt: true}
	p := 2048 / 8
	prompt := func(r Record) (string, []int32) {
		var msgs []map[string]any
		if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(msgs[0]["content"], msgs[1]["content"]), r.Tokens[:p]
	}
	first := Synthetic(3, 0, opts)
	t0, ids0 := prompt(first)
	for i := 1; i < 8; i++ {
		r := Synthetic(3, i, opts)
		ti, idsi := prompt(r)
		same := ti == t0 && slices.Equal(idsi, ids0)
		if (i < 4) != same {
			t.Fatalf("record %d (group %d) shares the prompt of record 0: %v", i, i/4, same)
		}
		own := Synthetic(3, i, SyntheticOptions{Tokens: 2048, GroupSize: 4})
		if !slices.Equal(r.Tokens[p:], own.Tokens[p:]) || !slices.Equal(r.LossMask, own.LossMask) || !slices.Equal(r.Logprobs, own.Logprobs) {
			t.Fatalf("record %d: past the prompt, SharedPrompt changed the record", i)
		}
	}
}

// TestSizeGroupsSharingPrompt reports the size ratio when the rollouts of
// each group share their prompt, as in GRPO, next to the same records
// without (docs/trajectory-schema.md §7): Parquet must gain from the
// repeat, which gzip's 32 KiB window cannot see across 8k-token records.
func TestSizeGroupsSharingPrompt(t *testing.T) {
	if testing.Short() {
		t.Skip("writes ~20 MB")
	}
	ratio := map[bool]float64{}
	for _, shared := range []bool{false, true} {
		recs := make([]Record, 48)
		for i := range recs {
			recs[i] = Synthetic(11, i, SyntheticOptions{Tokens: 8192, SharedPrompt: shared})
		}
		c, err := CompareSize(context.Background(), t.TempDir(), recs)
		if err != nil {
			t.Fatal(err)
		}
		ratio[shared] = c.Ratio
		t.Logf("shared prompt %v: parquet %d B, atropos jsonl gzip %d B, ratio %.3f; columns %v", shared, c.ParquetBytes, c.AtroposGzipBytes, c.Ratio, c.ColumnBytes)
	}
	if ratio[true] >= ratio[false] {
		t.Errorf("ratio with shared prompts %.3f, without %.3f: Parquet did not gain from the repeat", ratio[true], ratio[false])
	}
}
