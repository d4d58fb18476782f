package trajectory

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/parquet-go/parquet-go"
)

// readAsOlderFile writes rec as a part file whose schema lacks the Record
// fields in added (a file written before those columns existed) and reads
// it back. A name "Manifest.Backend" drops a field of a nested group.
func readAsOlderFile(t *testing.T, rec Record, added map[string]bool) Record {
	t.Helper()
	row := reflect.New(olderType(reflect.TypeFor[Record](), "", added)).Elem()
	copyFields(row, reflect.ValueOf(rec))
	path := filepath.Join(t.TempDir(), "part-00000.parquet")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := parquet.NewWriter(f, parquet.SchemaOf(row.Interface()), parquet.KeyValueMetadata(MetadataSchemaVersionKey, strconv.Itoa(SchemaVersion)))
	if err := w.Write(row.Interface()); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("%d records", len(got))
	}
	return got[0]
}

// olderType is rt without the fields named in added (prefix.Name).
func olderType(rt reflect.Type, prefix string, added map[string]bool) reflect.Type {
	var fields []reflect.StructField
	for i := range rt.NumField() {
		f := rt.Field(i)
		name := prefix + f.Name
		if added[name] {
			continue
		}
		for k := range added {
			if f.Type.Kind() == reflect.Struct && strings.HasPrefix(k, name+".") {
				f.Type = olderType(f.Type, name+".", added)
				break
			}
		}
		fields = append(fields, f)
	}
	return reflect.StructOf(fields)
}

// copyFields sets every field of dst from src's field of the same name,
// field by field where olderType changed the type.
func copyFields(dst, src reflect.Value) {
	for i := range dst.NumField() {
		d, s := dst.Field(i), src.FieldByName(dst.Type().Field(i).Name)
		if d.Type() == s.Type() {
			d.Set(s)
		} else {
			copyFields(d, s)
		}
	}
}

// A part file written before a nullable column was added still reads: the
// column reads as empty (docs/trajectory-schema.md: adding a column keeps
// the schema version). Here: loop_events, turn_rewards, distill_token_ids,
// distill_logprobs.
func TestReadsFilesWithoutLoopEvents(t *testing.T) {
	want := fixtureRecords()[1]
	want.LoopEvents, want.TurnRewards, want.DistillTokenIDs, want.DistillLogprobs = nil, nil, nil, nil
	got := readAsOlderFile(t, want, map[string]bool{"LoopEvents": true, "TurnRewards": true, "DistillTokenIDs": true, "DistillLogprobs": true})
	if len(got.LoopEvents) != 0 || len(got.TurnRewards) != 0 || len(got.DistillTokenIDs) != 0 || len(got.DistillLogprobs) != 0 {
		t.Fatalf("loop events %+v, turn rewards %v", got.LoopEvents, got.TurnRewards)
	}
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("record (-want +got):\n%s", d)
	}
}

// A part file written before unscored_tokens existed reads it as 0.
func TestReadsFilesWithoutUnscoredTokens(t *testing.T) {
	want := fixtureRecords()[2]
	want.UnscoredTokens = 0
	got := readAsOlderFile(t, fixtureRecords()[2], map[string]bool{"UnscoredTokens": true})
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("record (-want +got):\n%s", d)
	}
}

// A part file written before the routed-experts columns existed reads
// them as empty.
func TestReadsFilesWithoutRoutedExperts(t *testing.T) {
	want := fixtureRecords()[2]
	if len(want.RoutedExperts) == 0 {
		t.Fatal("fixture without routed experts")
	}
	want.RoutedExperts, want.RoutedExpertsShape = nil, nil
	got := readAsOlderFile(t, fixtureRecords()[2], map[string]bool{"RoutedExperts": true, "RoutedExpertsShape": true})
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("record (-want +got):\n%s", d)
	}
}

// A part file written before the asynchronous-RL columns existed reads
// with them empty/null.
func TestReadsFilesWithoutPolicyVersions(t *testing.T) {
	want := fixtureRecords()[1]
	want.TokenVersions, want.MinPolicyVersion, want.MaxPolicyVersion, want.PolicyLag, want.VersionCuts = nil, nil, nil, nil, nil
	r := readAsOlderFile(t, want, map[string]bool{"TokenVersions": true, "MinPolicyVersion": true, "MaxPolicyVersion": true, "PolicyLag": true, "VersionCuts": true, "Stale": true})
	if len(r.TokenVersions) != 0 || r.MinPolicyVersion != nil || r.MaxPolicyVersion != nil || r.PolicyLag != nil || len(r.VersionCuts) != 0 || r.Stale {
		t.Fatalf("new columns not empty: %+v %v %v %v %+v %v", r.TokenVersions, r.MinPolicyVersion, r.MaxPolicyVersion, r.PolicyLag, r.VersionCuts, r.Stale)
	}
	if d := cmp.Diff(want, r, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("record (-want +got):\n%s", d)
	}
}

// A part file written before manifest.backend existed reads it as empty.
func TestReadsFilesWithoutManifestBackend(t *testing.T) {
	rec := fixtureRecords()[0]
	rec.Manifest.Backend = "runc"
	want := rec
	want.Manifest.Backend = ""
	got := readAsOlderFile(t, rec, map[string]bool{"Manifest.Backend": true})
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("record (-want +got):\n%s", d)
	}
}

// A part file written before call_statuses existed reads it as empty.
func TestReadsFilesWithoutCallStatuses(t *testing.T) {
	want := fixtureRecords()[1]
	want.CallStatuses = nil
	got := readAsOlderFile(t, fixtureRecords()[1], map[string]bool{"CallStatuses": true})
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("record (-want +got):\n%s", d)
	}
}

// A part file written before the branch columns existed reads as branch 0
// of its rollout: parent_branch and split_call −1, no session id, no calls.
func TestReadsFilesWithoutBranches(t *testing.T) {
	rec := fixtureRecords()[1]
	want := rec
	want.SessionID = ""
	got := readAsOlderFile(t, rec, map[string]bool{"SessionID": true, "Branch": true, "ParentBranch": true, "SplitCall": true,
		"SharedTokens": true, "Calls": true, "EchoRewritten": true, "EchoUnanchored": true})
	if got.Branch != 0 || got.ParentBranch != -1 || got.SplitCall != -1 || !got.Main() {
		t.Fatalf("branch %d parent %d split %d", got.Branch, got.ParentBranch, got.SplitCall)
	}
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("record (-want +got):\n%s", d)
	}
}
