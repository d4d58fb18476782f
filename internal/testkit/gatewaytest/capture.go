package gatewaytest

import (
	"context"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/capture"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/simtest"
)

// FixScript is a three-turn simulator script for "fix the bug" requests:
// a terminal call, a second one with two arguments, a final answer.
var FixScript = sim.Script{Match: "fix the bug", Steps: []sim.Step{
	{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls"}}}},
	{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"workdir": "/src", "command": "cat a.txt"}}}},
	{Final: "Done: the bug is fixed."},
}}

// Capture is the real capture core (tokens mode against the simulator,
// hermes tool calls and qwen3 reasoning) served over HTTP with a door
// list, and one open session.
type Capture struct {
	Sim     *sim.Server
	Session *capture.Session
	// URL is the session's base URL: {server}/s/{session id}.
	URL string
}

// StartCapture starts the simulator with script, a capture core over it
// and its HTTP handler with doors, and opens a session. The caller passes
// the doors (gateway/builtin's list) so that a door's own tests can use
// this package without an import cycle.
func StartCapture(t testing.TB, doors []gateway.FrontDoor, script sim.Script) *Capture {
	t.Helper()
	srv := simtest.Start(t, sim.Config{Family: "hermes", Scripts: []sim.Script{script}, Reasoning: true, RecordGenerations: true})
	pol, err := inference.New(inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, Retries: -1, ReadyTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pol.(interface{ Close() error }).Close() })
	temp := 0.6
	opts := capture.Options{Parser: "hermes", ReasoningParser: "qwen3", Doors: doors}
	opts.Sampling.Temperature, opts.Sampling.MaxTokens = &temp, 512
	gw, err := capture.New(pol, opts)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(capture.Handler(gw, doors))
	t.Cleanup(hs.Close)
	s, err := gw.Open(context.Background(), inference.EpisodeSpec{ID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	return &Capture{Sim: srv, Session: s, URL: hs.URL + "/s/" + s.ID()}
}

// CheckLinear closes the session and checks its record is one branch of
// turns calls, all OK through the door api (streamed or not), every echo
// anchored and none rewritten, and that each turn's trained ids are
// exactly the ones the simulator sampled.
func (c *Capture) CheckLinear(t testing.TB, api string, stream bool, turns int) {
	t.Helper()
	rec, err := c.Session.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := make([]int, turns)
	for i := range want {
		want[i] = i
	}
	if len(rec.Branches) != 1 || !slices.Equal(rec.Branches[0].Calls, want) || rec.Unanchored != 0 || rec.Rewritten != 0 {
		t.Fatalf("record: %d branches, calls %+v, unanchored %d, rewritten %d", len(rec.Branches), rec.Calls, rec.Unanchored, rec.Rewritten)
	}
	for _, call := range rec.Calls {
		if call.Status != gateway.CallOK || call.API != api || call.Stream != stream {
			t.Errorf("call %+v", call)
		}
	}
	seq := rec.Branches[0].Sequence
	gens := c.Sim.Generations()
	if len(gens) != turns || len(seq.TurnStarts) != turns {
		t.Fatalf("%d generations, %d turns, want %d", len(gens), len(seq.TurnStarts), turns)
	}
	for k, st := range seq.TurnStarts {
		for i, id := range gens[k].IDs {
			if int(seq.Tokens[st+i]) != id || seq.Mask[st+i] != 1 {
				t.Fatalf("turn %d: trained id %d differs from the sampled one", k, i)
			}
		}
	}
}
