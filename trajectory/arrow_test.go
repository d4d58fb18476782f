package trajectory

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"github.com/google/go-cmp/cmp"
)

// readWithArrow reads a part file with Apache Arrow's Parquet implementation
// (the Go port of the C++ reader pyarrow uses) and returns the Arrow schema
// and every row as column name -> plain Go value.
func readWithArrow(t *testing.T, path string) (*arrow.Schema, []map[string]any) {
	t.Helper()
	pf, err := file.OpenParquetFile(path, false)
	if err != nil {
		t.Fatalf("arrow open %s: %v", path, err)
	}
	defer pf.Close()
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		t.Fatalf("arrow reader %s: %v", path, err)
	}
	tbl, err := fr.ReadTable(context.Background())
	if err != nil {
		t.Fatalf("arrow read %s: %v", path, err)
	}
	defer tbl.Release()
	tr := array.NewTableReader(tbl, 1024)
	defer tr.Release()
	var rows []map[string]any
	for tr.Next() {
		rec := tr.RecordBatch()
		for i := 0; i < int(rec.NumRows()); i++ {
			row := map[string]any{}
			for c, f := range rec.Schema().Fields() {
				row[f.Name] = arrowValue(t, rec.Column(c), i)
			}
			rows = append(rows, row)
		}
	}
	return tbl.Schema(), rows
}

func arrowValue(t *testing.T, a arrow.Array, i int) any {
	if a.IsNull(i) {
		return nil
	}
	switch a := a.(type) {
	case *array.Int8:
		return a.Value(i)
	case *array.Int32:
		return a.Value(i)
	case *array.Uint16:
		return a.Value(i)
	case *array.Int64:
		return a.Value(i)
	case *array.Float32:
		return a.Value(i)
	case *array.Float64:
		return a.Value(i)
	case *array.Boolean:
		return a.Value(i)
	case *array.String:
		return a.Value(i)
	case *array.Timestamp:
		unit := a.DataType().(*arrow.TimestampType).Unit
		return a.Value(i).ToTime(unit).UTC()
	case *array.Map:
		start, end := a.ValueOffsets(i)
		m := map[string]any{}
		for j := start; j < end; j++ {
			m[fmt.Sprint(arrowValue(t, a.Keys(), int(j)))] = arrowValue(t, a.Items(), int(j))
		}
		return m
	case *array.List:
		start, end := a.ValueOffsets(i)
		out := []any{}
		for j := start; j < end; j++ {
			out = append(out, arrowValue(t, a.ListValues(), int(j)))
		}
		return out
	case *array.Struct:
		m := map[string]any{}
		st := a.DataType().(*arrow.StructType)
		for f := 0; f < a.NumField(); f++ {
			m[st.Field(f).Name] = arrowValue(t, a.Field(f), i)
		}
		return m
	}
	t.Fatalf("unexpected Arrow type %s", a.DataType())
	return nil
}

func listOf[T any](s []T) []any {
	out := []any{}
	for _, v := range s {
		out = append(out, v)
	}
	return out
}

