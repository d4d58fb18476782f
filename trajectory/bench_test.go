package trajectory_test

import (
	"context"
	"io"
	"testing"

	"github.com/rollout-rl/rollout/internal/devtools/bench/synth"
	"github.com/rollout-rl/rollout/internal/devtools/bench/trajbench"
	"github.com/rollout-rl/rollout/trajectory"
)

func syntheticBatch(n, tokens int) []trajectory.Record {
	recs := make([]trajectory.Record, n)
	for i := range recs {
		recs[i] = synth.Trajectory(11, i, synth.Options{Tokens: tokens})
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
		res, err := trajbench.MeasureWrite(ctx, dir, recs, trajectory.WriterOptions{})
		if err != nil {
			b.Fatal(err)
		}
		rows += float64(res.Rows)
		tokMB += float64(res.TokenValues*trajbench.TokenBytesPerPosition) / 1e6
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
		if _, err := trajectory.WriteAtropos(io.Discard, recs, trajectory.AtroposOptions{IncludeMessages: true}); err != nil {
			b.Fatal(err)
		}
		rows += len(recs)
	}
	b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkEncodeTrainerJSONL8k encodes the same 8k-token records as each
// trainer export, beside Atropos JSONL (the baseline of the same run):
// rows/s and output bytes per row.
func BenchmarkEncodeTrainerJSONL8k(b *testing.B) {
	recs := syntheticBatch(64, 8192)
	for _, c := range []struct {
		name  string
		write func(io.Writer) (trajectory.ExportStats, error)
	}{
		{"atropos", func(w io.Writer) (trajectory.ExportStats, error) {
			return trajectory.WriteAtropos(w, recs, trajectory.AtroposOptions{IncludeMessages: true})
		}},
		{"verl", func(w io.Writer) (trajectory.ExportStats, error) {
			return trajectory.WriteVerl(w, recs, trajectory.Filter{})
		}},
		{"skyrl", func(w io.Writer) (trajectory.ExportStats, error) {
			return trajectory.WriteSkyRL(w, recs, trajectory.Filter{})
		}},
		{"nemo-gym", func(w io.Writer) (trajectory.ExportStats, error) {
			return trajectory.WriteNeMoGym(w, recs, trajectory.Filter{})
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var rows int
			var n countingWriter
			for b.Loop() {
				if _, err := c.write(&n); err != nil {
					b.Fatal(err)
				}
				rows += len(recs)
			}
			b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
			b.ReportMetric(float64(n)/float64(rows), "bytes/row")
		})
	}
}

type countingWriter int64

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}
