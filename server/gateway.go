package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/assemble"
	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/capture"
	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/rewards"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

// DefaultIdleTimeout is a standalone gateway session's idle expiry when
// GatewayOptions leaves it unset.
const DefaultIdleTimeout = 30 * time.Minute

// SessionAPIKey is the key a session's harness is given: its base URL
// (the 160-bit session id) is the credential, SDKs just want a key.
const SessionAPIKey = "rollout-session"

// GatewayOptions configure a GatewayServer.
type GatewayOptions struct {
	Logger *slog.Logger
	// BaseURL is where harnesses reach the gateway's HTTP front doors
	// (http://host:port, no trailing slash): sessions' base URLs are
	// BaseURL/s/<session>(/v1).
	BaseURL string
	// IdleTimeout closes a session idle this long (no call, none in
	// flight) and records it as expired: 0 means DefaultIdleTimeout,
	// negative never.
	IdleTimeout time.Duration
	// MaxSessions bounds open sessions (capture's default when 0); over
	// it OpenSession is RESOURCE_EXHAUSTED.
	MaxSessions int
	// Tenants are the callers the transport authenticates besides the
	// --auth-token-file token ("default"): each tenant's sessions and
	// groups are its own (the others can neither see nor touch them) and
	// its watchers get its groups only.
	Tenants []Tenant
}

// Session states of a GatewayServer.
const (
	sessOpen    = "open"
	sessClosing = "closing"
	sessClosed  = "closed"  // closed by its caller, waiting for its score
	sessExpired = "expired" // closed for it: recorded failed, no score
	sessFailed  = "failed"  // its record could not be finished
	sessScored  = "scored"
)

// GatewayServer implements rolloutv1.GatewayServiceServer over a
// standalone gateway (assemble.Standalone): sessions in groups of G, the
// caller's rewards, advantages as for the runner's groups, each finished
// group written to the run directory and queued for WatchSessionGroups.
type GatewayServer struct {
	rolloutv1.UnimplementedGatewayServiceServer
	st   *assemble.Standalone
	opts GatewayOptions
	log  *slog.Logger

	mu       sync.Mutex
	groups   map[string]*gwGroup
	sessions map[string]*gwSession
	// done keeps what became of sessions whose groups are finished (their
	// final state), so a late call is told, not NOT_FOUND.
	done map[string]doneSession
	// finished holds the ids of the groups written, with their tenants.
	finished map[string]string
	// queue holds, by tenant, the finished groups no watcher took yet.
	queue  map[string][]*rolloutv1.Group
	notify chan struct{} // closed and replaced when queue grows or at shutdown
	// followers are the watchers with from_sequence: each gets every
	// finished group of its tenant.
	followers map[*gwFollower]bool
	// live counts each tenant's sessions open or closing (Quotas.Sessions).
	live     map[string]int
	stopping bool
	final    bool           // Shutdown collected the last groups: no more writes
	drained  bool           // and they are written: watchers end once the queue is empty
	writes   sync.WaitGroup // groups being written
}

// doneSession is what a session of a finished group left for late calls.
type doneSession struct{ state, tenant string }

type gwGroup struct {
	id       string
	tenant   string // the tenant that opened it (tenantOf)
	item     datasets.Item
	category string
	meta     map[string]string
	size     int
	sessions []*gwSession
	finished bool
}

type gwSession struct {
	id     string
	cs     *capture.Session
	group  *gwGroup
	index  int
	state  string
	reason string
	opened time.Time
	ro     runner.Rollout
	sum    *rolloutv1.SessionSummary
	// settled is closed once finishSession recorded how it ended.
	settled chan struct{}
}

var _ rolloutv1.GatewayServiceServer = (*GatewayServer)(nil)