// expectedArrowRow is the hand-written expectation of how each column of r
// must look to an Arrow-based reader.
func expectedArrowRow(r Record) map[string]any {
	var policy, adv, failure any
	if r.PolicyVersion != nil {
		policy = *r.PolicyVersion
	}
	if r.Advantage != nil {
		adv = *r.Advantage
	}
	if r.Failure != nil {
		failure = map[string]any{"kind": r.Failure.Kind, "message": r.Failure.Message}
	}
	comps := map[string]any{}
	for k, v := range r.RewardComponents {
		comps[k] = v
	}
	toolErrs := []any{}
	for _, te := range r.ToolErrors {
		toolErrs = append(toolErrs, map[string]any{"turn": te.Turn, "tool": te.Tool, "call_id": te.CallID, "kind": te.Kind, "message": te.Message})
	}
	loopEvents := []any{}
	for _, e := range r.LoopEvents {
		loopEvents = append(loopEvents, map[string]any{"turn": e.Turn, "kind": e.Kind, "message": e.Message, "call_id": e.CallID, "original": e.Original, "detail": e.Detail})
	}
	statuses := []any{}
	for _, c := range r.CallStatuses {
		statuses = append(statuses, map[string]any{"turn": c.Turn, "index": c.Index, "name": c.Name, "status": c.Status, "reason": c.Reason, "span_start": c.SpanStart, "span_end": c.SpanEnd})
	}
	m := r.Manifest
	cuts := []any{}
	for _, c := range r.VersionCuts {
		cuts = append(cuts, map[string]any{"turn": c.Turn, "position": c.Position, "kind": c.Kind, "from": c.From, "to": c.To})
	}
	opt := func(p *int64) any {
		if p == nil {
			return nil
		}
		return *p
	}
	return map[string]any{
		"token_versions": listOf(r.TokenVersions), "min_policy_version": opt(r.MinPolicyVersion), "max_policy_version": opt(r.MaxPolicyVersion),
		"policy_lag": opt(r.PolicyLag), "version_cuts": cuts, "stale": r.Stale,
		"schema_version": int32(SchemaVersion), "run_id": r.RunID, "env": r.Env, "category": r.Category,
		"item_id": r.ItemID, "group_id": r.GroupID, "rollout_index": r.RolloutIndex, "model": r.Model,
		"policy_version": policy, "sampling_params": r.SamplingParams, "messages": r.Messages, "tools": r.Tools,
		"tokens": listOf(r.Tokens), "loss_mask": listOf(r.LossMask), "masks": listOf(r.Masks), "logprobs": listOf(r.Logprobs),
		"prompt_tokens": r.PromptTokens, "completion_tokens": r.CompletionTokens,
		"reward": r.Reward, "reward_components": comps, "advantage": adv,
		"turns": r.Turns, "finished_naturally": r.FinishedNaturally, "stop_reason": r.StopReason,
		"status": r.Status, "failure": failure, "tool_errors": toolErrs, "loop_events": loopEvents, "call_statuses": statuses, "turn_rewards": listOf(r.TurnRewards),
		"distill_token_ids": nestedOf(r.DistillTokenIDs), "distill_logprobs": nestedOf(r.DistillLogprobs),
		"timings": map[string]any{"generation_ms": r.Timings.GenerationMS, "tools_ms": r.Timings.ToolsMS,
			"sandbox_start_ms": r.Timings.SandboxStartMS, "reward_ms": r.Timings.RewardMS, "total_ms": r.Timings.TotalMS},
		"drift_tokens": r.DriftTokens, "unscored_tokens": r.UnscoredTokens,
		"routed_experts": listOf(r.RoutedExperts), "routed_experts_shape": listOf(r.RoutedExpertsShape),
		"manifest": map[string]any{"image_digest": m.ImageDigest, "cpus": m.CPUs, "memory_bytes": m.MemoryBytes,
			"pids_limit": m.PidsLimit, "network": m.Network, "rollout_timeout_ms": m.RolloutTimeoutMS,
			"tool_timeout_ms": m.ToolTimeoutMS, "parser": m.Parser, "service_version": m.ServiceVersion, "config_hash": m.ConfigHash,
			"disk_bytes": m.DiskBytes, "runtime": m.Runtime, "backend": m.Backend},
		"created_at": r.CreatedAt.UTC().Truncate(time.Microsecond),
		"session_id": r.SessionID, "branch": r.Branch, "parent_branch": r.ParentBranch, "split_call": r.SplitCall,
		"shared_tokens": r.SharedTokens, "calls": r.Calls, "echo_rewritten": r.EchoRewritten, "echo_unanchored": r.EchoUnanchored,
	}
}

// TestIndependentReader reads the writer's files with arrow-go's pqarrow and
// checks the Arrow schema (golden) and every column value of every row.
func TestIndependentReader(t *testing.T) {
	want := fixtureRecords()
	dir := writeFixtureRun(t, want)
	run, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Files) < 2 {
		t.Fatalf("want several part files, got %v", run.Files)
	}
	var got []map[string]any
	var schema *arrow.Schema
	for _, p := range run.Files {
		s, rows := readWithArrow(t, p)
		if schema != nil && !schema.Equal(s) {
			t.Fatalf("schema differs between files:\n%s\n%s", schema, s)
		}
		schema = s
		got = append(got, rows...)
	}
	if len(got) != len(want) {
		t.Fatalf("arrow read %d rows, want %d", len(got), len(want))
	}
	for i := range want {
		exp := expectedArrowRow(want[i])
		if len(got[i]) != len(exp) {
			t.Errorf("row %d: arrow sees %d columns, expectation has %d", i, len(got[i]), len(exp))
		}
		if d := cmp.Diff(exp, got[i]); d != "" {
			t.Errorf("row %d (-want +arrow):\n%s", i, d)
		}
	}
	checkGolden(t, "arrow_schema.golden", []byte(schema.String()+"\n"))
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (set UPDATE_GOLDEN=1 to create): %v", err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("%s mismatch (-golden +got):\n%s", name, d)
	}
}

func nestedOf[T any](s [][]T) []any {
	out := []any{}
	for _, v := range s {
		out = append(out, listOf(v))
	}
	return out
}
