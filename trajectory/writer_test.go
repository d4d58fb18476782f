package trajectory

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/parquet-go/parquet-go"
)

func TestRoundTripGoReader(t *testing.T) {
	want := fixtureRecords()
	dir := writeFixtureRun(t, want)
	run, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := run.ReadAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
	m := run.Manifest
	if m.State != RunClosed || m.Counts.Rows != int64(len(want)) || m.Counts.OK != 5 || m.Counts.InfraFailed != 1 {
		t.Errorf("manifest state/counts = %s %+v", m.State, m.Counts)
	}
	if len(m.Files) != 2 || m.Files[0].Name != "part-00000.parquet" || m.Files[0].Rows != 4 || m.Files[1].Rows != 2 {
		t.Errorf("manifest files = %+v", m.Files)
	}
	var cfg bytes.Buffer
	if err := json.Compact(&cfg, m.Config); err != nil || cfg.String() != `{"env":"arith","group_size":3}` || m.RunID != "run-fixture" {
		t.Errorf("manifest config/run id = %s %q", m.Config, m.RunID)
	}
	// Row groups are bounded: 2 rows per group.
	f, err := os.Open(filepath.Join(dir, "part-00000.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	pf, err := parquet.OpenFile(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(pf.RowGroups()); n != 2 {
		t.Errorf("row groups = %d, want 2", n)
	}
	for _, c := range pf.Metadata().RowGroups[0].Columns {
		if c.MetaData.Codec.String() != "ZSTD" {
			t.Errorf("column %v codec %s, want ZSTD", c.MetaData.PathInSchema, c.MetaData.Codec)
		}
	}
}

func TestResumeContinuesNumbering(t *testing.T) {
	recs := fixtureRecords()
	dir := writeFixtureRun(t, recs)
	// A crash leftover must be dropped on resume.
	if err := os.WriteFile(filepath.Join(dir, ".part-00009.parquet.tmp"), []byte("PAR1junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w, err := NewWriter(ctx, dir, WriterOptions{RunID: "run-fixture"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, recs[0]); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	m := w.Manifest()
	if len(m.Files) != 3 || m.Files[2].Name != "part-00002.parquet" || m.Counts.Rows != int64(len(recs)+1) {
		t.Errorf("after resume: files %+v counts %+v", m.Files, m.Counts)
	}
	if _, err := os.Stat(filepath.Join(dir, ".part-00009.parquet.tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temp file not removed: %v", err)
	}
	if _, err := NewWriter(ctx, dir, WriterOptions{RunID: "other-run"}); err == nil {
		t.Error("resuming a run dir under another run id succeeded")
	}
}

func TestWriteRefusesInvalidRecords(t *testing.T) {
	good := fixtureRecords()[0]
	tests := []struct {
		name   string
		mutate func(r *Record)
		want   string
	}{
		{"masks misaligned", func(r *Record) { r.Masks = r.Masks[1:] }, "masks has 8 entries, tokens 9"},
		{"trained mask not token", func(r *Record) { r.Masks[3] = 7 }, "masks[3] = 7 on a trained position"},
		{"untrained mask not -100", func(r *Record) { r.Masks[0] = 0 }, "masks[0] = 0 on an untrained position"},
		{"logprobs misaligned", func(r *Record) { r.Logprobs = r.Logprobs[:2] }, "logprobs has 2 entries"},
		{"bad loss mask", func(r *Record) { r.LossMask[0] = 2 }, "loss_mask[0] = 2"},
		{"unknown status", func(r *Record) { r.Status = "maybe" }, `status "maybe"`},
		{"infra failure without kind", func(r *Record) { r.Status = StatusInfraFailed }, "needs a failure kind"},
		{"messages not json", func(r *Record) { r.Messages = "[{" }, "messages is not valid JSON"},
		{"token counts", func(r *Record) { r.PromptTokens = 1 }, "prompt_tokens 1 + completion_tokens 6 != 9"},
		{"newer schema", func(r *Record) { r.SchemaVersion = SchemaVersion + 1 }, "schema_version 2"},
	}
	ctx := context.Background()
	w, err := NewWriter(ctx, t.TempDir(), WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := good
			r.Masks = append([]int32(nil), good.Masks...)
			r.LossMask = append([]int8(nil), good.LossMask...)
			tt.mutate(&r)
			err := w.Write(ctx, r)
			if !errors.Is(err, ErrInvalidRecord) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Write = %v, want ErrInvalidRecord containing %q", err, tt.want)
			}
		})
	}
	// Refusals do not stop intake.
	if err := w.Write(ctx, good); err != nil {
		t.Fatalf("valid record after refusals: %v", err)
	}
}

