package trajbench

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/internal/devtools/bench/synth"
	"github.com/rollout-rl/rollout/trajectory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func batch(n, tokens int, sharedPrompt bool) []trajectory.Record {
	recs := make([]trajectory.Record, n)
	for i := range recs {
		recs[i] = synth.Trajectory(11, i, synth.Options{Tokens: tokens, SharedPrompt: sharedPrompt})
	}
	return recs
}

// TestSizeVersusAtroposJSONL guards the file size on a deterministic
// sample against the same records as Atropos JSONL gzip. The target
// is 0.5×; this synthetic data measures about 0.76× (see
// docs/trajectory-schema.md), so the guard catches regressions only.
func TestSizeVersusAtroposJSONL(t *testing.T) {
	if testing.Short() {
		t.Skip("writes ~10 MB")
	}
	c, err := CompareSize(context.Background(), t.TempDir(), batch(48, 8192, false))
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
		c, err := CompareSize(context.Background(), t.TempDir(), batch(48, 8192, shared))
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
