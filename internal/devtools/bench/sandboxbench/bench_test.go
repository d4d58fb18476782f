package sandboxbench

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// Run with: go test -run '^$' -bench . -benchtime 1x ./sandbox/
// Each benchmark measures the candidate and its baseline side by side and
// reports percentiles (ms) and the ratio.

func TestSummarize(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	st := Summarize(s)
	if st.P50 != 50*time.Millisecond || st.P90 != 90*time.Millisecond || st.P99 != 99*time.Millisecond || st.Max != 100*time.Millisecond || st.N != 100 {
		t.Fatalf("%+v", st)
	}
	if (Summarize(nil) != Stats{}) {
		t.Fatal("empty")
	}
}

func TestChannelShare(t *testing.T) {
	ms := time.Millisecond
	got := ChannelShare([]time.Duration{3 * ms, 2 * ms, ms, 5 * ms}, []time.Duration{2 * ms, 2 * ms, 3 * ms})
	want := []time.Duration{ms, 0, 0} // clamped at zero; the unpaired round trip is left out
	if !slices.Equal(got, want) {
		t.Fatalf("ChannelShare = %v, want %v", got, want)
	}
}

// MeasureHostSpawn times real spawns and calls a failing command an error,
// with its output.
func TestMeasureHostSpawn(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	d, err := MeasureHostSpawn(context.Background(), 3, sh, "sh", "-c", "exit 0")
	if err != nil || len(d) != 3 || d[0] <= 0 {
		t.Fatalf("MeasureHostSpawn = %v, %v", d, err)
	}
	d, err = MeasureHostSpawn(context.Background(), 3, sh, "sh", "-c", "echo broken >&2; exit 3")
	if err == nil || len(d) != 0 || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("a failing command: %v, %v", d, err)
	}
}
