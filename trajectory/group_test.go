package trajectory

import (
	"context"
	"testing"
)

// A group never straddles two part files, whatever the rotation threshold:
// after a crash the run holds whole groups only, so resume is exact.
func TestWriteGroupIsNeverSplitByRotation(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	w, err := NewWriter(ctx, dir, WriterOptions{RunID: "r", MaxRowsPerFile: 3})
	if err != nil {
		t.Fatal(err)
	}
	const groups, size = 5, 4
	for g := range groups {
		recs := make([]Record, size)
		for i := range recs {
			recs[i] = sizedRecord(1, g*size+i, 64, size)
		}
		if err := w.WriteGroup(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	bad := sizedRecord(1, 99, 64, size)
	bad.Status = "weird"
	good := sizedRecord(1, 98, 64, size)
	if err := w.WriteGroup(ctx, []Record{good, bad}); err == nil {
		t.Fatal("a group with an invalid record was accepted")
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	run, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Files) != groups {
		t.Fatalf("%d part files, want one per group (%d): rotation split or merged groups", len(run.Files), groups)
	}
	total := 0
	for _, p := range run.Files {
		recs, err := ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		for _, r := range recs {
			seen[r.GroupID]++
		}
		for g, n := range seen {
			if n != size {
				t.Errorf("%s holds %d records of %s, want all %d", p, n, g, size)
			}
		}
		total += len(recs)
	}
	if total != groups*size {
		t.Errorf("%d records, want %d (the refused group must leave nothing)", total, groups*size)
	}
}