// NewGatewayServer assembles a standalone gateway from cfg
// (assemble.OpenStandalone: output.dir required, the env ignored) and
// serves its session control. Close it with Shutdown.
func NewGatewayServer(ctx context.Context, cfg runner.Config, opts GatewayOptions) (*GatewayServer, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	switch {
	case opts.IdleTimeout == 0:
		opts.IdleTimeout = DefaultIdleTimeout
	case opts.IdleTimeout < 0:
		opts.IdleTimeout = 0
	}
	opts.BaseURL = strings.TrimRight(opts.BaseURL, "/")
	s := &GatewayServer{opts: opts, log: opts.Logger, groups: map[string]*gwGroup{}, sessions: map[string]*gwSession{},
		done: map[string]doneSession{}, finished: map[string]string{}, queue: map[string][]*rolloutv1.Group{},
		notify: make(chan struct{}), followers: map[*gwFollower]bool{}, live: map[string]int{}}
	st, err := assemble.OpenStandalone(ctx, cfg, assemble.StandaloneOptions{Logger: opts.Logger, IdleTimeout: opts.IdleTimeout,
		MaxSessions: opts.MaxSessions, OnExpire: s.expired})
	if err != nil {
		return nil, err
	}
	s.st = st
	return s, nil
}

// Gateway is the capture gateway whose front doors (capture.Handler)
// harnesses call.
func (s *GatewayServer) Gateway() *capture.Gateway { return s.st.Gateway }

// Dir is the run directory the groups are written to.
func (s *GatewayServer) Dir() string { return s.st.Dir() }

// Register adds the service to a gRPC server.
func (s *GatewayServer) Register(g *grpc.Server) { rolloutv1.RegisterGatewayServiceServer(g, s) }

// OpenSession implements rolloutv1.GatewayServiceServer.
func (s *GatewayServer) OpenSession(ctx context.Context, req *rolloutv1.OpenSessionRequest) (*rolloutv1.OpenSessionResponse, error) {
	gid := req.GetGroupId()
	if gid != "" && !validID(gid) {
		return nil, status.Errorf(codes.InvalidArgument, "group_id: %q is not 1-64 characters of [A-Za-z0-9_-]", gid)
	}
	if req.GetGroupSize() < 0 || req.GetGroupSize() > runner.MaxGroupSize {
		return nil, status.Errorf(codes.InvalidArgument, "group_size: %d, want 0 (the config's) to %d", req.GetGroupSize(), runner.MaxGroupSize)
	}
	tenant := tenantOf(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return nil, status.Error(codes.Unavailable, "the gateway is shutting down")
	}
	g := s.groups[gid]
	fin, written := s.finished[gid]
	switch {
	case g != nil && g.tenant != tenant, g == nil && written && fin != tenant:
		return nil, status.Errorf(codes.PermissionDenied, "group id %s is another tenant's; choose another", gid)
	case g == nil && written:
		return nil, status.Errorf(codes.FailedPrecondition, "group %s is finished (written); open a new group", gid)
	case g == nil:
		if gid == "" {
			gid = "g_" + randomID()
		}
		size := int(req.GetGroupSize())
		if size == 0 {
			size = s.st.Config().GroupSize
		}
		item := req.GetItemId()
		if item == "" {
			item = gid
		}
		meta := maps.Clone(req.GetMetadata())
		g = &gwGroup{id: gid, tenant: tenant, size: size, meta: meta, category: meta["category"],
			item: datasets.Item{ID: item, Data: map[string]any{}, Source: "rollout gateway"}}
		for k, v := range meta {
			g.item.Data[k] = v
		}
	case g.finished:
		return nil, status.Errorf(codes.FailedPrecondition, "group %s is finished (written); open a new group", gid)
	case len(g.sessions) >= g.size:
		return nil, status.Errorf(codes.FailedPrecondition, "group %s already has its %d sessions", gid, g.size)
	}
	switch {
	case req.GetItemId() != "" && req.GetItemId() != g.item.ID:
		return nil, status.Errorf(codes.InvalidArgument, "item_id: %q, but group %s is item %q", req.GetItemId(), gid, g.item.ID)
	case req.GetGroupSize() != 0 && int(req.GetGroupSize()) != g.size:
		return nil, status.Errorf(codes.InvalidArgument, "group_size: %d, but group %s has %d", req.GetGroupSize(), gid, g.size)
	}
	if q := s.sessionQuota(tenant); q > 0 && s.live[tenant] >= q {
		metricTenantRejected.WithLabelValues(tenantLabel(tenant), "sessions").Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "tenant %s is at its quota of %d open sessions (quotas.sessions); close one first", tenant, q)
	}
	rid := "ro_" + randomID()
	cs, err := s.st.Gateway.Open(ctx, inference.EpisodeSpec{ID: rid, Group: gid, Model: s.st.Config().Inference.Model})
	if err != nil {
		return nil, gatewayStatus(err)
	}
	ss := &gwSession{id: cs.ID(), cs: cs, group: g, index: len(g.sessions), state: sessOpen, opened: time.Now(), settled: make(chan struct{})}
	ss.ro = runner.Rollout{ID: rid, Index: ss.index, Attempts: 1, Created: ss.opened.UTC()}
	g.sessions = append(g.sessions, ss)
	s.groups[gid] = g
	s.sessions[ss.id] = ss
	s.live[tenant]++
	metricGatewaySessions.Inc()
	base := s.opts.BaseURL + "/s/" + ss.id
	return &rolloutv1.OpenSessionResponse{SessionId: ss.id, GroupId: gid, Index: int32(ss.index),
		OpenaiBaseUrl: base + "/v1", AnthropicBaseUrl: base, ApiKey: SessionAPIKey,
		ExpiresAfterIdleSeconds: s.opts.IdleTimeout.Seconds()}, nil
}

