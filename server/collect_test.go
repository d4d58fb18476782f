package server

import (
	"bufio"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
)

// collectClient drives a CollectGroups stream and checks the credit
// invariant on every message: the service never has more groups started
// (in flight or sent) than the trainer granted.
type collectClient struct {
	t       *testing.T
	stream  rolloutv1.RolloutService_CollectGroupsClient
	granted int
	groups  []*rolloutv1.Group
	last    *rolloutv1.CollectStatus
}

// startCollect opens a CollectGroups stream on cli and sends its start.
func startCollect(t *testing.T, cli rolloutv1.RolloutServiceClient, start *rolloutv1.CollectStart) *collectClient {
	t.Helper()
	stream, err := cli.CollectGroups(bg(t))
	if err != nil {
		t.Fatal(err)
	}
	c := &collectClient{t: t, stream: stream}
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Start{Start: start}})
	return c
}

func (c *collectClient) send(m *rolloutv1.CollectGroupsRequest) {
	c.t.Helper()
	if cr := m.GetCredit(); cr != nil {
		c.granted += int(cr.Groups) // counted before the service can see it
	}
	if s := m.GetStart(); s != nil {
		c.granted += int(s.InitialCredits)
	}
	if err := c.stream.Send(m); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// recv reads one message; it returns false at the end of the stream.
func (c *collectClient) recv() (bool, error) {
	m, err := c.stream.Recv()
	if errors.Is(err, io.EOF) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	switch x := m.Msg.(type) {
	case *rolloutv1.CollectGroupsResponse_Group:
		c.groups = append(c.groups, x.Group)
		if len(c.groups) > c.granted {
			c.t.Fatalf("received %d groups with %d credits granted", len(c.groups), c.granted)
		}
	case *rolloutv1.CollectGroupsResponse_Status:
		st := x.Status
		if int(st.Sent+st.InFlight) > c.granted {
			c.t.Fatalf("status %v: %d groups started with %d credits granted", st, st.Sent+st.InFlight, c.granted)
		}
		c.last = st
	}
	return true, nil
}

// until reads until cond holds after a message.
func (c *collectClient) until(what string, cond func() bool) {
	c.t.Helper()
	for !cond() {
		more, err := c.recv()
		if err != nil || !more {
			c.t.Fatalf("stream ended (%v) while waiting for %s; last status %v, %d groups", err, what, c.last, len(c.groups))
		}
	}
}

// drain closes the send side and reads until the service ends the stream.
func (c *collectClient) drain() {
	c.t.Helper()
	if err := c.stream.CloseSend(); err != nil {
		c.t.Fatal(err)
	}
	for {
		more, err := c.recv()
		if err != nil {
			c.t.Fatalf("stream: %v", err)
		}
		if !more {
			return
		}
	}
}

func (c *collectClient) settled(groups, queued int) func() bool {
	return func() bool {
		return len(c.groups) == groups && c.last != nil && c.last.InFlight == 0 && int(c.last.Queued) == queued && int(c.last.Sent) == groups
	}
}

// firstItem is a toolcall-match dataset row, as a trainer would send it.
func firstItem(t *testing.T) string {
	t.Helper()
	f, err := os.Open("../envs/data/toolcall_match.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	if !sc.Scan() {
		t.Fatal("empty dataset")
	}
	return sc.Text()
}

// TestCollectGroupsCredits asks for more groups than it grants and checks
// that exactly the granted groups arrive, stamped with the request's
// policy version and id, for dataset items and the trainer's own items.
func TestCollectGroupsCredits(t *testing.T) {
	s := newSim(t, "toolcall-match", -1)
	h := startServer(t, Options{}, RunOptions{})
	stream, err := h.cli.CollectGroups(bg(t))
	if err != nil {
		t.Fatal(err)
	}
	c := &collectClient{t: t, stream: stream}
	pv3, pv4 := int64(3), int64(4)
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Start{Start: &rolloutv1.CollectStart{
		ConfigYaml: jobYAML(s.URL, "", 0, 2), InitialCredits: 2}}})
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{
		RequestId: "r1", Count: 5, PolicyVersion: &pv3, SamplingJson: `{"max_tokens": 200}`}}})
	c.until("the 2 granted groups", c.settled(2, 3))

	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Credit{Credit: &rolloutv1.CollectCredit{Groups: 1}}})
	c.until("1 more group", c.settled(3, 2))

	// The trainer's own item queues behind the 2 dataset items.
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Items{Items: &rolloutv1.CollectItems{
		RequestId: "own", ItemsJson: []string{firstItem(t)}, PolicyVersion: &pv4}}})
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Credit{Credit: &rolloutv1.CollectCredit{Groups: 3}}})
	c.until("3 more groups", c.settled(6, 0))

	// 5 of the 7 train items are used: asking for 5 more queues 2 and
	// reports the dataset exhausted.
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{Count: 5}}})
	c.until("exhausted", func() bool { return c.last.Exhausted && c.last.Queued == 2 })

	// Closing the send side ends the stream once nothing is in flight; the
	// queued items were never granted, so they never run.
	c.drain()
	if len(c.groups) != 6 || c.granted != 6 {
		t.Fatalf("%d groups for %d credits, want 6", len(c.groups), c.granted)
	}
	seen := map[string]bool{}
	requests := map[string]int{}
	for _, g := range c.groups {
		requests[g.RequestId]++
		if seen[g.GroupId] {
			t.Errorf("group %s sent twice", g.GroupId)
		}
		seen[g.GroupId] = true
		if len(g.Rollouts) != 2 {
			t.Errorf("group %s: %d rollouts", g.GroupId, len(g.Rollouts))
		}
		for _, ro := range g.Rollouts {
			if ro.Status != "ok" || len(ro.Tokens) == 0 || len(ro.Tokens) != len(ro.LossMask) {
				t.Errorf("group %s rollout %d: %s (%s), %d tokens", g.GroupId, ro.Index, ro.Status, ro.FailureMessage, len(ro.Tokens))
			}
		}
		switch {
		case g.RequestId == "r1":
			if g.PolicyVersion == nil || *g.PolicyVersion != 3 {
				t.Errorf("group %s: policy version %v, want 3", g.GroupId, g.PolicyVersion)
			}
		case g.RequestId == "own":
			if g.PolicyVersion == nil || *g.PolicyVersion != 4 || !strings.HasPrefix(g.ItemId, "own/") {
				t.Errorf("own group %s: item %s, policy version %v", g.GroupId, g.ItemId, g.PolicyVersion)
			}
		default:
			t.Errorf("group %s: request id %q", g.GroupId, g.RequestId)
		}
	}
	if requests["r1"] != 5 || requests["own"] != 1 {
		t.Errorf("groups by request: %v, want 5 of r1 and 1 of own", requests)
	}
	if !seen["own/weather-paris"] {
		t.Errorf("the trainer's own item was not collected: %v", seen)
	}
}

