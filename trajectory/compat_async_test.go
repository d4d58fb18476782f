package trajectory

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/parquet-go/parquet-go"
)

// A part file written before the asynchronous-RL columns existed reads
// with them empty/null.
func TestReadsFilesWithoutPolicyVersions(t *testing.T) {
	skip := map[string]bool{"TokenVersions": true, "MinPolicyVersion": true, "MaxPolicyVersion": true, "PolicyLag": true, "VersionCuts": true, "Stale": true}
	rt := reflect.TypeFor[Record]()
	var fields []reflect.StructField
	for i := range rt.NumField() {
		if f := rt.Field(i); !skip[f.Name] {
			fields = append(fields, f)
		}
	}
	old := reflect.StructOf(fields)
	want := fixtureRecords()[1]
	want.TokenVersions, want.MinPolicyVersion, want.MaxPolicyVersion, want.PolicyLag, want.VersionCuts = nil, nil, nil, nil, nil
	row := reflect.New(old).Elem()
	src := reflect.ValueOf(want)
	for i := range old.NumField() {
		row.Field(i).Set(src.FieldByName(old.Field(i).Name))
	}
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
	r := got[0]
	if len(r.TokenVersions) != 0 || r.MinPolicyVersion != nil || r.MaxPolicyVersion != nil || r.PolicyLag != nil || len(r.VersionCuts) != 0 || r.Stale {
		t.Fatalf("new columns not empty: %+v %v %v %v %+v %v", r.TokenVersions, r.MinPolicyVersion, r.MaxPolicyVersion, r.PolicyLag, r.VersionCuts, r.Stale)
	}
	if d := cmp.Diff(want, r, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("record (-want +got):\n%s", d)
	}
}

func TestValidateTokenVersions(t *testing.T) {
	r := fixtureRecords()[0]
	if len(r.Tokens) == 0 {
		t.Skip("fixture has no tokens")
	}
	r.TokenVersions = make([]int64, len(r.Tokens)+1)
	if err := r.Validate(); err == nil {
		t.Fatal("misaligned token_versions accepted")
	}
	r.TokenVersions = make([]int64, len(r.Tokens))
	r.VersionCuts = []VersionCut{{Turn: 1, Position: int32(len(r.Tokens)), Kind: "abort", From: 0, To: 1}}
	if err := r.Validate(); err == nil {
		t.Fatal("cut outside the tokens accepted")
	}
	r.VersionCuts[0].Position = -1
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
}