// sessionQuota is tenant's Quotas.Sessions (0: none of its own).
func (s *GatewayServer) sessionQuota(tenant string) int {
	for _, t := range s.opts.Tenants {
		if t.Name == tenant {
			return t.Quotas.Sessions
		}
	}
	return 0
}

// session finds a session of the caller's tenant by id for an RPC;
// another tenant's is not found. s.mu is held.
func (s *GatewayServer) session(ctx context.Context, id string) (*gwSession, error) {
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "session_id: required")
	}
	tenant := tenantOf(ctx)
	if ss, ok := s.sessions[id]; ok && ss.group.tenant == tenant {
		return ss, nil
	}
	if d, ok := s.done[id]; ok && d.tenant == tenant {
		return nil, status.Errorf(codes.FailedPrecondition, "the session is %s and its group finished (written)", d.state)
	}
	return nil, status.Error(codes.NotFound, "no session with this id")
}

// CloseSession implements rolloutv1.GatewayServiceServer.
func (s *GatewayServer) CloseSession(ctx context.Context, req *rolloutv1.CloseSessionRequest) (*rolloutv1.CloseSessionResponse, error) {
	s.mu.Lock()
	ss, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if ss.state != sessOpen {
		st, why := ss.state, ss.reason
		s.mu.Unlock()
		if why != "" {
			st += ": " + why
		}
		return nil, status.Errorf(codes.FailedPrecondition, "the session is %s", st)
	}
	ss.state = sessClosing
	s.mu.Unlock()

	rec, cerr := ss.cs.Close(ctx)
	if cerr != nil && errors.Is(gateway.KindOf(cerr), gateway.ErrSession) {
		// The idle expiry won the race; expired() records it.
		return nil, status.Errorf(codes.FailedPrecondition, "the session %s", strings.TrimPrefix(cerr.Error(), "session: "))
	}
	if cerr != nil && ctx.Err() != nil {
		// The caller gave up while calls were in flight: the session is
		// closed all the same; record it without a reward.
		s.finishSession(ss, rec, sessExpired, fmt.Sprintf("CloseSession was cancelled while its calls were in flight: %v", cerr))
		return nil, toStatus(cerr)
	}
	state, reason := sessClosed, ""
	if cerr != nil {
		state, reason = sessFailed, fmt.Sprintf("finish the session's branches: %v", cerr)
	}
	sum := s.finishSession(ss, rec, state, reason)
	return &rolloutv1.CloseSessionResponse{Summary: sum}, nil
}

