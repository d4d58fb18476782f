package bench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/internal/devtools/bench/synth"
	"github.com/rollout-rl/rollout/internal/devtools/bench/trajbench"
	"github.com/rollout-rl/rollout/server"
	"github.com/rollout-rl/rollout/trajectory"
)

const (
	benchTokens    = 8192
	benchGroupSize = 8
)

// synthetic returns n records of benchTokens tokens in groups of
// benchGroupSize: agent-like trajectories (synth.Trajectory), each
// with a prompt of its own unless sharedPrompt.
func synthetic(n int, sharedPrompt bool) []trajectory.Record {
	recs := make([]trajectory.Record, n)
	for i := range recs {
		recs[i] = synth.Trajectory(11, i, synth.Options{Tokens: benchTokens, GroupSize: benchGroupSize, SharedPrompt: sharedPrompt})
	}
	return recs
}

func runOutput(ctx context.Context, r *runCtx) (out []Measure, err error) {
	tmp, err := os.MkdirTemp("", "rollout-bench-output-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	recs := synthetic(r.n(1000, 96), false)
	sections := []func(context.Context, *runCtx, string, []trajectory.Record) ([]Measure, error){
		sizeMeasures, writeMeasures, durableMeasures, serviceMeasures,
	}
	for _, section := range sections {
		ms, err := section(ctx, r, tmp, recs)
		out = append(out, ms...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// sizeMeasures: the Parquet files against the same records as Atropos
// JSONL gzip, with and without shared prompts.
func sizeMeasures(ctx context.Context, r *runCtx, tmp string, recs []trajectory.Record) (out []Measure, err error) {
	// Size: Parquet vs Atropos JSONL gzip for the same records, reported
	// per 1,000 trajectories.
	c, err := trajbench.CompareSize(ctx, tmp, recs)
	if err != nil {
		return nil, fmt.Errorf("size: %w", err)
	}
	per1k := func(b int64) float64 { return sig(float64(b) / float64(c.Rows) * 1000 / 1e6) }
	sizeNote := fmt.Sprintf("%d trajectories × %d tokens: Parquet %d B, Atropos JSONL %d B raw, %d B gzip", c.Rows, benchTokens,
		c.ParquetBytes, c.AtroposRawBytes, c.AtroposGzipBytes)
	sizeNote = joinNote(sizeNote, columnNote(c))
	if r.quick() {
		sizeNote = joinNote(sizeNote, "quick run: fewer trajectories, scaled to 1,000")
	}
	out = append(out,
		Measure{Name: "output.size_vs_atropos_jsonl_gz", Value: ptr(sig(c.Ratio)), Note: sizeNote},
		Measure{Name: "output.parquet_mb_per_1k", Value: ptr(per1k(c.ParquetBytes)), Baseline: ptr(per1k(c.AtroposGzipBytes)),
			BaselineName: "the same records as Atropos JSONL, gzip"},
	)
	// The same records with each group's rollouts sharing their prompt,
	// as a GRPO group's do.
	g, err := trajbench.CompareSize(ctx, tmp, synthetic(len(recs), true))
	if err != nil {
		return out, fmt.Errorf("size, shared prompts: %w", err)
	}
	out = append(out, Measure{Name: "output.size_vs_atropos_jsonl_gz_grpo", Value: ptr(sig(g.Ratio)),
		Note: fmt.Sprintf("%d trajectories: Parquet %d B, Atropos JSONL %d B gzip", g.Rows, g.ParquetBytes, g.AtroposGzipBytes)})
	return out, nil
}

// writeMeasures: write throughput against encoding the records as Atropos
// JSONL.
func writeMeasures(ctx context.Context, r *runCtx, tmp string, recs []trajectory.Record) (out []Measure, err error) {
	// Write throughput, side by side with encoding the same records as
	// Atropos JSONL (no compression, no disk): median of rounds.
	wrecs := recs[:min(len(recs), r.n(256, 64))]
	var pq, js []float64 // rows/s
	var pqMB, jsMB []float64
	var tokBytes int64
	for i := range wrecs {
		tokBytes += int64(len(wrecs[i].Tokens)) * trajbench.TokenBytesPerPosition
	}
	for range r.n(3, 1) {
		w, err := trajbench.MeasureWrite(ctx, tmp, wrecs, trajectory.WriterOptions{Logger: r.logger})
		if err != nil {
			return out, fmt.Errorf("write: %w", err)
		}
		pq, pqMB = append(pq, w.RowsPerSec), append(pqMB, w.TokenMBPerSec)
		t := time.Now()
		if _, err := trajectory.WriteAtropos(io.Discard, wrecs, trajectory.AtroposOptions{IncludeMessages: true}); err != nil {
			return out, fmt.Errorf("atropos encode: %w", err)
		}
		s := time.Since(t).Seconds()
		js, jsMB = append(js, float64(len(wrecs))/s), append(jsMB, float64(tokBytes)/1e6/s)
	}
	base := "encoding the same records as Atropos JSONL (no gzip, no disk), same run"
	out = append(out,
		Measure{Name: "output.parquet_write_mb_s", Value: ptr(sig(median(pqMB))), Baseline: ptr(sig(median(jsMB))), BaselineName: base,
			Note: fmt.Sprintf("%d rows of %d tokens, default writer settings, until files are fsynced and renamed", len(wrecs), benchTokens)},
		Measure{Name: "output.parquet_write_rows_per_s", Value: ptr(sig(median(pq))), Baseline: ptr(sig(median(js))), BaselineName: base},
	)
	return out, nil
}

// durableMeasures: durable group writes against the same writes without
// the journal.
func durableMeasures(ctx context.Context, r *runCtx, tmp string, recs []trajectory.Record) (out []Measure, err error) {
	// Durability: groups/s with the journal (every WriteGroup waits for its
	// fsync) against the same writes without it, alternating rounds in the
	// same run, from 8 concurrent writers as the runner's group goroutines.
	dgroups := groupRecords(recs[:min(len(recs), r.n(512, 96))])
	var on, off []float64
	var extra, parquetBytes int64
	for range r.n(3, 1) {
		d, err := trajbench.MeasureGroupWrite(ctx, tmp, dgroups, 8, trajectory.WriterOptions{Logger: r.logger})
		if err != nil {
			return out, fmt.Errorf("durable write: %w", err)
		}
		nd, err := trajbench.MeasureGroupWrite(ctx, tmp, dgroups, 8, trajectory.WriterOptions{Logger: r.logger, NoJournal: true})
		if err != nil {
			return out, fmt.Errorf("write without journal: %w", err)
		}
		on, off = append(on, d.GroupsPerSec), append(off, nd.GroupsPerSec)
		extra, parquetBytes = d.JournalBytes, d.FileBytes
	}
	dnote := fmt.Sprintf("%d groups of %d × %d tokens, 8 concurrent writers, median of %d alternating rounds; journal %d B on top of %d B of Parquet",
		len(dgroups), benchGroupSize, benchTokens, len(on), extra, parquetBytes)
	out = append(out,
		Measure{Name: "output.durable_groups_per_s", Value: ptr(sig(median(on))), Baseline: ptr(sig(median(off))),
			BaselineName: "the same writes without the journal (durability off), same run", Note: dnote},
		Measure{Name: "output.durable_throughput_ratio", Value: ptr(sig(median(on) / median(off)))},
		Measure{Name: "output.durable_extra_bytes_ratio", Value: ptr(sig(float64(extra) / float64(max(parquetBytes, 1))))},
	)
	return out, nil
}

// serviceMeasures: the service's Group message, its size against Atropos
// JSON and its streaming rate.
func serviceMeasures(ctx context.Context, r *runCtx, _ string, recs []trajectory.Record) (out []Measure, err error) {
	// The service's Group message: size vs Atropos JSON, and streaming.
	// The trainers in this repository ask for the compact token layout
	// (docs/api.md, "Token layout"); the full layout's size is in the note.
	groups := groupRecords(recs)
	var pbBytes, fullBytes, jsonBytes int64
	for _, g := range groups {
		m, err := groupMessage(g)
		if err != nil {
			return out, err
		}
		fullBytes += int64(proto.Size(m))
		pbBytes += int64(proto.Size(server.CompactGroup(m)))
		var buf bytes.Buffer
		if err := trajbench.WritePythonAtropos(&buf, g); err != nil {
			return out, fmt.Errorf("atropos json: %w", err)
		}
		jsonBytes += int64(buf.Len())
	}
	out = append(out, Measure{Name: "service.size_vs_atropos_json", Value: ptr(sig(float64(pbBytes) / float64(jsonBytes))),
		Note: fmt.Sprintf("%d groups of %d × %d tokens: Group %d B/group in the compact token layout (full layout %d B, %.3g×), Atropos ScoredDataGroup JSON (Python json.dumps) %d B/group",
			len(groups), benchGroupSize, benchTokens, pbBytes/int64(len(groups)), fullBytes/int64(len(groups)),
			float64(fullBytes)/float64(jsonBytes), jsonBytes/int64(len(groups)))})

	n := r.n(600, 100)
	rate, err := streamGroups(ctx, groups, n)
	if err != nil {
		return out, fmt.Errorf("stream: %w", err)
	}
	out = append(out, Measure{Name: "service.groups_per_s", Value: ptr(sig(rate)),
		Note: fmt.Sprintf("%d groups over loopback TCP in the compact token layout; the generated RolloutService stubs and grpc-go, conversion from records per group as server/convert.go does, the client expanding every group to the full layout (server.ExpandGroup); the runner and job machinery are not in the loop", n)})
	return out, nil
}

// columnNote says where the Parquet bytes go: bytes per token position of
// the largest columns, the rest together.
func columnNote(c trajbench.SizeComparison) string {
	positions := float64(c.Rows) * c.TokensPerRow
	if positions <= 0 || len(c.ColumnBytes) == 0 {
		return ""
	}
	names := make([]string, 0, len(c.ColumnBytes))
	for n := range c.ColumnBytes {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(c.ColumnBytes[b], c.ColumnBytes[a]) })
	var parts []string
	var rest int64
	for i, n := range names {
		if i < 4 {
			parts = append(parts, fmt.Sprintf("%s %.2f", n, float64(c.ColumnBytes[n])/positions))
		} else {
			rest += c.ColumnBytes[n]
		}
	}
	parts = append(parts, fmt.Sprintf("the other %d columns and the footer %.2f", len(names)-min(len(names), 4),
		float64(c.ParquetBytes-sumBytes(c.ColumnBytes)+rest)/positions))
	return "bytes per token position: " + strings.Join(parts, ", ")
}

func sumBytes(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// groupRecords splits records into their groups, in order.
func groupRecords(recs []trajectory.Record) [][]trajectory.Record {
	var out [][]trajectory.Record
	idx := map[string]int{}
	for _, r := range recs {
		i, ok := idx[r.GroupID]
		if !ok {
			i = len(out)
			idx[r.GroupID] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], r)
	}
	return out
}

// groupMessage builds the service's Group message from a group's records,
// field for field as server/convert.go builds it from the same record
// conversion (job.Record).
func groupMessage(g []trajectory.Record) (*rolloutv1.Group, error) {
	if len(g) == 0 {
		return nil, errors.New("empty group")
	}
	out := &rolloutv1.Group{GroupId: g[0].GroupID, ItemId: g[0].ItemID, Env: g[0].Env, Category: g[0].Category,
		PolicyVersion: g[0].PolicyVersion, Rollouts: make([]*rolloutv1.Rollout, len(g))}
	var sum float64
	for _, rec := range g {
		sum += rec.Reward
	}
	out.Mean = sum / float64(len(g))
	for i := range g {
		rec := &g[i]
		out.Rollouts[i] = server.RolloutProto(rec, fmt.Sprintf("%s-%d", rec.GroupID, rec.RolloutIndex), 1)
	}
	return out, nil
}

// streamServer answers CollectGroups with n groups built from the given
// record groups (cycled), within the credits of the start message.
type streamServer struct {
	rolloutv1.UnimplementedRolloutServiceServer
	groups [][]trajectory.Record
}

func (s *streamServer) CollectGroups(stream rolloutv1.RolloutService_CollectGroupsServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	n := int(first.GetStart().GetInitialCredits())
	compact := first.GetStart().GetTokenLayout() == rolloutv1.TokenLayout_TOKEN_LAYOUT_COMPACT
	for i := range n {
		g, err := groupMessage(s.groups[i%len(s.groups)])
		if err != nil {
			return err
		}
		if compact {
			g = server.CompactGroup(g)
		}
		g.GroupId = fmt.Sprintf("%s-%d", g.GroupId, i)
		if err := stream.Send(&rolloutv1.CollectGroupsResponse{Msg: &rolloutv1.CollectGroupsResponse_Group{Group: g}}); err != nil {
			return err
		}
	}
	// Wait for the client to close its side.
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// streamGroups serves a gRPC RolloutService on loopback TCP and times a
// client receiving n groups from CollectGroups; it returns groups/s.
func streamGroups(ctx context.Context, groups [][]trajectory.Record, n int) (float64, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	gs := grpc.NewServer()
	rolloutv1.RegisterRolloutServiceServer(gs, &streamServer{groups: groups})
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(lis) })
	defer func() {
		gs.Stop()
		wg.Wait()
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	cli := rolloutv1.NewRolloutServiceClient(conn)

	// One short warm-up stream (connection, HTTP/2 windows, code paths).
	if _, err := collect(ctx, cli, min(n, 8)); err != nil {
		return 0, err
	}
	el, err := collect(ctx, cli, n)
	if err != nil {
		return 0, err
	}
	return float64(n) / el.Seconds(), nil
}

// collect opens CollectGroups with n credits and receives n groups.
func collect(ctx context.Context, cli rolloutv1.RolloutServiceClient, n int) (time.Duration, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	st, err := cli.CollectGroups(sctx)
	if err != nil {
		return 0, err
	}
	if err := st.Send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Start{
		Start: &rolloutv1.CollectStart{InitialCredits: int32(n), TokenLayout: rolloutv1.TokenLayout_TOKEN_LAYOUT_COMPACT}}}); err != nil {
		return 0, err
	}
	for got := 0; got < n; {
		m, err := st.Recv()
		if err != nil {
			return 0, fmt.Errorf("after %d groups: %w", got, err)
		}
		if g := m.GetGroup(); g != nil {
			if err := server.ExpandGroup(g); err != nil {
				return 0, err
			}
			if len(g.Rollouts) != benchGroupSize || len(g.Rollouts[0].Tokens) != benchTokens || len(g.Rollouts[0].LossMask) != benchTokens {
				return 0, fmt.Errorf("group %s: %d rollouts", g.GroupId, len(g.Rollouts))
			}
			got++
		}
	}
	el := time.Since(start)
	if err := st.CloseSend(); err != nil {
		return el, err
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return el, fmt.Errorf("end of stream: %v", err)
	}
	return el, nil
}