// TestCollectGroupsShutdown: a server shutdown ends a collect stream with
// Unavailable once every started group was sent, and starts no queued
// group meanwhile.
func TestCollectGroupsShutdown(t *testing.T) {
	s := newSim(t, "toolcall-match", 2) // the first group passes, the second blocks
	h := startServer(t, Options{}, RunOptions{})
	t.Cleanup(s.open)
	c := startCollect(t, h.cli, &rolloutv1.CollectStart{
		ConfigYaml: jobYAML(s.URL, "", 0, 2), InitialCredits: 1})
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{Count: 3}}})
	c.until("the first group", c.settled(1, 2))
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Credit{Credit: &rolloutv1.CollectCredit{Groups: 2}}})
	s.waitBlocked(t, 4) // the second and third groups are in flight

	stopped := make(chan error, 1)
	go func() { stopped <- h.stop() }()
	waitFor(t, "the shutdown to begin", h.shuttingDown)
	// Credits and items sent now queue but start nothing.
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{Count: 1}}})
	s.open()
	var end error
	for {
		more, err := c.recv()
		if err != nil || !more {
			end = err
			break
		}
	}
	wantCode(t, "stream end at shutdown", end, codes.Unavailable, "shutting down")
	if len(c.groups) != 3 {
		t.Errorf("%d groups, want 3 (those in flight at shutdown drained)", len(c.groups))
	}
	if c.last.Queued != 1 {
		t.Errorf("last status %v: want the item asked for during the drain still queued", c.last)
	}
	if err := wait(t, "the server to stop", stopped); err != nil {
		t.Fatal(err)
	}
}