// expired is capture's OnExpire: the idle expiry closed a session.
func (s *GatewayServer) expired(cs *capture.Session, rec gateway.SessionRecord, err error) {
	s.mu.Lock()
	ss := s.sessions[cs.ID()]
	if ss == nil || ss.state != sessOpen && ss.state != sessClosing {
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	reason := fmt.Sprintf("idle for %s with no call (the gateway's idle expiry); no reward was posted", s.opts.IdleTimeout)
	if err != nil {
		reason += fmt.Sprintf("; finishing its branches failed: %v", err)
	}
	s.finishSession(ss, rec, sessExpired, reason)
}

// finishSession records how a session ended: its rollout (failed unless
// it was closed by its caller, then it waits for a score), its summary;
// a session that needs no score may finish its group.
func (s *GatewayServer) finishSession(ss *gwSession, rec gateway.SessionRecord, state, reason string) *rolloutv1.SessionSummary {
	ro := &ss.ro
	ro.Session = &rec
	ro.Result = runner.SessionResult(rec)
	ro.Result.StopReason = runner.StopSessionClosed
	if state != sessClosed {
		ro.Result.StopReason = runner.StopSessionExpired
	}
	ro.Result.FinishedNaturally = state == sessClosed
	for _, c := range rec.Calls {
		ro.Timings.Generation += c.Duration
	}
	ro.Timings.Total = time.Since(ss.opened)
	switch state {
	case sessExpired:
		ro.Status, ro.Failure = runner.StatusInfraFailed, &runner.Failure{Kind: runner.FailExpired, Message: reason}
	case sessFailed:
		ro.Status, ro.Failure = runner.StatusInfraFailed, &runner.Failure{Kind: runner.FailInference, Message: reason}
	}
	detail := fmt.Sprintf("%s after %s: %d calls, %d branches", state, ro.Timings.Total.Round(time.Millisecond), len(rec.Calls), len(rec.Branches))
	if reason != "" {
		detail += "; " + reason
	}
	ro.Result.Events = []agentloop.Event{{Kind: "gateway_session", Detail: detail}, {Kind: eventTenant, Detail: ss.group.tenant}}
	if len(ss.group.meta) > 0 {
		if b, err := json.Marshal(ss.group.meta); err == nil {
			ro.Result.Events = append(ro.Result.Events, agentloop.Event{Kind: "gateway_metadata", Detail: string(b)})
		}
	}
	sum := summary(ss, rec, state, reason)
	s.mu.Lock()
	if ss.state == sessOpen || ss.state == sessClosing {
		s.live[ss.group.tenant]--
	}
	ss.state, ss.reason, ss.sum = state, reason, sum
	g := s.finishable(ss.group)
	s.mu.Unlock()
	close(ss.settled)
	if state != sessClosed {
		s.log.Warn("gateway session recorded without a reward", "group", ss.group.id, "index", ss.index, "state", state, "reason", reason)
		metricGatewayUnscored.WithLabelValues(state).Inc()
	}
	if g != nil {
		if err := s.writeGroup(context.Background(), g); err != nil {
			s.log.Error("write a finished gateway group", "group", g.id, "error", err)
		}
	}
	return sum
}

// summary is a closed session's SessionSummary.
func summary(ss *gwSession, rec gateway.SessionRecord, state, reason string) *rolloutv1.SessionSummary {
	out := &rolloutv1.SessionSummary{SessionId: ss.id, GroupId: ss.group.id, Index: int32(ss.index), Status: state, Reason: reason,
		Calls: int32(len(rec.Calls)), Rewritten: int32(rec.Rewritten), Unanchored: int32(rec.Unanchored)}
	if state == sessScored || state == sessClosed {
		out.Status = sessClosed
	}
	for _, c := range rec.Calls {
		if c.Status == gateway.CallError {
			out.FailedCalls++
		} else {
			out.AnsweredCalls++
		}
		out.PromptTokens += int64(c.PromptTokens)
		out.CompletionTokens += int64(c.CompletionTokens)
	}
	for _, b := range rec.Branches {
		trained := 0
		for _, m := range b.Sequence.Mask {
			trained += int(m)
		}
		out.DriftTokens += int32(b.Sequence.DriftTokens)
		out.Branches = append(out.Branches, &rolloutv1.BranchSummary{Index: int32(b.Index), Parent: int32(b.Parent), SplitCall: int32(b.SplitCall),
			SharedTokens: int32(b.Shared), Tokens: int32(len(b.Sequence.Tokens)), TrainedTokens: int32(trained), Calls: int32(len(b.Calls))})
	}
	return out
}

// ScoreSession implements rolloutv1.GatewayServiceServer.
func (s *GatewayServer) ScoreSession(ctx context.Context, req *rolloutv1.ScoreSessionRequest) (*rolloutv1.ScoreSessionResponse, error) {
	if r := req.GetReward(); math.IsNaN(r) || math.IsInf(r, 0) {
		return nil, status.Errorf(codes.InvalidArgument, "reward: %v is not a finite number", r)
	}
	for k, v := range req.GetMetrics() {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, status.Errorf(codes.InvalidArgument, "metrics[%q]: %v is not a finite number", k, v)
		}
	}
	s.mu.Lock()
	ss, err := s.session(ctx, req.GetSessionId())
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	switch ss.state {
	case sessClosed:
	case sessOpen, sessClosing:
		s.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "the session is open: close it (CloseSession) before scoring it")
	case sessScored:
		s.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "the session is already scored")
	default:
		st := ss.state + ": " + ss.reason
		s.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "the session is %s (recorded without a reward)", st)
	}
	branches := len(ss.ro.Session.Branches)
	var br map[int]float64
	for b, r := range req.GetBranchRewards() {
		if b < 0 || int(b) >= branches {
			s.mu.Unlock()
			return nil, status.Errorf(codes.InvalidArgument, "branch_rewards: branch %d, but the session has %d branches", b, branches)
		}
		if math.IsNaN(r) || math.IsInf(r, 0) {
			s.mu.Unlock()
			return nil, status.Errorf(codes.InvalidArgument, "branch_rewards[%d]: %v is not a finite number", b, r)
		}
		if br == nil {
			br = map[int]float64{}
		}
		br[int(b)] = r
	}
	ss.state = sessScored
	ss.ro.Status = runner.StatusOK
	ss.ro.Score = rewards.Score{Value: req.GetReward(), Components: maps.Clone(req.GetMetrics())}
	ss.ro.BranchRewards = br
	g := s.finishable(ss.group)
	pending := s.pending(ss.group)
	s.mu.Unlock()
	resp := &rolloutv1.ScoreSessionResponse{GroupId: ss.group.id, Pending: int32(pending)}
	if g != nil {
		if err := s.writeGroup(ctx, g); err != nil {
			return nil, status.Errorf(codes.Internal, "the score is recorded, but writing its finished group failed: %v", err)
		}
	}
	return resp, nil
}

