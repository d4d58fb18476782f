package atropos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func spoolGroup(i int) *spoolEntry {
	return &spoolEntry{GroupID: fmt.Sprintf("g%d", i), Sequences: 1, MaxLen: 3, Group: json.RawMessage(fmt.Sprintf(`{"tokens":[[%d]],"masks":[[%d]],"scores":[0]}`, i, i))}
}

func segmentFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, segmentPrefix+"*"+segmentSuffix))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Entries come back in order across segment rotation and reopening;
// delivered segments are deleted; the cursor survives.
func TestSpoolOrderRotationAndReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := openSpool(dir, 200) // a couple of entries per segment
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := s.append(spoolGroup(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(segmentFiles(t, dir)); n < 3 {
		t.Fatalf("%d segments, want rotation", n)
	}
	refs := s.peek(4, 1<<20)
	for i, r := range refs {
		e, err := s.read(r)
		if err != nil {
			t.Fatal(err)
		}
		if e.GroupID != fmt.Sprintf("g%d", i) || e.Seq != uint64(i+1) {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}
	if err := s.ack(refs); err != nil {
		t.Fatal(err)
	}
	if err := s.ack(refs[:1]); err == nil {
		t.Fatal("acking an entry twice was accepted")
	}
	before := len(segmentFiles(t, dir))
	if err := s.close(); err != nil {
		t.Fatal(err)
	}

	s2, err := openSpool(dir, 200)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.close()
	if s2.len() != 6 {
		t.Fatalf("%d pending after reopen, want 6", s2.len())
	}
	if after := len(segmentFiles(t, dir)); after > before+1 {
		t.Errorf("%d segments after reopen (%d before): delivered segments kept", after, before)
	}
	if err := s2.append(spoolGroup(10)); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for s2.len() > 0 {
		refs := s2.peek(3, 1<<20)
		for _, r := range refs {
			e, err := s2.read(r)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, fmt.Sprintf("%s/%d", e.GroupID, e.Seq))
		}
		if err := s2.ack(refs); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(ids, " "); got != "g4/5 g5/6 g6/7 g7/8 g8/9 g9/10 g10/11" {
		t.Fatalf("replay order %s", got)
	}
	if n := len(segmentFiles(t, dir)); n != 1 {
		t.Errorf("%d segments once everything is delivered, want only the write segment", n)
	}
}

func TestSpoolPeekBoundsBytes(t *testing.T) {
	s, err := openSpool(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	for i := range 5 {
		if err := s.append(spoolGroup(i)); err != nil {
			t.Fatal(err)
		}
	}
	one := s.peek(5, 1)
	if len(one) != 1 {
		t.Fatalf("peek with a tiny byte bound returned %d entries, want 1", len(one))
	}
	if two := s.peek(5, 2*one[0].n+1); len(two) != 2 {
		t.Fatalf("peek returned %d entries, want 2", len(two))
	}
}

// A corrupt line in the middle of a segment is not silently skipped.
func TestSpoolCorruptEntryIsAnError(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, segmentName(1)), []byte("{\"seq\":1,\"group\":{}}\nnot json\n{\"seq\":3,\"group\":{}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := openSpool(dir, 1<<20)
	if err == nil || !strings.Contains(err.Error(), "corrupt entry at byte 21") {
		t.Fatalf("err = %v", err)
	}
}

func TestWithEnvID(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"tokens":[[1]]}`, `{"env_id":7,"tokens":[[1]]}`},
		{` { } `, `{"env_id":7}`},
	} {
		got, err := withEnvID(json.RawMessage(tc.in), 7)
		if err != nil || string(got) != tc.want {
			t.Errorf("withEnvID(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	if _, err := withEnvID(json.RawMessage(`[1]`), 7); err == nil {
		t.Error("a non-object group was accepted")
	}
}

// FuzzSpoolOpen: whatever a crash or a disk leaves in a segment, opening
// the spool either fails with an error or indexes entries that read back
// with their seq; it never panics.
func FuzzSpoolOpen(f *testing.F) {
	f.Add([]byte("{\"seq\":1,\"group_id\":\"g\",\"group\":{\"tokens\":[[1]]}}\n{\"seq\":2,\"gro"))
	f.Add([]byte("{\"seq\":3,\"group\":{}}\n{\"seq\":1,\"group\":{}}\n"))
	f.Add([]byte("\n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, segmentName(1)), data, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := openSpool(dir, 1<<20)
		if err != nil {
			return
		}
		defer s.close()
		for _, r := range s.peek(1<<30, 1<<30) {
			if _, err := s.read(r); err != nil {
				t.Fatalf("indexed entry %d does not read back: %v", r.seq, err)
			}
		}
	})
}
