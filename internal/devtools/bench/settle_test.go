package bench

import (
	"context"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	busy, total, err := parseProcStat("cpu  100 5 50 800 40 1 4 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
	if err != nil || total != 1000 || busy != 160 {
		t.Fatalf("busy %d total %d err %v; want 160 of 1000", busy, total, err)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5\n", "cpu 1 2 x 4 5\n", "cpu 1 2\n"} {
		if _, _, err := parseProcStat(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// scripted returns the cumulative counters of a machine whose busy share
// per sample follows shares (the last one repeats).
func scripted(shares ...float64) cpuSampler {
	var busy, total uint64
	i := -1
	return func() (uint64, uint64, error) {
		if i >= 0 {
			s := shares[min(i, len(shares)-1)]
			busy += uint64(s * 1000)
			total += 1000
		}
		i++
		return busy, total, nil
	}
}

func TestSettle(t *testing.T) {
	ctx := context.Background()
	// Busy, then quiet: settles after the third quiet sample in a row; a
	// busy sample in between starts the count again.
	s, err := settle(ctx, scripted(0.9, 0.2, 0.9, 0.1, 0.2, 0.3, 0.9), time.Millisecond, time.Minute, 0.35, 3)
	if err != nil || !s.Quiet || s.Busy != 0.3 {
		t.Fatalf("%+v %v; want quiet at the sample of 0.3", s, err)
	}
	// Never quiet: gives up at maxWait and says so.
	s, err = settle(ctx, scripted(0.8), time.Millisecond, 20*time.Millisecond, 0.35, 3)
	if err != nil || s.Quiet || s.Busy != 0.8 || s.Waited < 20*time.Millisecond {
		t.Fatalf("%+v %v; want not quiet after 20ms at 0.8 busy", s, err)
	}
	// Cancelled: returns the context's error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := settle(cctx, scripted(0.8), time.Hour, time.Hour, 0.35, 3); err != context.Canceled {
		t.Fatalf("cancelled: %v", err)
	}
	// The machine's own /proc/stat reads.
	if _, _, err := procStat(); err != nil {
		t.Fatal(err)
	}
}