func TestConcurrentWritersAndBackPressure(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	w, err := NewWriter(ctx, dir, WriterOptions{QueueSize: 1, MaxRowsPerFile: 50, RowGroupRows: 7})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				r := sizedRecord(1, g*25+i, 64, 8)
				if err := w.Write(ctx, r); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	run, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 200 || len(run.Files) != 4 {
		t.Fatalf("read %d records in %d files, want 200 in 4", len(recs), len(run.Files))
	}
	if err := w.Write(ctx, recs[0]); !errors.Is(err, ErrClosed) {
		t.Errorf("Write after Close = %v, want ErrClosed", err)
	}
	// A cancelled context unblocks a Write stuck on a full queue.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	w2, err := NewWriter(ctx, t.TempDir(), WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close(ctx)
	if err := w2.Checkpoint(cctx); !errors.Is(err, context.Canceled) {
		// Either the send or the wait sees the cancellation.
		t.Errorf("Checkpoint(cancelled) = %v", err)
	}
}

func TestCheckpointMakesRecordsVisible(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	w, err := NewWriter(ctx, dir, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	for i := range 3 {
		if err := w.Write(ctx, sizedRecord(2, i, 32, 8)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	run, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if run.Manifest.State != RunRunning || run.Manifest.Counts.Rows != 3 || len(run.Unlisted) != 0 {
		t.Errorf("after checkpoint: %+v unlisted %v", run.Manifest, run.Unlisted)
	}
}

// enospcFile fails like a full disk once budget bytes were written.
type enospcFile struct {
	*os.File
	budget int
}

func (f *enospcFile) Write(p []byte) (int, error) {
	if len(p) > f.budget {
		n, _ := f.File.Write(p[:f.budget])
		f.budget = 0
		return n, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
	}
	f.budget -= len(p)
	return f.File.Write(p)
}

func TestDiskFullStopsIntakeKeepsWrittenFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	files := 0
	orig := createPart
	createPart = func(path string) (partWriter, error) {
		f, err := orig(path)
		if err != nil {
			return nil, err
		}
		files++
		if files == 3 { // the third part file hits a full disk
			return &enospcFile{File: f.(*os.File), budget: 2000}, nil
		}
		return f, nil
	}
	defer func() { createPart = orig }()
	w, err := NewWriter(ctx, dir, WriterOptions{MaxRowsPerFile: 5, RowGroupRows: 1, QueueSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	written := 0
	for i := range 1000 {
		if werr = w.Write(ctx, sizedRecord(3, i, 256, 8)); werr != nil {
			break
		}
		written++
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("Write after disk full = %v, want ENOSPC", werr)
	}
	cerr := w.Close(ctx)
	if !errors.Is(cerr, syscall.ENOSPC) {
		t.Errorf("Close = %v, want ENOSPC", cerr)
	}
	run, err := Open(dir)
	if err != nil {
		t.Fatalf("run unreadable after disk full: %v", err)
	}
	recs, err := run.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := run.Manifest
	// The third part file failed, but its records reached the journal
	// before it: they stay readable and the resume compacts them.
	if run.JournalRecords == 0 || len(recs) != 10+run.JournalRecords || m.State != RunFailed || !strings.Contains(m.Error, "no space left") {
		t.Errorf("after disk full: %d records readable (%d in the journal), manifest %s %q", len(recs), run.JournalRecords, m.State, m.Error)
	}
	if (m.Counts.Lost > 0) != strings.Contains(cerr.Error(), "records lost") {
		t.Errorf("Close = %v with %d records lost: the count belongs in the error", cerr, m.Counts.Lost)
	}
	if int64(written) != m.Counts.Rows+int64(run.JournalRecords)+m.Counts.Lost {
		t.Errorf("accepted %d records, manifest has %d rows + %d lost, journal %d", written, m.Counts.Rows, m.Counts.Lost, run.JournalRecords)
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, ".*.tmp")); len(tmp) != 0 {
		t.Errorf("temp files left: %v", tmp)
	}
}

func TestReaderErrorsNameFileAndReason(t *testing.T) {
	good := writeFixtureRun(t, fixtureRecords()[:2])
	goodFile := filepath.Join(good, "part-00000.parquet")
	data, err := os.ReadFile(goodFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	foreign := filepath.Join(dir, "foreign.parquet")
	if err := parquet.WriteFile(foreign, []struct {
		A int64 `parquet:"a"`
	}{{1}}); err != nil {
		t.Fatal(err)
	}
	newer := write("newer.parquet", newerSchemaFile(t))
	tests := []struct {
		name string
		path string
		is   error
		msg  string
	}{
		{"missing", filepath.Join(dir, "nope.parquet"), os.ErrNotExist, "no such file"},
		{"truncated", write("trunc.parquet", data[:len(data)/2]), ErrCorruptFile, "no Parquet footer"},
		{"tiny", write("tiny.parquet", data[:5]), ErrCorruptFile, "only 5 bytes"},
		{"json", write("x.parquet", []byte(`{"tokens":[1,2,3]}`+"\n")), ErrForeignFile, "no PAR1 header"},
		{"foreign parquet", foreign, ErrForeignFile, `without "rollout.schema_version"`},
		{"newer schema", newer, ErrNewerSchema, "schema version 99, this build reads up to 1; upgrade rollout"},
		{"corrupt middle", write("mid.parquet", corruptMiddle(data)), ErrCorruptFile, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadFile(tt.path)
			if err == nil {
				t.Fatal("ReadFile succeeded")
			}
			var fe *FileError
			if !errors.As(err, &fe) || fe.Path != tt.path {
				t.Errorf("error %v does not name %s", err, tt.path)
			}
			if !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error = %v, want %v containing %q", err, tt.is, tt.msg)
			}
		})
	}
	// Run-level checks.
	if _, err := Open(t.TempDir()); !errors.Is(err, ErrNoManifest) {
		t.Errorf("Open(empty dir) = %v, want ErrNoManifest", err)
	}
	if err := os.Remove(goodFile); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(good); err == nil || !strings.Contains(err.Error(), "part-00000.parquet: listed in run.json but missing") {
		t.Errorf("Open(run with missing file) = %v", err)
	}
	m, err := ReadManifest(good)
	if err != nil {
		t.Fatal(err)
	}
	m.SchemaVersion = 7
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(good, ManifestName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(good); !errors.Is(err, ErrNewerSchema) || !strings.Contains(err.Error(), "run.json") {
		t.Errorf("Open(newer run.json) = %v", err)
	}
}

// newerSchemaFile is a trajectory file whose metadata claims version 99.
func newerSchemaFile(t *testing.T) []byte {
	var sb strings.Builder
	opts := parquetWriterOptions(10)
	opts = append(opts, parquet.KeyValueMetadata(MetadataSchemaVersionKey, "99"))
	w := parquet.NewGenericWriter[Record](&sb, opts...)
	r := fixtureRecords()[0]
	if _, err := w.Write([]Record{r}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return []byte(sb.String())
}

func corruptMiddle(data []byte) []byte {
	b := append([]byte(nil), data...)
	for i := 8; i < len(b)/2; i++ {
		b[i] ^= 0x5a
	}
	return b
}

const crashEnv = "ROLLOUT_TRAJECTORY_CRASH_CHILD_DIR"

// crashChild runs when the test binary is re-executed by TestCrashDuringWrite:
// it writes records forever, announcing each finished file, until killed.
func crashChild() bool {
	dir := os.Getenv(crashEnv)
	if dir == "" {
		return false
	}
	ctx := context.Background()
	w, err := NewWriter(ctx, dir, WriterOptions{RunID: "crash", MaxRowsPerFile: 6, RowGroupRows: 2, QueueSize: 1})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(3)
	}
	for i := 0; ; i++ {
		if err := w.Write(ctx, sizedRecord(9, i, 2048, 8)); err != nil {
			fmt.Println("error", err)
			os.Exit(3)
		}
		fmt.Println("wrote", i+1)
	}
}

func TestCrashDuringWrite(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "error") {
			t.Fatalf("child: %s", line)
		}
		// Kill after several rotations, while rows are in flight.
		if done, _ := partFiles(dir); len(done) >= 4 {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	go func() { // drain so the child never blocks on a full pipe
		for sc.Scan() {
		}
	}()
	_ = cmd.Wait()

	run, err := Open(dir)
	if err != nil {
		t.Fatalf("run unreadable after SIGKILL: %v", err)
	}
	if len(run.Files) < 3 {
		t.Fatalf("only %d files finished before the kill", len(run.Files))
	}
	for _, p := range run.Files {
		if strings.HasSuffix(p, ".tmp") {
			t.Errorf("temp file treated as part of the run: %s", p)
		}
	}
	recs, err := run.ReadAll(context.Background())
	if err != nil {
		t.Fatalf("reading finished files after SIGKILL: %v", err)
	}
	// Finished files hold 6 records each; the open part's journal adds
	// whatever was durable in it when the kill came (0 to 5 records).
	parts := len(run.Files) // Unlisted ones are among them
	if want := 6*parts + run.JournalRecords; len(recs) != want || run.JournalRecords >= 6 {
		t.Errorf("read %d records, want 6 in each of %d finished files plus %d from the journal", len(recs), parts, run.JournalRecords)
	}
	for i := range recs {
		if err := recs[i].Validate(); err != nil {
			t.Errorf("record %d: %v", i, err)
		}
		if want := sizedRecord(9, i, 2048, 8); !cmp.Equal(want.Tokens, recs[i].Tokens) {
			t.Errorf("record %d tokens differ from what was written", i)
		}
	}
	// run.json lags by at most one file and is valid JSON.
	if n := len(run.Manifest.Files); n < len(run.Files)-1 {
		t.Errorf("run.json lists %d of %d files", n, len(run.Files))
	}
	// Resuming cleans temp files and keeps every finished record.
	ctx := context.Background()
	w, err := NewWriter(ctx, dir, WriterOptions{RunID: "crash"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, ".*.tmp")); len(tmp) != 0 {
		t.Errorf("temp files after resume: %v", tmp)
	}
}

// run.json carries the sampler given at open, replaced by SetSampler at the
// next rewrite (here Close), and kept on resume.
func TestManifestSampler(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	w, err := NewWriter(ctx, dir, WriterOptions{RunID: "r", Sampler: json.RawMessage(`{"backend":"vllm","neutral":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	compact := func(raw json.RawMessage) string {
		var b bytes.Buffer
		if err := json.Compact(&b, raw); err != nil {
			t.Fatalf("sampler %s: %v", raw, err)
		}
		return b.String()
	}
	m, err := ReadManifest(dir)
	if err != nil || compact(m.Sampler) != `{"backend":"vllm","neutral":true}` {
		t.Fatalf("at open: %s %v", m.Sampler, err)
	}
	w.SetSampler(json.RawMessage(`{"backend":"vllm","server":{"top_k":-1}}`))
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	m, err = ReadManifest(dir)
	if err != nil || compact(m.Sampler) != `{"backend":"vllm","server":{"top_k":-1}}` {
		t.Fatalf("after SetSampler: %s %v", m.Sampler, err)
	}
	w, err = NewWriter(ctx, dir, WriterOptions{RunID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if m, _ = ReadManifest(dir); !strings.Contains(string(m.Sampler), `"server"`) {
		t.Fatalf("lost on resume: %s", m.Sampler)
	}
}