// TestCollectGroupsResume: a trainer that lost its stream after receiving
// group 0 reconnects with from_sequence 1: groups 1 and 2 (durable, maybe
// never received) come first without credits, then `next` continues with
// items not yet collected, numbered on.
func TestCollectGroupsResume(t *testing.T) {
	s := newSim(t, "toolcall-match", -1)
	h := startServer(t, Options{}, RunOptions{})
	cfg := jobYAML(s.URL, "runs/collect", 0, 2)
	c := startCollect(t, h.cli, &rolloutv1.CollectStart{ConfigYaml: cfg, InitialCredits: 3})
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{Count: 3}}})
	c.until("3 groups", c.settled(3, 0))
	if err := c.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var err error
	for more := true; more; {
		if more, err = c.recv(); err != nil {
			t.Fatal(err)
		}
	}
	first := map[int64]string{}
	full := map[string]*rolloutv1.Group{}
	for _, g := range c.groups {
		full[g.GroupId] = g
		if g.Sequence == nil {
			t.Fatalf("group %s without a sequence", g.GroupId)
		}
		first[*g.Sequence] = g.GroupId
	}
	if len(first) != 3 || first[0] == "" || first[1] == "" || first[2] == "" {
		t.Fatalf("sequences of the first stream: %v", first)
	}

	stream2, err := h.cli.CollectGroups(bg(t))
	if err != nil {
		t.Fatal(err)
	}
	from := int64(1)
	if err := stream2.Send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Start{Start: &rolloutv1.CollectStart{
		ConfigYaml: cfg, InitialCredits: 2, FromSequence: &from, TokenLayout: rolloutv1.TokenLayout_TOKEN_LAYOUT_COMPACT}}}); err != nil {
		t.Fatal(err)
	}
	if err := stream2.Send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{Count: 2}}}); err != nil {
		t.Fatal(err)
	}
	var got []*rolloutv1.Group
	for len(got) < 4 {
		m, err := stream2.Recv()
		if err != nil {
			t.Fatalf("second stream after %d groups: %v", len(got), err)
		}
		if g := m.GetGroup(); g != nil {
			got = append(got, g)
		}
	}
	if err := stream2.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream2.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	// The second stream asked for the compact layout: replayed and new
	// groups arrive compact and expand to what the full layout carries.
	compacted := 0
	for _, g := range got {
		for _, r := range g.Rollouts {
			if len(r.Tokens) > 0 && (len(r.LossMask) != 0 || len(r.LossMaskRuns) == 0) {
				t.Fatalf("group %s rollout %d not in the compact layout: %d mask values, %d runs", g.GroupId, r.Index, len(r.LossMask), len(r.LossMaskRuns))
			}
			if len(r.TrainedLogprobs) > 0 {
				compacted++
			}
		}
		if err := ExpandGroup(g); err != nil {
			t.Fatal(err)
		}
		for _, r := range g.Rollouts {
			if len(r.LossMask) != len(r.Tokens) || (len(r.Logprobs) != 0 && len(r.Logprobs) != len(r.Tokens)) {
				t.Errorf("group %s rollout %d expands to %d tokens, %d mask values, %d logprobs", g.GroupId, r.Index, len(r.Tokens), len(r.LossMask), len(r.Logprobs))
			}
		}
		if f := full[g.GroupId]; f != nil {
			for i, r := range g.Rollouts {
				fr := f.Rollouts[i]
				if !slices.Equal(r.Tokens, fr.Tokens) || !slices.Equal(r.LossMask, fr.LossMask) || !slices.Equal(r.Logprobs, fr.Logprobs) {
					t.Errorf("group %s rollout %d: compact layout expands to other token columns than the full layout", g.GroupId, r.Index)
				}
			}
		}
	}
	if compacted == 0 {
		t.Error("no rollout carried trained_logprobs: the compact layout was not exercised")
	}
	if got[0].GetSequence() != 1 || got[0].GroupId != first[1] || got[1].GetSequence() != 2 || got[1].GroupId != first[2] {
		t.Errorf("replayed %s#%d, %s#%d; want %s#1, %s#2", got[0].GroupId, got[0].GetSequence(), got[1].GroupId, got[1].GetSequence(), first[1], first[2])
	}
	seen := map[string]bool{first[0]: true, first[1]: true, first[2]: true}
	for _, g := range got[2:] {
		if seen[g.GroupId] {
			t.Errorf("group %s collected again", g.GroupId)
		}
		seen[g.GroupId] = true
		if s := g.GetSequence(); s != 3 && s != 4 {
			t.Errorf("new group %s has sequence %d, want 3 or 4", g.GroupId, s)
		}
	}
}