// pending counts a group's sessions still to be opened, closed or scored.
// s.mu is held.
func (s *GatewayServer) pending(g *gwGroup) int {
	n := g.size - len(g.sessions)
	for _, ss := range g.sessions {
		if ss.state == sessOpen || ss.state == sessClosing || ss.state == sessClosed {
			n++
		}
	}
	return n
}

// finishable marks g finished and returns it when none of its sessions is
// pending, nil otherwise. s.mu is held.
func (s *GatewayServer) finishable(g *gwGroup) *gwGroup {
	if g.finished || s.final || s.pending(g) > 0 {
		return nil
	}
	g.finished = true
	s.writes.Add(1)
	return g
}

// writeGroup assembles a finished group (advantages as the runner's),
// writes it to the run directory and queues it for the watchers. It
// forgets the group's sessions but their final states.
func (s *GatewayServer) writeGroup(ctx context.Context, gg *gwGroup) error {
	defer s.writes.Done()
	g := &runner.Group{ID: gg.id, Item: gg.item, Sequence: -1, Rollouts: make([]runner.Rollout, len(gg.sessions))}
	g.Task.Category = gg.category
	for i, ss := range gg.sessions {
		g.Rollouts[i] = ss.ro
	}
	if d := s.st.Distiller(); d != nil {
		s.distill(ctx, d, g)
	}
	runner.AssembleGroup(g, s.st.Config().Advantage)
	err := s.st.WriteGroup(context.WithoutCancel(ctx), g)
	var pg *rolloutv1.Group
	if err == nil {
		pg, err = groupProto(s.st.Info(), g)
	}
	for i := range g.Rollouts {
		observeRollout(assemble.StandaloneEnv, &g.Rollouts[i])
	}
	observeGroup(assemble.StandaloneEnv, "gateway", g)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ss := range gg.sessions {
		s.done[ss.id] = doneSession{state: ss.state, tenant: gg.tenant}
		delete(s.sessions, ss.id)
	}
	delete(s.groups, gg.id)
	s.finished[gg.id] = gg.tenant
	if err != nil {
		return fmt.Errorf("group %s: %w", gg.id, err)
	}
	s.queue[gg.tenant] = append(s.queue[gg.tenant], pg)
	for f := range s.followers {
		if f.tenant != gg.tenant {
			continue
		}
		select {
		case f.ch <- pg:
		default:
			// Too far behind: it ends and reconnects from its sequence.
			delete(s.followers, f)
			close(f.lost)
		}
	}
	close(s.notify)
	s.notify = make(chan struct{})
	return nil
}

