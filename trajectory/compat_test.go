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

// A part file written before a nullable column was added still reads: the
// column reads as empty (docs/trajectory-schema.md: adding a column keeps
// the schema version). Here: loop_events, turn_rewards, distill_token_ids,
// distill_logprobs.
func TestReadsFilesWithoutLoopEvents(t *testing.T) {
	added := map[string]bool{"LoopEvents": true, "TurnRewards": true, "DistillTokenIDs": true, "DistillLogprobs": true}
	rt := reflect.TypeFor[Record]()
	var fields []reflect.StructField
	for i := range rt.NumField() {
		if f := rt.Field(i); !added[f.Name] {
			fields = append(fields, f)
		}
	}
	old := reflect.StructOf(fields)
	want := fixtureRecords()[1]
	want.LoopEvents, want.TurnRewards, want.DistillTokenIDs, want.DistillLogprobs = nil, nil, nil, nil
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
	if len(got[0].LoopEvents) != 0 || len(got[0].TurnRewards) != 0 || len(got[0].DistillTokenIDs) != 0 || len(got[0].DistillLogprobs) != 0 {
		t.Fatalf("loop events %+v, turn rewards %v", got[0].LoopEvents, got[0].TurnRewards)
	}
	got[0].LoopEvents, got[0].TurnRewards, got[0].DistillTokenIDs, got[0].DistillLogprobs = nil, nil, nil, nil
	if d := cmp.Diff(want, got[0], cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("record (-want +got):\n%s", d)
	}
}
