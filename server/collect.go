package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rollout-rl/rollout/datasets"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/internal/job"
	"github.com/rollout-rl/rollout/runner"
)

// pending is an item waiting for a credit.
type pending struct {
	item datasets.Item
	opts runner.GroupOptions
}

// collector is the state of one CollectGroups stream.
type collector struct {
	s      *Server
	j      *job.Job
	stream rolloutv1.RolloutService_CollectGroupsServer
	ctx    context.Context

	sendMu sync.Mutex
	wg     sync.WaitGroup

	mu        sync.Mutex
	credits   int
	inFlight  int
	queue     []pending
	sent      int
	started   int
	dataset   []datasets.Item
	cursor    int
	loaded    bool
	exhausted bool
	failed    error
}

// CollectGroups implements RolloutServiceServer.
func (s *Server) CollectGroups(stream rolloutv1.RolloutService_CollectGroupsServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "start: the first message of CollectGroups must be start")
	}
	if start.InitialCredits < 0 {
		return status.Error(codes.InvalidArgument, "start.initial_credits: must not be negative")
	}
	cfg, err := runner.ParseConfig([]byte(start.ConfigYaml))
	if err != nil {
		return toStatus(fmt.Errorf("start.config_yaml: %w", err))
	}
	if cfg.Output.Dir != "" {
		if cfg.Output.Dir, err = s.resolvePath("start.config_yaml: output.dir", cfg.Output.Dir); err != nil {
			return err
		}
	}
	if cfg.Dataset.Path != "" {
		if cfg.Dataset.Path, err = s.resolvePath("start.config_yaml: dataset.path", cfg.Dataset.Path); err != nil {
			return err
		}
	}
	j, err := job.Open(ctx, cfg, job.Options{Mode: job.ModeCollect, Logger: s.log.With("stream", "collect"), Sandboxes: s.sandboxes, Images: s.images})
	if err != nil {
		return toStatus(fmt.Errorf("start.config_yaml: %w", err))
	}
	c := &collector{s: s, j: j, stream: stream, ctx: ctx, credits: int(start.InitialCredits)}
	err = c.loop()
	c.wg.Wait()
	if cerr := j.Close(context.WithoutCancel(ctx)); cerr != nil && err == nil {
		err = toStatus(cerr)
	}
	if err == nil {
		c.mu.Lock()
		err = c.failed
		c.mu.Unlock()
	}
	return err
}

func (c *collector) loop() error {
	if err := c.status(); err != nil {
		return err
	}
	for {
		msg, err := c.stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil // the trainer is done asking: in-flight groups still arrive
		}
		if err != nil {
			return err
		}
		switch m := msg.Msg.(type) {
		case *rolloutv1.CollectGroupsRequest_Credit:
			if m.Credit.Groups <= 0 {
				return status.Error(codes.InvalidArgument, "credit.groups: must be positive")
			}
			c.mu.Lock()
			c.credits += int(m.Credit.Groups)
			c.mu.Unlock()
		case *rolloutv1.CollectGroupsRequest_Items:
			if err := c.enqueueItems(m.Items); err != nil {
				return err
			}
		case *rolloutv1.CollectGroupsRequest_Next:
			if err := c.enqueueNext(m.Next); err != nil {
				return err
			}
		case *rolloutv1.CollectGroupsRequest_Start:
			return status.Error(codes.InvalidArgument, "start: only the first message may be start")
		default:
			return status.Error(codes.InvalidArgument, "msg: empty message")
		}
		c.pump()
		if err := c.status(); err != nil {
			return err
		}
	}
}

func (c *collector) groupOptions(reqID string, policy *int64, samplingJSON string, field string) (runner.GroupOptions, error) {
	o := runner.GroupOptions{PolicyVersion: policy, RequestID: reqID}
	if strings.TrimSpace(samplingJSON) != "" {
		smp := c.j.Runner.Config().Sampling
		dec := json.NewDecoder(strings.NewReader(samplingJSON))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&smp); err != nil {
			return o, status.Errorf(codes.InvalidArgument, "%s.sampling_json: %v", field, err)
		}
		o.Sampling = &smp
	}
	return o, nil
}

func (c *collector) enqueueItems(m *rolloutv1.CollectItems) error {
	if len(m.ItemsJson) == 0 {
		return status.Error(codes.InvalidArgument, "items.items_json: at least one item is required")
	}
	o, err := c.groupOptions(m.RequestId, m.PolicyVersion, m.SamplingJson, "items")
	if err != nil {
		return err
	}
	name := "request " + m.RequestId
	rows, err := datasets.ReadJSONL(strings.NewReader(strings.Join(m.ItemsJson, "\n")), name)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "items.items_json: %v", err)
	}
	dcfg := c.j.Runner.Config().Dataset
	rows, err = datasets.Prepare(rows, datasets.Config{Fields: dcfg.Fields, IDField: dcfg.IDField, Format: dcfg.Format})
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "items.items_json: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, it := range rows {
		if m.RequestId != "" {
			it.ID = m.RequestId + "/" + it.ID
		}
		c.queue = append(c.queue, pending{item: it, opts: o})
	}
	return nil
}

func (c *collector) enqueueNext(m *rolloutv1.CollectNext) error {
	if m.Count <= 0 {
		return status.Error(codes.InvalidArgument, "next.count: must be positive")
	}
	o, err := c.groupOptions(m.RequestId, m.PolicyVersion, m.SamplingJson, "next")
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.loaded {
		items, err := c.j.Runner.Items(c.ctx)
		if err != nil {
			return toStatus(err)
		}
		c.dataset, c.loaded = items, true
	}
	for range m.Count {
		if c.cursor >= len(c.dataset) {
			c.exhausted = true
			break
		}
		c.queue = append(c.queue, pending{item: c.dataset[c.cursor], opts: o})
		c.cursor++
	}
	return nil
}

// pump starts queued groups while credits last.
func (c *collector) pump() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.credits > 0 && len(c.queue) > 0 && c.ctx.Err() == nil {
		p := c.queue[0]
		c.queue = c.queue[1:]
		c.credits--
		c.inFlight++
		idx := c.started
		c.started++
		c.wg.Go(func() { c.run(idx, p) })
	}
}

func (c *collector) run(idx int, p pending) {
	g := c.j.Runner.RunGroup(c.ctx, idx, p.item, p.opts)
	err := c.j.Deliver(context.WithoutCancel(c.ctx), g)
	var pg *rolloutv1.Group
	if err == nil {
		pg, err = groupProto(c.j.Runner.Info(), g)
	}
	c.mu.Lock()
	c.inFlight--
	if err != nil && c.failed == nil {
		c.failed = toStatus(fmt.Errorf("group %s: %w", g.ID, err))
	}
	c.mu.Unlock()
	if err != nil {
		return
	}
	c.sendMu.Lock()
	serr := c.stream.Send(&rolloutv1.CollectGroupsResponse{Msg: &rolloutv1.CollectGroupsResponse_Group{Group: pg}})
	c.sendMu.Unlock()
	c.mu.Lock()
	if serr == nil {
		c.sent++
	}
	c.mu.Unlock()
	_ = c.status()
}

func (c *collector) status() error {
	c.mu.Lock()
	st := &rolloutv1.CollectStatus{Credits: int32(c.credits), InFlight: int32(c.inFlight), Queued: int32(len(c.queue)),
		Sent: int32(c.sent), Exhausted: c.exhausted}
	c.mu.Unlock()
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return c.stream.Send(&rolloutv1.CollectGroupsResponse{Msg: &rolloutv1.CollectGroupsResponse_Status{Status: st}})
}