// WatchSessionGroups implements rolloutv1.GatewayServiceServer.
func (s *GatewayServer) WatchSessionGroups(req *rolloutv1.WatchSessionGroupsRequest, stream grpc.ServerStreamingServer[rolloutv1.WatchSessionGroupsResponse]) error {
	if err := checkLayout("token_layout", req.GetTokenLayout()); err != nil {
		return err
	}
	compact := compactLayout(req.GetTokenLayout())
	if req.FromSequence != nil {
		if *req.FromSequence < 0 {
			return status.Error(codes.InvalidArgument, "from_sequence: must not be negative")
		}
		return s.follow(*req.FromSequence, compact, stream)
	}
	ctx := stream.Context()
	tenant := tenantOf(ctx)
	for {
		s.mu.Lock()
		var g *rolloutv1.Group
		if q := s.queue[tenant]; len(q) > 0 {
			g, s.queue[tenant] = q[0], q[1:]
		}
		drained, notify := s.drained, s.notify
		s.mu.Unlock()
		if g == nil {
			if drained {
				return nil
			}
			select {
			case <-notify:
				continue
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
		}
		out := g
		if compact {
			out = CompactGroup(g)
		}
		if err := stream.Send(&rolloutv1.WatchSessionGroupsResponse{Group: out}); err != nil {
			// Not delivered: the next watcher gets it (it is in the run
			// directory already).
			s.mu.Lock()
			s.queue[tenant] = append([]*rolloutv1.Group{g}, s.queue[tenant]...)
			s.mu.Unlock()
			return err
		}
	}
}

// distill scores every ok session's branches with the teacher before the
// group is assembled. A session the teacher could not score is recorded
// failed (distill), as a harness env's rollout is: its tokens are kept,
// and the group's statistics leave it out.
func (s *GatewayServer) distill(ctx context.Context, d runner.Distiller, g *runner.Group) {
	for i := range g.Rollouts {
		ro := &g.Rollouts[i]
		if ro.Status != runner.StatusOK || ro.Session == nil {
			continue
		}
		if err := runner.DistillBranches(context.WithoutCancel(ctx), d, ro); err != nil {
			s.log.Warn("gateway: the distillation teacher could not score a session", "group", g.ID, "rollout", ro.ID, "err", err)
			ro.Status, ro.Failure = runner.StatusInfraFailed, &runner.Failure{Kind: runner.FailDistill, Message: err.Error()}
		}
	}
}

// gwFollower is a watcher with from_sequence: writeGroup hands it every
// group it writes.
type gwFollower struct {
	tenant string // it gets its tenant's groups only
	ch     chan *rolloutv1.Group
	lost   chan struct{} // closed when ch was full: the follower ends
}

// followerBuffer is how many finished groups a follower may lag behind
// before its stream ends (it reconnects from its sequence).
const followerBuffer = 1024

// follow serves a watcher with from_sequence: the groups in the run
// directory from that sequence, then every group as it is written, in
// sequence order, each once; every group sent is taken off the queue.
// It is registered before the run directory is read, so a group written
// meanwhile is on disk, live, or both (then sent once, by sequence).
func (s *GatewayServer) follow(from int64, compact bool, stream grpc.ServerStreamingServer[rolloutv1.WatchSessionGroupsResponse]) error {
	ctx := stream.Context()
	tenant := tenantOf(ctx)
	f := &gwFollower{tenant: tenant, ch: make(chan *rolloutv1.Group, followerBuffer), lost: make(chan struct{})}
	s.mu.Lock()
	if !s.drained {
		s.followers[f] = true
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.followers, f)
		s.mu.Unlock()
	}()
	next := from
	send := func(g *rolloutv1.Group) error {
		if g.GetSequence() < next {
			return nil // replayed from the run directory already
		}
		next = g.GetSequence() + 1
		out := g
		if compact {
			out = CompactGroup(g)
		}
		if err := stream.Send(&rolloutv1.WatchSessionGroupsResponse{Group: out}); err != nil {
			return err
		}
		s.delivered(tenant, g.GetSequence())
		return nil
	}
	mine := func(recs []trajectory.Record) bool {
		t := groupTenant(recs)
		return t == tenant || t == "" && (tenant == DefaultTenant || tenant == anonymousTenant)
	}
	if err := replayGroupsWhere(ctx, s.st.Dir(), from, s.st.Config().Advantage.DropEqual, mine, send); err != nil {
		return toStatus(err)
	}
	for {
		s.mu.Lock()
		drained, notify := s.drained, s.notify
		s.mu.Unlock()
		select {
		case g := <-f.ch:
			if err := send(g); err != nil {
				return err
			}
			continue
		default:
		}
		if drained {
			// Every group was handed over before drained was set.
			return nil
		}
		select {
		case g := <-f.ch:
			if err := send(g); err != nil {
				return err
			}
		case <-f.lost:
			return status.Errorf(codes.ResourceExhausted, "watcher fell %d groups behind and was disconnected; reconnect with from_sequence %d", followerBuffer, next)
		case <-notify:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// delivered takes tenant's group of sequence seq off its queue: a
// follower sent it.
func (s *GatewayServer) delivered(tenant string, seq int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue[tenant] = slices.DeleteFunc(s.queue[tenant], func(g *rolloutv1.Group) bool { return g.GetSequence() == seq })
}

// eventTenant is the main row's loop event naming the tenant that opened
// the session's group.
const eventTenant = "gateway_tenant"

// groupTenant is the tenant a stored group's rows name; a group written
// before tenants (no such event) is the single token's or, without auth,
// everyone's.
func groupTenant(recs []trajectory.Record) string {
	for _, r := range recs {
		for _, e := range r.LoopEvents {
			if e.Kind == eventTenant {
				return e.Detail
			}
		}
	}
	return ""
}

// Shutdown stops the gateway: OpenSession is refused from now on; every
// open session is closed and, like every closed session still without a
// score, recorded without a reward (session_expired, saying why); every
// group with sessions is written (partial ones with the sessions they
// have); watchers receive what is queued, then their streams end; the
// run directory is flushed and closed.
func (s *GatewayServer) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return nil
	}
	s.stopping = true
	var open, closing []*gwSession
	for _, ss := range s.sessions {
		switch ss.state {
		case sessOpen:
			ss.state = sessClosing
			open = append(open, ss)
		case sessClosing:
			closing = append(closing, ss) // a CloseSession in progress
		}
	}
	s.mu.Unlock()
	for _, ss := range open {
		rec, err := ss.cs.Close(ctx)
		if err != nil && errors.Is(gateway.KindOf(err), gateway.ErrSession) {
			// Its idle expiry closed it: wait until that is recorded, so
			// that its group is written below.
			select {
			case <-ss.settled:
			case <-ctx.Done():
			}
			continue
		}
		reason := "open when the gateway shut down; no reward was posted"
		if err != nil {
			reason += fmt.Sprintf("; closing it failed: %v", err)
		}
		s.finishSession(ss, rec, sessExpired, reason)
	}
	for _, ss := range closing {
		select {
		case <-ss.settled:
		case <-ctx.Done():
		}
	}
	s.mu.Lock()
	var finish []*gwGroup
	for _, g := range s.groups {
		for _, ss := range g.sessions {
			if ss.state == sessClosed {
				ss.state, ss.reason = sessExpired, "closed but not scored when the gateway shut down; no reward was posted"
				ss.ro.Status, ss.ro.Failure = runner.StatusInfraFailed, &runner.Failure{Kind: runner.FailExpired, Message: ss.reason}
				ss.ro.Result.StopReason = runner.StopSessionExpired
				metricGatewayUnscored.WithLabelValues(sessExpired).Inc()
			}
		}
		if !g.finished && len(g.sessions) > 0 {
			g.size = len(g.sessions) // written with the sessions it has
			if fg := s.finishable(g); fg != nil {
				finish = append(finish, fg)
			}
		}
	}
	s.final = true
	s.mu.Unlock()
	var errs []error
	for _, g := range finish {
		errs = append(errs, s.writeGroup(ctx, g))
	}
	s.writes.Wait()
	s.mu.Lock()
	s.drained = true
	close(s.notify)
	s.notify = make(chan struct{})
	s.mu.Unlock()
	errs = append(errs, s.st.Close(ctx))
	return errors.Join(errs...)
}

// gatewayStatus maps the capture gateway's error kinds to gRPC codes.
func gatewayStatus(err error) error {
	switch kind := gateway.KindOf(err); {
	case errors.Is(kind, gateway.ErrOverloaded):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(kind, gateway.ErrSession):
		return status.Error(codes.NotFound, err.Error())
	}
	return toStatus(err)
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
