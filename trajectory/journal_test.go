package trajectory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// journalGroups are small groups of synthetic records (3 groups of 2).
func journalGroups() [][]Record {
	var out [][]Record
	for g := range 3 {
		var grp []Record
		for i := range 2 {
			// Small records keep the journal short: it is cut at every offset.
			r := Record{SchemaVersion: SchemaVersion, RunID: "r", Env: "e", ItemID: fmt.Sprint(g), GroupID: fmt.Sprintf("g%d", g),
				RolloutIndex: int32(i), Messages: `[{"role":"user","content":"hi"}]`, Status: StatusOK,
				Tokens: []int32{5, 6, 7, 8}, LossMask: []int8{0, 0, 1, 1}, Logprobs: []float32{1, 1, -0.5, -0.25},
				PromptTokens: 2, CompletionTokens: 2, Reward: float64(i), RewardComponents: map[string]float64{"x": 1},
				CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC), ParentBranch: -1, SplitCall: -1}
			r.DeriveTrainingFields()
			grp = append(grp, r)
		}
		out = append(out, grp)
	}
	return out
}

// crashedRun writes groups through a Writer and copies the run directory
// while the writer is still open (the state a kill -9 leaves), returning
// the copy.
func crashedRun(t *testing.T, groups [][]Record, opts WriterOptions) string {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	w, err := NewWriter(ctx, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if err := w.WriteGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	crash := t.TempDir()
	copyDir(t, dir, crash)
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return crash
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func groupIDs(recs []Record) []string {
	var ids []string
	for _, r := range recs {
		ids = append(ids, fmt.Sprintf("%s/%d", r.GroupID, r.RolloutIndex))
	}
	return ids
}

func readRun(t *testing.T, dir string) ([]Record, *Run) {
	t.Helper()
	run, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return recs, run
}

// normalize makes records read from Parquet and from the journal
// comparable (nil and empty slices and maps are the same row).
var normalize = cmp.Options{cmpopts.EquateEmpty()}

// TestJournalKeepsAcknowledgedGroups: after WriteGroup returned, the group
// is readable from a copy of the directory taken before any part file was
// finished, and a resumed writer compacts it into its part file.
func TestJournalKeepsAcknowledgedGroups(t *testing.T) {
	groups := journalGroups()
	crash := crashedRun(t, groups, WriterOptions{RunID: "r"})
	if parts, _ := partFiles(crash); len(parts) != 0 {
		t.Fatalf("part files %v finished before Close: the test does not exercise the journal", parts)
	}
	got, run := readRun(t, crash)
	if len(run.Journals) != 1 || run.JournalRecords != 6 {
		t.Fatalf("journals %v with %d records, want 1 with 6", run.Journals, run.JournalRecords)
	}
	var want []Record
	for _, g := range groups {
		want = append(want, g...)
	}
	if d := cmp.Diff(want, got, normalize); d != "" {
		t.Fatalf("records read through the journal differ (-want +got):\n%s", d)
	}
	// Resume: the journal becomes part-00000.parquet, nothing twice.
	w, err := NewWriter(context.Background(), crash, WriterOptions{RunID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	got2, run2 := readRun(t, crash)
	if len(run2.Journals) != 0 || len(run2.Files) != 1 {
		t.Fatalf("after resume: files %v journals %v", run2.Files, run2.Journals)
	}
	if d := cmp.Diff(want, got2, normalize); d != "" {
		t.Fatalf("compacted records differ (-want +got):\n%s", d)
	}
	if run2.Manifest.Counts.Rows != 6 {
		t.Errorf("run.json counts %d rows, want 6", run2.Manifest.Counts.Rows)
	}
}

// TestJournalCutAtEveryOffset cuts a journal of 3 groups at every byte
// offset: the reader and the resume always see exactly the groups whose
// frame is complete, never an error, never a partial group.
func TestJournalCutAtEveryOffset(t *testing.T) {
	groups := journalGroups()
	crash := crashedRun(t, groups, WriterOptions{RunID: "r"})
	jpath := filepath.Join(crash, "part-00000.journal")
	full, err := os.ReadFile(jpath)
	if err != nil {
		t.Fatal(err)
	}
	// Frame boundaries, from the encoder itself.
	ends := []int{len(journalMagic)}
	for _, g := range groups {
		var buf bytes.Buffer
		ptrs := make([]*Record, len(g))
		for i := range g {
			ptrs[i] = &g[i]
		}
		if err := appendFrame(&buf, ptrs); err != nil {
			t.Fatal(err)
		}
		ends = append(ends, ends[len(ends)-1]+buf.Len())
	}
	if ends[len(ends)-1] != len(full) {
		t.Fatalf("journal is %d bytes, frames add up to %d", len(full), ends[len(ends)-1])
	}
	manifest, err := os.ReadFile(filepath.Join(crash, ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	for cut := 0; cut <= len(full); cut++ {
		complete := 0
		for complete < len(groups) && ends[complete+1] <= cut {
			complete++
		}
		var recs []Record
		st, err := scanJournal(jpath, full[:cut], quiet, func(rs []Record) error {
			recs = append(recs, rs...)
			return nil
		})
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		if st.Frames != complete || len(recs) != 2*complete {
			t.Fatalf("cut at %d: %d frames / %d records, want %d groups", cut, st.Frames, len(recs), complete)
		}
		if torn := cut != 0 && cut != ends[complete]; (st.TornBytes > 0) != torn {
			t.Fatalf("cut at %d: torn bytes %d", cut, st.TornBytes)
		}
		// Around the frame boundaries, the whole resume path too.
		near := cut <= 1
		for _, e := range ends {
			near = near || (cut >= e-1 && cut <= e+1)
		}
		if !near {
			continue
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, ManifestName), manifest, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "part-00000.journal"), full[:cut], 0o644); err != nil {
			t.Fatal(err)
		}
		w, err := NewWriter(context.Background(), dir, WriterOptions{RunID: "r", Logger: quiet})
		if err != nil {
			t.Fatalf("cut at %d: resume: %v", cut, err)
		}
		if err := w.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		got, _ := readRun(t, dir)
		var want []Record
		for _, g := range groups[:complete] {
			want = append(want, g...)
		}
		if d := cmp.Diff(groupIDs(want), groupIDs(got)); d != "" {
			t.Fatalf("cut at %d: resumed run (-want +got):\n%s", cut, d)
		}
	}
}

// TestJournalCorruptionIsAnError flips every byte before the last frame:
// each flip is an ErrCorruptFile naming the file and an offset, never a
// silent skip.
func TestJournalCorruptionIsAnError(t *testing.T) {
	groups := journalGroups()
	crash := crashedRun(t, groups, WriterOptions{RunID: "r"})
	jpath := filepath.Join(crash, "part-00000.journal")
	full, err := os.ReadFile(jpath)
	if err != nil {
		t.Fatal(err)
	}
	var last bytes.Buffer
	g := groups[len(groups)-1]
	if err := appendFrame(&last, []*Record{&g[0], &g[1]}); err != nil {
		t.Fatal(err)
	}
	lastStart := len(full) - last.Len()
	p := filepath.Join(t.TempDir(), "part-00009.journal")
	for i := range lastStart + frameHeaderLen {
		b := bytes.Clone(full)
		b[i] ^= 0x41
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := ReadJournal(p, nil)
		var fe *FileError
		if !errors.Is(err, ErrCorruptFile) || !errors.As(err, &fe) || fe.Path != p || !strings.Contains(err.Error(), "offset ") {
			t.Fatalf("byte %d flipped: err = %v, want ErrCorruptFile naming %s and an offset", i, err, p)
		}
	}
	// Zeros after the last frame (a crash after the file grew but before
	// the data landed) are a torn tail.
	if err := os.WriteFile(p, append(bytes.Clone(full), make([]byte, 100)...), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, st, err := ReadJournal(p, nil)
	if err != nil || len(recs) != 6 || st.TornBytes != 100 {
		t.Fatalf("zero tail: %d records, %d torn bytes, %v", len(recs), st.TornBytes, err)
	}
	// Open of the run reports the corrupt journal by name.
	b := bytes.Clone(full)
	b[len(journalMagic)+frameHeaderLen+3] ^= 1
	if err := os.WriteFile(jpath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(crash); !errors.Is(err, ErrCorruptFile) || !strings.Contains(err.Error(), jpath) {
		t.Fatalf("Open with a corrupt journal: %v", err)
	}
	if _, err := NewWriter(context.Background(), crash, WriterOptions{RunID: "r"}); !errors.Is(err, ErrCorruptFile) {
		t.Fatalf("resume with a corrupt journal: %v", err)
	}
}

// TestJournalObsoleteAfterRename: a crash between a part file's rename
// and its journal's deletion leaves both; readers and the resume count the
// rows once.
func TestJournalObsoleteAfterRename(t *testing.T) {
	groups := journalGroups()
	ctx := context.Background()
	crash := crashedRun(t, groups, WriterOptions{RunID: "r"})
	journal, err := os.ReadFile(filepath.Join(crash, "part-00000.journal"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(ctx, crash, WriterOptions{RunID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(crash, "part-00000.journal"), journal, 0o644); err != nil {
		t.Fatal(err)
	}
	got, run := readRun(t, crash)
	if len(got) != 6 || len(run.Journals) != 0 {
		t.Fatalf("read %d records, journals %v; want 6 and none", len(got), run.Journals)
	}
	w, err = NewWriter(ctx, crash, WriterOptions{RunID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteGroup(ctx, journalGroups()[0]); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	got, run = readRun(t, crash)
	if len(got) != 8 || len(run.Files) != 2 {
		t.Fatalf("after resume: %d records in %v", len(got), run.Files)
	}
	if _, err := os.Stat(filepath.Join(crash, "part-00000.journal")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("obsolete journal not deleted: %v", err)
	}
}

// TestConcurrentGroupsShareFsyncs: groups written at once are all durable
// (readable from a copy) when WriteGroup returns.
func TestConcurrentGroupsShareFsyncs(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	w, err := NewWriter(ctx, dir, WriterOptions{RunID: "r", MaxRowsPerFile: 10})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	acked := map[string]bool{}
	for g := range 40 {
		wg.Go(func() {
			var grp []Record
			for i := range 2 {
				grp = append(grp, sizedRecord(9, g*2+i, 64, 2))
			}
			if err := w.WriteGroup(ctx, grp); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			acked[grp[0].GroupID] = true
			mu.Unlock()
		})
	}
	wg.Wait()
	snap := t.TempDir()
	copyDir(t, dir, snap)
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if w.JournalBytes() == 0 {
		t.Error("no journal bytes counted")
	}
	got, _ := readRun(t, snap)
	seen := map[string]int{}
	for _, r := range got {
		seen[r.GroupID]++
	}
	for id := range acked {
		if seen[id] != 2 {
			t.Errorf("acknowledged group %s has %d rows in the snapshot", id, seen[id])
		}
	}
	if len(seen) != len(acked) {
		t.Errorf("snapshot has %d groups, %d acknowledged", len(seen), len(acked))
	}
}

// TestGroupSequenceNumbers: the sequence numbers WriteGroupSeq returns
// are the positions EachGroup reads, across rotations, a crash and a
// resume.
func TestGroupSequenceNumbers(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := WriterOptions{RunID: "r", MaxRowsPerFile: 4}
	w, err := NewWriter(ctx, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]string{}
	write := func(w *Writer, g int) {
		var grp []Record
		for i := range 2 {
			r := sizedRecord(3, g*2+i, 16, 2)
			grp = append(grp, r)
		}
		seq, err := w.WriteGroupSeq(ctx, grp)
		if err != nil {
			t.Fatal(err)
		}
		if prev, dup := want[seq]; dup {
			t.Fatalf("sequence %d returned for %s and %s", seq, prev, grp[0].GroupID)
		}
		want[seq] = grp[0].GroupID
	}
	for g := range 5 {
		write(w, g)
	}
	crash := t.TempDir()
	copyDir(t, dir, crash) // part-00000, part-00001 and a journal with one group
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	w, err = NewWriter(ctx, crash, opts)
	if err != nil {
		t.Fatal(err)
	}
	for g := 5; g < 8; g++ {
		write(w, g)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	run, err := Open(crash)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]string{}
	err = run.EachGroup(ctx, func(seq int64, recs []Record) error {
		got[seq] = recs[0].GroupID
		if len(recs) != 2 {
			t.Errorf("group %d has %d records", seq, len(recs))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("sequence numbers (-written +read):\n%s", d)
	}
}

// A zero advantage (an all-equal group) or a policy version of 0 is a
// value, not a missing one: it must come back from the journal as set.
func TestJournalKeepsZeroOptionalFields(t *testing.T) {
	zero, v0 := 0.0, int64(0)
	r := Record{Advantage: &zero, PolicyVersion: &v0, PolicyLag: &v0, MinPolicyVersion: &v0, MaxPolicyVersion: &v0}
	var none Record
	var buf bytes.Buffer
	if err := appendFrame(&buf, []*Record{&r, &none}); err != nil {
		t.Fatal(err)
	}
	fr, err := decodeFrame(buf.Bytes()[frameHeaderLen:])
	if err != nil {
		t.Fatal(err)
	}
	got := fr.Records[0]
	if got.Advantage == nil || *got.Advantage != 0 || got.PolicyVersion == nil || got.PolicyLag == nil || got.MinPolicyVersion == nil || got.MaxPolicyVersion == nil {
		t.Fatalf("zero-valued optional fields lost: %+v", got)
	}
	if n := fr.Records[1]; n.Advantage != nil || n.PolicyVersion != nil || n.Failure != nil {
		t.Fatalf("unset optional fields came back set: %+v", n)
	}
}

// Every group WriteGroup makes durable is timed (DurableWaits and
// rollout_trajectory_group_durable_seconds); with the journal off nothing
// waits and nothing is counted.
func TestDurableWaitsCounted(t *testing.T) {
	ctx := context.Background()
	for _, noJournal := range []bool{false, true} {
		w, err := NewWriter(ctx, t.TempDir(), WriterOptions{RunID: "r", NoJournal: noJournal})
		if err != nil {
			t.Fatal(err)
		}
		g0, w0 := DurableWaits()
		for _, g := range journalGroups() {
			if err := w.WriteGroup(ctx, g); err != nil {
				t.Fatal(err)
			}
		}
		g1, w1 := DurableWaits()
		if err := w.Close(ctx); err != nil {
			t.Fatal(err)
		}
		want := int64(3)
		if noJournal {
			want = 0
		}
		if g1-g0 != want || (want > 0) != (w1 > w0) {
			t.Errorf("journal off %v: %d groups waited %s, want %d", noJournal, g1-g0, w1-w0, want)
		}
	}
}
