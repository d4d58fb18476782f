package capture_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/builtin"
	"github.com/rollout-rl/rollout/gateway/capture"
	"github.com/rollout-rl/rollout/gateway/openaichat"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/simtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var fixScript = sim.Script{Match: "fix the bug", Steps: []sim.Step{
	{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"command": "ls"}}}},
	{ToolCalls: []sim.Call{{Name: "terminal", Arguments: map[string]any{"workdir": "/src", "command": "cat a.txt"}}}},
	{Final: "Done: the bug is fixed."},
}}

var terminalTool = json.RawMessage(`[{"type":"function","function":{"name":"terminal","description":"Run a shell command","parameters":{"type":"object","properties":{"command":{"type":"string"},"workdir":{"type":"string"}},"required":["command"]}}}]`)

func runTemp() *float64 { v := 0.6; return &v }

// rig is a simulator, a tokens-mode policy, a gateway and its HTTP server.
type rig struct {
	srv  *sim.Server
	pol  inference.Policy
	gw   *capture.Gateway
	http *httptest.Server
}

func newRig(t testing.TB, cfg sim.Config, opts capture.Options) *rig {
	t.Helper()
	if cfg.Family == "" {
		cfg.Family = "hermes"
	}
	cfg.RecordGenerations, cfg.RecordSamplers = true, true
	srv := simtest.Start(t, cfg)
	return newRigOn(t, srv, srv.URL, opts)
}

func newRigOn(t testing.TB, srv *sim.Server, url string, opts capture.Options) *rig {
	t.Helper()
	pol, err := inference.New(inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{url}, Retries: -1, ReadyTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pol.(interface{ Close() error }).Close() })
	if opts.Parser == "" {
		opts.Parser = "hermes"
	}
	if opts.Sampling.Temperature == nil {
		opts.Sampling.Temperature = runTemp()
	}
	switch opts.Sampling.MaxTokens {
	case 0:
		opts.Sampling.MaxTokens = 512
	case -1:
		opts.Sampling.MaxTokens = 0 // no run cap
	}
	opts.Doors = builtin.FrontDoors()
	gw, err := capture.New(pol, opts)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(capture.Handler(gw, builtin.FrontDoors()))
	t.Cleanup(hs.Close)
	return &rig{srv: srv, pol: pol, gw: gw, http: hs}
}

func (r *rig) spec() inference.EpisodeSpec { return inference.EpisodeSpec{ID: "r1"} }

func (r *rig) open(t testing.TB) *capture.Session {
	t.Helper()
	s, err := r.gw.Open(context.Background(), r.spec())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (r *rig) base(s *capture.Session) string { return r.http.URL + "/s/" + s.ID() + "/v1" }

// post sends body to the session's chat completions route.
func post(t testing.TB, base string, body any) (int, []byte) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(base+"/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, raw
}

type wireMsg struct {
	Role             string `json:"role"`
	Content          *string
	ReasoningContent string `json:"reasoning_content"`
	ToolCalls        []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

type completion struct {
	ID      string `json:"id"`
	Choices []struct {
		Message      wireMsg `json:"message"`
		FinishReason string  `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// harness is a Go agent speaking OpenAI JSON: it echoes each reply,
// answers each call with a tool message, optionally normalising its
// history the way real harnesses do.
type harness struct {
	base      string
	msgs      []map[string]any
	normalise bool
	extra     map[string]any
}

func newHarness(base, task string) *harness {
	return &harness{base: base, msgs: []map[string]any{
		{"role": "system", "content": "You are a coding agent."},
		{"role": "user", "content": task},
	}}
}

// step makes one call and appends the echo and the tool results; it
// returns the finish reason.
func (h *harness) step(t testing.TB) string {
	t.Helper()
	body := map[string]any{"model": "rollout-sim", "messages": h.msgs, "tools": terminalTool}
	for k, v := range h.extra {
		body[k] = v
	}
	st, raw := post(t, h.base, body)
	if st != 200 {
		t.Fatalf("status %d: %s", st, raw)
	}
	var c completion
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	m := c.Choices[0].Message
	echo := map[string]any{"role": "assistant", "content": m.Content}
	if m.ReasoningContent != "" && !h.normalise {
		echo["reasoning_content"] = m.ReasoningContent
	}
	if h.normalise && m.Content != nil {
		echo["content"] = strings.TrimSpace(*m.Content)
	}
	var calls []map[string]any
	for _, tc := range m.ToolCalls {
		args := tc.Function.Arguments
		if h.normalise {
			var v map[string]any
			if err := json.Unmarshal([]byte(args), &v); err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(v) // compact, keys sorted
			args = string(b)
		}
		calls = append(calls, map[string]any{"id": tc.ID, "type": "function", "function": map[string]any{"name": tc.Function.Name, "arguments": args}})
	}
	if calls != nil {
		echo["tool_calls"] = calls
	}
	if h.normalise {
		for _, m := range h.msgs {
			if s, ok := m["content"].(string); ok {
				m["content"] = strings.TrimSpace(s) // the harness strips every message
			}
		}
	}
	h.msgs = append(h.msgs, echo)
	for _, tc := range m.ToolCalls {
		out := "output of " + tc.Function.Name + " " + tc.Function.Arguments
		if h.normalise {
			out = "  " + out + "\n"
		}
		h.msgs = append(h.msgs, map[string]any{"role": "tool", "tool_call_id": tc.ID, "content": out})
	}
	return c.Choices[0].FinishReason
}

// exact checks every branch against what the simulator sampled: each
// call's prompt is the branch's tokens before its turn, its ids are the
// trained ids of the turn, and nothing else is trained.
func exact(t *testing.T, rec gateway.SessionRecord, gens []sim.GenerationRecord) {
	t.Helper()
	used := map[int]bool{}
	for _, b := range rec.Branches {
		seq := b.Sequence
		if len(seq.TurnStarts) != len(b.Calls) {
			t.Fatalf("branch %d: %d turns for %d calls", b.Index, len(seq.TurnStarts), len(b.Calls))
		}
		trained := 0
		for _, m := range seq.Mask {
			trained += int(m)
		}
		want := 0
		for k, ci := range b.Calls {
			st := seq.TurnStarts[k]
			g := -1
			for i, gr := range gens {
				if !used[i] && slices.Equal(toInt(seq.Tokens[:st]), gr.Prompt) {
					g = i
					break
				}
			}
			if g < 0 {
				t.Fatalf("branch %d call %d: no generation had the branch's prompt of %d tokens", b.Index, ci, st)
			}
			used[g] = true
			ids := gens[g].IDs
			if got := toInt(seq.Tokens[st : st+len(ids)]); !slices.Equal(got, ids) {
				t.Fatalf("branch %d call %d: trained ids differ from the sampled ones", b.Index, ci)
			}
			ok := rec.Calls[ci].Status == gateway.CallOK
			for i := st; i < st+len(ids); i++ {
				if (seq.Mask[i] == 1) != ok {
					t.Fatalf("branch %d call %d (%s): mask %d at sampled position %d", b.Index, ci, rec.Calls[ci].Status, seq.Mask[i], i)
				}
			}
			if ok {
				want += len(ids)
			}
		}
		if trained != want {
			t.Errorf("branch %d: %d trained positions, want %d (the sampled ids of its ok calls)", b.Index, trained, want)
		}
	}
}

func toInt(ids []int32) []int {
	out := make([]int, len(ids))
	for i, v := range ids {
		out[i] = int(v)
	}
	return out
}

func closeSession(t *testing.T, s *capture.Session) gateway.SessionRecord {
	t.Helper()
	rec, err := s.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestMultiTurnToolConversation(t *testing.T) {
	for _, tc := range []struct {
		name      string
		normalise bool
		reasoning bool
	}{{"verbatim", false, false}, {"verbatim-reasoning", false, true}, {"normalising-harness", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			opts := capture.Options{}
			if tc.reasoning {
				opts.ReasoningParser = "qwen3"
			}
			r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}, Reasoning: tc.reasoning}, opts)
			s := r.open(t)
			h := newHarness(r.base(s), "  Please fix the bug in a.txt  ")
			h.normalise = tc.normalise
			var finishes []string
			for i := 0; i < 3; i++ {
				finishes = append(finishes, h.step(t))
			}
			if want := []string{"tool_calls", "tool_calls", "stop"}; !slices.Equal(finishes, want) {
				t.Fatalf("finish reasons %v, want %v", finishes, want)
			}
			rec := closeSession(t, s)
			if len(rec.Branches) != 1 {
				t.Fatalf("%d branches, want 1: %+v", len(rec.Branches), rec.Calls)
			}
			if got := rec.Branches[0].Calls; !slices.Equal(got, []int{0, 1, 2}) {
				t.Fatalf("branch calls %v", got)
			}
			for _, c := range rec.Calls {
				if c.Status != gateway.CallOK || c.Branch != 0 || c.API != openaichat.Name {
					t.Fatalf("call %+v", c)
				}
			}
			exact(t, rec, r.srv.Generations())
			if tc.normalise && rec.Rewritten == 0 {
				t.Errorf("a normalising harness's echoes were not counted as rewritten")
			}
			if !tc.normalise && rec.Rewritten != 0 {
				t.Errorf("verbatim echoes counted as rewritten: %d", rec.Rewritten)
			}
			if rec.Unanchored != 0 {
				t.Errorf("%d unanchored turns", rec.Unanchored)
			}
			if got := rec.Branches[0].Messages[2]; got.Role != "assistant" || (got.ReasoningContent != "") != tc.reasoning {
				t.Errorf("the branch's first reply %+v: reasoning kept %v, want %v", got, got.ReasoningContent != "", tc.reasoning)
			}
		})
	}
}

func TestCompactionStartsBranch(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{})
	s := r.open(t)
	h := newHarness(r.base(s), "Please fix the bug in a.txt")
	h.step(t)
	h.step(t)
	// Compaction: the history is replaced by a summary.
	h.msgs = []map[string]any{h.msgs[0], {"role": "user", "content": "Please fix the bug in a.txt. Summary so far: listed the files and read a.txt."}}
	h.step(t)
	h.step(t)
	rec := closeSession(t, s)
	if len(rec.Branches) != 2 {
		t.Fatalf("%d branches, want 2", len(rec.Branches))
	}
	b0, b1 := rec.Branches[0], rec.Branches[1]
	if !slices.Equal(b0.Calls, []int{0, 1}) || !slices.Equal(b1.Calls, []int{2, 3}) {
		t.Fatalf("calls per branch %v %v", b0.Calls, b1.Calls)
	}
	if b0.Parent != -1 || b1.Parent != 0 || b1.SplitCall != 2 {
		t.Fatalf("graph: b0 parent %d, b1 parent %d split %d", b0.Parent, b1.Parent, b1.SplitCall)
	}
	lcp := 0
	for lcp < len(b0.Sequence.Tokens) && lcp < len(b1.Sequence.Tokens) && b0.Sequence.Tokens[lcp] == b1.Sequence.Tokens[lcp] {
		lcp++
	}
	if b1.Shared != lcp || lcp == 0 || lcp >= b1.Sequence.PromptLen {
		t.Fatalf("shared %d, common prefix %d, prompt %d", b1.Shared, lcp, b1.Sequence.PromptLen)
	}
	exact(t, rec, r.srv.Generations())
}

func TestParallelCallsBranch(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{})
	s := r.open(t)
	var wg sync.WaitGroup
	for _, task := range []string{"Please fix the bug in a.txt", "Sub-agent: please fix the bug in b.txt"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, raw := post(t, r.base(s), map[string]any{"model": "rollout-sim", "tools": terminalTool, "messages": []map[string]any{
				{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": task}}})
			if st != 200 {
				t.Errorf("status %d: %s", st, raw)
			}
		}()
	}
	wg.Wait()
	rec := closeSession(t, s)
	if len(rec.Branches) != 2 {
		t.Fatalf("%d branches, want 2", len(rec.Branches))
	}
	b1 := rec.Branches[1]
	if b1.Parent != 0 || b1.Shared == 0 || b1.Shared >= b1.Sequence.PromptLen {
		t.Fatalf("branch 1: parent %d shared %d prompt %d", b1.Parent, b1.Shared, b1.Sequence.PromptLen)
	}
	for _, c := range rec.Calls {
		if c.Status != gateway.CallOK {
			t.Fatalf("call %+v", c)
		}
	}
	exact(t, rec, r.srv.Generations())
}

func TestResentCall(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{})
	s := r.open(t)
	h := newHarness(r.base(s), "Please fix the bug in a.txt")
	first := slices.Clone(h.msgs)
	h.step(t)
	h.msgs = first // the harness could not use the reply: same request again
	h.step(t)
	h.step(t)
	rec := closeSession(t, s)
	if rec.Calls[0].Status != gateway.CallResent || rec.Calls[1].Status != gateway.CallOK || rec.Calls[2].Status != gateway.CallOK {
		t.Fatalf("statuses %s %s %s", rec.Calls[0].Status, rec.Calls[1].Status, rec.Calls[2].Status)
	}
	if len(rec.Branches) != 2 || !slices.Equal(rec.Branches[1].Calls, []int{1, 2}) {
		t.Fatalf("branches %+v", rec.Branches)
	}
	if b1 := rec.Branches[1]; b1.Parent != 0 || b1.Shared != b1.Sequence.PromptLen {
		t.Fatalf("branch 1 parent %d shared %d prompt %d", b1.Parent, b1.Shared, b1.Sequence.PromptLen)
	}
	exact(t, rec, r.srv.Generations()) // the resent call's ids: in context, untrained
}

func TestSamplerGovernance(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{})
	s := r.open(t)
	h := newHarness(r.base(s), "Please fix the bug in a.txt")
	h.extra = map[string]any{"temperature": 1.7, "top_p": 0.5, "max_tokens": 300}
	h.step(t)
	rec := closeSession(t, s)
	c := rec.Calls[0]
	if c.Requested["temperature"] != 1.7 || c.Requested["top_p"] != 0.5 || c.MaxTokens != 300 || c.Granted != 300 {
		t.Fatalf("recorded %+v", c)
	}
	var gen []sim.SamplerRecord
	for _, sr := range r.srv.Samplers() {
		if _, ok := sr.Fields["temperature"]; ok {
			gen = append(gen, sr)
		}
	}
	if len(gen) == 0 {
		t.Fatal("no generation request recorded")
	}
	for _, sr := range gen {
		if sr.Fields["temperature"] != 0.6 || sr.Fields["top_p"] == 0.5 {
			t.Errorf("%s sampled with %v; want the run's temperature 0.6", sr.Route, sr.Fields)
		}
	}
}

// A session opened with its own sampler (a trainer's per-group sampling)
// generates with it, not the gateway's; the harness's fields are still
// only recorded, and max_tokens is capped by the session's limit.
func TestSessionSampling(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{})
	temp := 0.25
	spec := r.spec()
	spec.Sampling = inference.Sampling{Temperature: &temp, MaxTokens: 40}
	s, err := r.gw.OpenWith(context.Background(), spec, capture.SessionOptions{Sampling: &spec.Sampling})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(r.base(s), "Please fix the bug in a.txt")
	h.extra = map[string]any{"temperature": 1.7, "max_tokens": 300}
	h.step(t)
	rec := closeSession(t, s)
	if c := rec.Calls[0]; c.Requested["temperature"] != 1.7 || c.MaxTokens != 300 || c.Granted != 40 {
		t.Fatalf("recorded %+v, want the harness's 1.7 and 300 recorded, 40 granted", c)
	}
	gen := 0
	for _, sr := range r.srv.Samplers() {
		if _, ok := sr.Fields["temperature"]; !ok {
			continue
		}
		gen++
		if sr.Fields["temperature"] != 0.25 {
			t.Errorf("%s sampled with %v; want the session's temperature 0.25", sr.Route, sr.Fields)
		}
	}
	if gen == 0 {
		t.Fatal("no generation request recorded")
	}
	spec.Sampling.MaxTokens = -1
	if _, err := r.gw.OpenWith(context.Background(), spec, capture.SessionOptions{Sampling: &spec.Sampling}); !errors.Is(err, gateway.ErrBadRequest) {
		t.Fatalf("negative max_tokens: %v", err)
	}
}

// A session's own call limit (a harness env's max_calls) replaces the
// gateway's: the call past it is a 400, and the refused call is not
// recorded.
func TestSessionCallLimit(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{})
	s, err := r.gw.OpenWith(context.Background(), r.spec(), capture.SessionOptions{MaxCalls: 2})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(r.base(s), "Please fix the bug in a.txt")
	h.step(t)
	h.step(t)
	st, raw := post(t, r.base(s), map[string]any{"model": "rollout-sim", "messages": []map[string]any{{"role": "user", "content": "again"}}})
	checkError(t, st, raw, 400, "invalid_request_error", nil, nil, "its limit")
	if rec := closeSession(t, s); len(rec.Calls) != 2 {
		t.Fatalf("%d calls recorded, want the 2 within the limit", len(rec.Calls))
	}
}

func TestMalformedToolCallIsContent(t *testing.T) {
	// The model writes a call to a tool the harness did not offer and
	// one with arguments that are not JSON: both are the model's
	// misbehaviour, answered as content.
	script := sim.Script{Match: "bad call", Steps: []sim.Step{{Final: "<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \n</tool_call>"}}}
	r := newRig(t, sim.Config{Scripts: []sim.Script{script}}, capture.Options{})
	s := r.open(t)
	st, raw := post(t, r.base(s), map[string]any{"model": "rollout-sim", "tools": terminalTool, "messages": []map[string]any{{"role": "user", "content": "make a bad call"}}})
	if st != 200 {
		t.Fatalf("status %d: %s", st, raw)
	}
	var c completion
	_ = json.Unmarshal(raw, &c)
	if m := c.Choices[0].Message; len(m.ToolCalls) != 0 || m.Content == nil || !strings.Contains(*m.Content, "<tool_call>") || c.Choices[0].FinishReason != "stop" {
		t.Fatalf("reply %s", raw)
	}
	rec := closeSession(t, s)
	if c := rec.Calls[0]; c.Status != gateway.CallOK || !strings.Contains(c.Reason, "malformed tool call") {
		t.Fatalf("call %+v", c)
	}
}

func TestErrors(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}, MaxModelLen: 400}, capture.Options{Sampling: inference.Sampling{MaxTokens: 64}})
	s := r.open(t)
	user := func(c string) []map[string]any { return []map[string]any{{"role": "user", "content": c}} }
	long := strings.Repeat("many words of a very long prompt ", 200)
	for _, tc := range []struct {
		name   string
		body   any
		status int
		typ    string
		param  any
		code   any
		msg    string
	}{
		{"unknown model", map[string]any{"model": "gpt-4o", "messages": user("hi")}, 404, "invalid_request_error", "model", "model_not_found", `"gpt-4o" does not exist`},
		{"bad role", map[string]any{"model": "rollout-sim", "messages": []map[string]any{{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}}}, 400, "invalid_request_error", "messages[1].role", nil, "invalid role"},
		{"tool without id", map[string]any{"model": "rollout-sim", "messages": []map[string]any{{"role": "tool", "content": "x"}}}, 400, "invalid_request_error", "messages[0].tool_call_id", nil, "tool_call_id"},
		{"no messages", map[string]any{"model": "rollout-sim", "messages": []any{}}, 400, "invalid_request_error", "messages", nil, "non-empty"},
		{"not JSON", "{not json", 400, "invalid_request_error", nil, nil, "not a JSON object"},
		{"image part", map[string]any{"model": "rollout-sim", "messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image_url"}}}}}, 400, "invalid_request_error", "messages[0].content[0].type", nil, "not supported"},
		{"context overflow", map[string]any{"model": "rollout-sim", "messages": user(long)}, 400, "invalid_request_error", "messages", "context_length_exceeded", "max_model_len 400"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st int
			var raw []byte
			if str, ok := tc.body.(string); ok {
				resp, err := http.Post(r.base(s)+"/chat/completions", "application/json", strings.NewReader(str))
				if err != nil {
					t.Fatal(err)
				}
				raw, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				st = resp.StatusCode
			} else {
				st, raw = post(t, r.base(s), tc.body)
			}
			checkError(t, st, raw, tc.status, tc.typ, tc.param, tc.code, tc.msg)
		})
	}
	rec := closeSession(t, s)
	// Calls the door refused never reach the session; those the session
	// refused (unknown model) or the engine did (overflow) are recorded as
	// errors.
	if n := len(rec.Calls); n != 2 || len(rec.Branches) != 0 {
		t.Fatalf("%d calls, %d branches: %+v", n, len(rec.Branches), rec.Calls)
	}
	for _, c := range rec.Calls {
		if c.Status != gateway.CallError || c.Branch != -1 || c.Reason == "" {
			t.Fatalf("call %+v", c)
		}
	}
	// A closed session: 404.
	st, raw := post(t, r.base(s), map[string]any{"model": "rollout-sim", "messages": user("hi")})
	checkError(t, st, raw, 404, "invalid_request_error", nil, "session_not_found", "unknown or closed session")
}

func checkError(t *testing.T, st int, raw []byte, status int, typ string, param, code any, msg string) {
	t.Helper()
	if st != status {
		t.Fatalf("status %d, want %d: %s", st, status, raw)
	}
	var e struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(raw, &e); err != nil || e.Error == nil {
		t.Fatalf("not OpenAI's error shape: %s", raw)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := e.Error[k]; !ok {
			t.Errorf("error without %q: %s", k, raw)
		}
	}
	if e.Error["type"] != typ || e.Error["param"] != param || e.Error["code"] != code {
		t.Errorf("error %s; want type %s param %v code %v", raw, typ, param, code)
	}
	if m, _ := e.Error["message"].(string); !strings.Contains(m, msg) {
		t.Errorf("message %q does not say %q", m, msg)
	}
}

func TestEngineDown(t *testing.T) {
	srv, err := sim.Start(context.Background(), sim.Config{Family: "hermes"})
	if err != nil {
		t.Fatal(err)
	}
	r := newRigOn(t, srv, srv.URL, capture.Options{})
	s := r.open(t)
	// The model is learned while the engine is up; then it goes away.
	if _, err := r.gw.Models(context.Background(), s.ID()); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	st, raw := post(t, r.base(s), map[string]any{"model": "rollout-sim", "messages": []map[string]any{{"role": "user", "content": "hi"}}})
	checkError(t, st, raw, 500, "server_error", nil, nil, "upstream engine failure")
	rec := closeSession(t, s)
	if rec.Calls[0].Status != gateway.CallError || len(rec.Branches) != 0 {
		t.Fatalf("record %+v", rec)
	}
}

func TestStreamShape(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}, Reasoning: true}, capture.Options{ReasoningParser: "qwen3"})
	s := r.open(t)
	st, raw := post(t, r.base(s), map[string]any{"model": "rollout-sim", "stream": true, "stream_options": map[string]any{"include_usage": true},
		"tools": terminalTool, "messages": []map[string]any{{"role": "user", "content": "Please fix the bug"}}})
	if st != 200 {
		t.Fatalf("status %d: %s", st, raw)
	}
	body := string(raw)
	if !strings.HasSuffix(body, "\n\ndata: [DONE]\n\n") {
		t.Fatalf("stream does not end with [DONE]: %q", body)
	}
	events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
	var chunks []map[string]any
	for _, ev := range events[:len(events)-1] {
		if !strings.HasPrefix(ev, "data: {") || strings.Contains(ev, "\n") {
			t.Fatalf("event %q is not one data line of JSON", ev)
		}
		var c map[string]any
		if err := json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &c); err != nil {
			t.Fatal(err)
		}
		if c["object"] != "chat.completion.chunk" || c["model"] != "rollout-sim" {
			t.Fatalf("chunk %s", ev)
		}
		chunks = append(chunks, c)
	}
	delta := func(i int) map[string]any {
		return chunks[i]["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
	}
	if d := delta(0); d["role"] != "assistant" || d["content"] != "" {
		t.Fatalf("first chunk %v", chunks[0])
	}
	if d := delta(1); d["reasoning_content"] == nil {
		t.Fatalf("second chunk carries no reasoning: %v", chunks[1])
	}
	if d := delta(2); d["content"] != "Let me do that." {
		t.Fatalf("third chunk %v", chunks[2])
	}
	head, args := delta(3)["tool_calls"].([]any)[0].(map[string]any), delta(4)["tool_calls"].([]any)[0].(map[string]any)
	if head["index"] != float64(0) || head["type"] != "function" || !strings.HasPrefix(head["id"].(string), "call_") ||
		head["function"].(map[string]any)["name"] != "terminal" || head["function"].(map[string]any)["arguments"] != "" {
		t.Fatalf("tool call head %v", head)
	}
	if args["index"] != float64(0) || args["function"].(map[string]any)["arguments"] != `{"command":"ls"}` || args["id"] != nil {
		t.Fatalf("tool call arguments %v", args)
	}
	id := chunks[0]["id"].(string)
	created := int64(chunks[0]["created"].(float64))
	wantFinish := fmt.Sprintf(`data: {"id":%q,"object":"chat.completion.chunk","created":%d,"model":"rollout-sim","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}`, id, created)
	if events[5] != wantFinish {
		t.Fatalf("finish chunk\n got %s\nwant %s", events[5], wantFinish)
	}
	if u := chunks[6]; len(u["choices"].([]any)) != 0 || u["usage"].(map[string]any)["total_tokens"].(float64) <= 0 {
		t.Fatalf("usage chunk %v", u)
	}
	if len(chunks) != 7 {
		t.Fatalf("%d chunks, want 7", len(chunks))
	}
	for _, c := range chunks[:6] {
		if u, ok := c["usage"]; !ok || u != nil {
			t.Fatalf("with include_usage every chunk but the last carries usage null: %v", c)
		}
	}
	closeSession(t, s)
}

func TestNonStreamShape(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{})
	s := r.open(t)
	st, raw := post(t, r.base(s), map[string]any{"model": "rollout-sim", "tools": terminalTool, "messages": []map[string]any{{"role": "user", "content": "Please fix the bug"}}})
	if st != 200 {
		t.Fatalf("status %d: %s", st, raw)
	}
	var c struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				ToolCalls []struct {
					ID string `json:"id"`
				} `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`{"id":%q,"object":"chat.completion","created":%d,"model":"rollout-sim","choices":[{"index":0,"message":{"role":"assistant","content":"Let me do that.","tool_calls":[{"id":%q,"type":"function","function":{"name":"terminal","arguments":"{\"command\":\"ls\"}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`+"\n",
		c.ID, c.Created, c.Choices[0].Message.ToolCalls[0].ID, c.Usage.PromptTokens, c.Usage.CompletionTokens, c.Usage.PromptTokens+c.Usage.CompletionTokens)
	if string(raw) != want {
		t.Fatalf("body\n got %s\nwant %s", raw, want)
	}
	closeSession(t, s)
}

func TestProbesAndModels(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}, MaxModelLen: 65536}, capture.Options{})
	s := r.open(t)
	get := func(url string, hdr ...string) (int, map[string]any) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v
	}
	st, m := get(r.base(s) + "/models")
	if st != 200 || m["object"] != "list" {
		t.Fatalf("models %d %v", st, m)
	}
	d := m["data"].([]any)[0].(map[string]any)
	if d["id"] != "rollout-sim" || d["max_model_len"] != float64(65536) || d["context_length"] != float64(65536) {
		t.Fatalf("model %v", d)
	}
	st, m = get(r.base(s)+"/models", "anthropic-version", "2023-06-01")
	if st != 200 || m["data"].([]any)[0].(map[string]any)["type"] != "model" {
		t.Fatalf("anthropic models %d %v", st, m)
	}
	st, m = get(r.http.URL + "/s/" + s.ID() + "/props")
	if st != 200 || m["default_generation_settings"].(map[string]any)["n_ctx"] != float64(65536) {
		t.Fatalf("props %d %v", st, m)
	}
	if st, _ = get(r.base(s) + "/health"); st != 200 {
		t.Fatalf("health %d", st)
	}
	if st, m = get(r.http.URL + "/s/nosuchsession/v1/models"); st != 404 || m["error"] == nil {
		t.Fatalf("unknown session %d %v", st, m)
	}
	if st, _ = get(r.http.URL + "/v1/models"); st != 404 {
		t.Fatalf("models outside a session: %d", st)
	}
	closeSession(t, s)
}

func TestServeSessionReachesOnlyItsSession(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{})
	s, other := r.open(t), r.open(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.gw.ServeSession(l, s.ID()) }()
	base := "http://" + l.Addr().String()
	h := newHarness(base+"/v1", "Please fix the bug")
	if f := h.step(t); f != "tool_calls" {
		t.Fatalf("finish %s", f)
	}
	st, raw := post(t, base+"/s/"+other.ID()+"/v1", map[string]any{"model": "rollout-sim", "messages": []map[string]any{{"role": "user", "content": "hi"}}})
	if st != 404 {
		t.Fatalf("another session through this listener: %d %s", st, raw)
	}
	if st, raw = post(t, base+"/s/"+s.ID()+"/v1", map[string]any{"model": "rollout-sim", "messages": h.msgs, "tools": terminalTool}); st != 200 {
		t.Fatalf("own session by its prefix: %d %s", st, raw)
	}
	rec := closeSession(t, s)
	if len(rec.Calls) != 2 || len(rec.Branches) != 1 {
		t.Fatalf("record: %d calls, %d branches", len(rec.Calls), len(rec.Branches))
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("ServeSession returned %v", err)
	}
	if rec := closeSession(t, other); len(rec.Calls) != 0 {
		t.Fatalf("the other session saw calls: %+v", rec.Calls)
	}
}

func TestSessionLimits(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{MaxSessions: 1, MaxCallsPerSession: 1, MaxBodyBytes: 4096})
	s := r.open(t)
	if _, err := r.gw.Open(context.Background(), inference.EpisodeSpec{}); !errors.Is(err, gateway.ErrOverloaded) {
		t.Fatalf("second session: %v", err)
	}
	big := strings.Repeat("x", 8192)
	st, raw := post(t, r.base(s), map[string]any{"model": "rollout-sim", "messages": []map[string]any{{"role": "user", "content": big}}})
	if st != 413 {
		t.Fatalf("large body: %d %s", st, raw)
	}
	newHarness(r.base(s), "Please fix the bug").step(t)
	st, raw = post(t, r.base(s), map[string]any{"model": "rollout-sim", "messages": []map[string]any{{"role": "user", "content": "again"}}})
	checkError(t, st, raw, 400, "invalid_request_error", nil, nil, "its limit")
	closeSession(t, s)
	if _, err := s.Close(context.Background()); !errors.Is(err, gateway.ErrSession) {
		t.Fatalf("second Close: %v", err)
	}
}

func TestMaxTokensHonoured(t *testing.T) {
	// ExactLength: every generation is exactly its max_tokens long.
	r := newRig(t, sim.Config{ExactLength: true, MaxModelLen: 2048}, capture.Options{Sampling: inference.Sampling{MaxTokens: 20}})
	s := r.open(t)
	for _, tc := range []struct {
		asked any
		want  int
	}{{7, 7}, {nil, 20}, {500, 20}} {
		body := map[string]any{"model": "rollout-sim", "messages": []map[string]any{{"role": "user", "content": fmt.Sprintf("hello %v", tc.asked)}}}
		if tc.asked != nil {
			body["max_completion_tokens"] = tc.asked
		}
		st, raw := post(t, r.base(s), body)
		var c completion
		if err := json.Unmarshal(raw, &c); err != nil || st != 200 {
			t.Fatalf("status %d: %s", st, raw)
		}
		if c.Usage.CompletionTokens != tc.want || c.Choices[0].FinishReason != "length" {
			t.Errorf("asked %v: %d tokens (%s), want %d cut at length", tc.asked, c.Usage.CompletionTokens, c.Choices[0].FinishReason, tc.want)
		}
	}
	closeSession(t, s)
	// No run cap: the room left in the context bounds the reply.
	r = newRig(t, sim.Config{ExactLength: true, MaxModelLen: 600}, capture.Options{Sampling: inference.Sampling{MaxTokens: -1}})
	s = r.open(t)
	st, raw := post(t, r.base(s), map[string]any{"model": "rollout-sim", "max_tokens": 100000, "messages": []map[string]any{{"role": "user", "content": "hello"}}})
	var c completion
	if err := json.Unmarshal(raw, &c); err != nil || st != 200 {
		t.Fatalf("status %d: %s", st, raw)
	}
	if got := c.Usage.PromptTokens + c.Usage.CompletionTokens; got != 600 {
		t.Errorf("prompt %d + reply %d = %d, want the whole context 600", c.Usage.PromptTokens, c.Usage.CompletionTokens, got)
	}
	rec := closeSession(t, s)
	if g := rec.Calls[0].Granted; g != 600-c.Usage.PromptTokens || rec.Calls[0].MaxTokens != 100000 {
		t.Errorf("recorded asked %d granted %d", rec.Calls[0].MaxTokens, g)
	}
}

func TestEngineFaults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults sim.Faults
	}{{"http 500", sim.Faults{ErrorRate: 1}}, {"malformed answer", sim.Faults{MalformedRate: 1}}, {"dropped connection", sim.Faults{DropRate: 1}}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, sim.Config{Faults: tc.faults}, capture.Options{})
			s := r.open(t)
			st, raw := post(t, r.base(s), map[string]any{"model": "rollout-sim", "stream": true, "messages": []map[string]any{{"role": "user", "content": "hi"}}})
			checkError(t, st, raw, 500, "server_error", nil, nil, "upstream engine failure")
			rec := closeSession(t, s)
			if len(rec.Calls) != 1 || rec.Calls[0].Status != gateway.CallError || len(rec.Branches) != 0 {
				t.Fatalf("record %+v", rec)
			}
		})
	}
}

// TestAnchorByRef drives the Completer directly, as a door that carries
// the reply id through the history (Responses item ids, Anthropic
// signatures) does: an echo with other text and no call ids is anchored
// by its Ref alone.
func TestAnchorByRef(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{})
	s := r.open(t)
	var tools []openai.Tool
	if err := json.Unmarshal(terminalTool, &tools); err != nil {
		t.Fatal(err)
	}
	msg := func(role, content string) gateway.Message {
		return gateway.Message{ChatCompletionMessage: openai.ChatCompletionMessage{Role: role, Content: content}}
	}
	hist := []gateway.Message{msg("system", "You are a coding agent."), msg("user", "Please fix the bug")}
	rep, err := r.gw.Complete(context.Background(), s.ID(), gateway.Call{API: "test", Model: "rollout-sim", Messages: hist, Tools: tools})
	if err != nil || len(rep.ToolCalls) != 1 {
		t.Fatalf("reply %+v, %v", rep, err)
	}
	// The echo: rewritten text, the call under an id of the door's own.
	echo := msg("assistant", "(the harness's own rendering)")
	echo.Ref = rep.ID
	echo.ToolCalls = []openai.ToolCall{{ID: "fc_door_own_id", Type: "function", Function: openai.FunctionCall{Name: "terminal", Arguments: `{"command":"ls"}`}}}
	res := msg("tool", "a.txt")
	res.ToolCallID = rep.ToolCalls[0].ID
	hist = append(hist, echo, res)
	if _, err := r.gw.Complete(context.Background(), s.ID(), gateway.Call{API: "test", Model: "rollout-sim", Messages: hist, Tools: tools}); err != nil {
		t.Fatal(err)
	}
	rec := closeSession(t, s)
	if len(rec.Branches) != 1 || rec.Rewritten != 1 || rec.Unanchored != 0 {
		t.Fatalf("%d branches, rewritten %d, unanchored %d", len(rec.Branches), rec.Rewritten, rec.Unanchored)
	}
	if got := rec.Branches[0].Messages[2]; got.Content != rep.Content || got.ToolCalls[0].ID != rep.ToolCalls[0].ID {
		t.Fatalf("the branch holds %+v, not the gateway's reply", got)
	}
	exact(t, rec, r.srv.Generations())
}

// TestPreviousResponse: a Responses-style call that names the previous
// reply (previous_response_id) and sends only the new tool result
// extends that reply's branch with its sampled ids, exactly as if the
// whole history had been sent; an unknown id is the harness's error.
func TestPreviousResponse(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{})
	s := r.open(t)
	var tools []openai.Tool
	if err := json.Unmarshal(terminalTool, &tools); err != nil {
		t.Fatal(err)
	}
	msg := func(role, content string) gateway.Message {
		return gateway.Message{ChatCompletionMessage: openai.ChatCompletionMessage{Role: role, Content: content}}
	}
	sys := msg("system", "You are a coding agent.")
	ctx := context.Background()
	rep, err := r.gw.Complete(ctx, s.ID(), gateway.Call{API: "test", Model: "rollout-sim", Messages: []gateway.Message{sys, msg("user", "Please fix the bug")}, Tools: tools})
	if err != nil || len(rep.ToolCalls) != 1 {
		t.Fatalf("reply %+v, %v", rep, err)
	}
	res := msg("tool", "a.txt")
	res.ToolCallID = rep.ToolCalls[0].ID
	// The instructions again (Responses does not carry them over), then
	// only what is new.
	if _, err := r.gw.Complete(ctx, s.ID(), gateway.Call{API: "test", Model: "rollout-sim", Previous: rep.ID, Messages: []gateway.Message{sys, res}, Tools: tools}); err != nil {
		t.Fatal(err)
	}
	_, err = r.gw.Complete(ctx, s.ID(), gateway.Call{API: "test", Model: "rollout-sim", Previous: "resp-unknown", Messages: []gateway.Message{res}, Tools: tools})
	if !errors.Is(err, gateway.ErrBadRequest) || gateway.Param(err) != "previous_response_id" {
		t.Fatalf("unknown previous id: %v", err)
	}
	rec := closeSession(t, s)
	if len(rec.Branches) != 1 || rec.Unanchored != 0 || rec.Rewritten != 0 {
		t.Fatalf("%d branches, unanchored %d, rewritten %d: %+v", len(rec.Branches), rec.Unanchored, rec.Rewritten, rec.Calls)
	}
	if got := rec.Branches[0].Calls; !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("branch calls %v", got)
	}
	if m := rec.Branches[0].Messages; len(m) != 5 || m[0].Role != "system" || m[2].ToolCalls[0].ID != rep.ToolCalls[0].ID || m[3].Role != "tool" {
		t.Fatalf("branch messages %+v", m)
	}
	exact(t, rec, r.srv.Generations())
}

// TestUnanchoredTurn: an assistant turn the harness invented is history,
// not a reply: rendered (a new branch), counted, never trained.
func TestUnanchoredTurn(t *testing.T) {
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{})
	s := r.open(t)
	h := newHarness(r.base(s), "Please fix the bug")
	h.msgs = append(h.msgs, map[string]any{"role": "assistant", "content": "I will look at the files."}, map[string]any{"role": "user", "content": "Go on."})
	h.step(t)
	rec := closeSession(t, s)
	if rec.Unanchored != 1 || len(rec.Branches) != 1 {
		t.Fatalf("unanchored %d, branches %d", rec.Unanchored, len(rec.Branches))
	}
	exact(t, rec, r.srv.Generations()) // only the one reply is trained
}

// TestIdleExpiry: a session with no call for IdleTimeout is closed by the
// gateway, which hands its record (the call it made, its branch) to
// OnExpire; the harness then gets 404 and Close says the session expired.
// A session closed by its owner never reaches OnExpire.
func TestIdleExpiry(t *testing.T) {
	type expiry struct {
		s   *capture.Session
		rec gateway.SessionRecord
		err error
	}
	got := make(chan expiry, 2)
	r := newRig(t, sim.Config{Scripts: []sim.Script{fixScript}}, capture.Options{IdleTimeout: 300 * time.Millisecond,
		OnExpire: func(s *capture.Session, rec gateway.SessionRecord, err error) { got <- expiry{s, rec, err} }})
	kept := r.open(t)
	closeSession(t, kept)
	s := r.open(t)
	newHarness(r.base(s), "Please fix the bug").step(t)
	e := <-got
	if e.s != s || e.err != nil || len(e.rec.Calls) != 1 || len(e.rec.Branches) != 1 || !s.Expired() {
		t.Fatalf("expired %v (want %v): %d calls, %d branches, %v", e.s.ID(), s.ID(), len(e.rec.Calls), len(e.rec.Branches), e.err)
	}
	st, raw := post(t, r.base(s), map[string]any{"model": "rollout-sim", "messages": []map[string]any{{"role": "user", "content": "again"}}})
	checkError(t, st, raw, 404, "invalid_request_error", nil, "session_not_found", "")
	if _, err := s.Close(context.Background()); !errors.Is(err, gateway.ErrSession) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("Close after expiry: %v", err)
	}
	if r.gw.Sessions() != 0 {
		t.Fatalf("%d sessions open", r.gw.Sessions())
	}
	select {
	case e := <-got:
		t.Fatalf("a session closed by its owner expired too: %s", e.s.ID())
	default:
	}
}

// CallLimit is the one place the per-session call limit is defaulted (the
// runner's harness driver reads it through assemble).
func TestOptionsCallLimit(t *testing.T) {
	if got := (capture.Options{}).CallLimit(); got != capture.DefaultMaxCallsPerSession {
		t.Errorf("unset: %d, want the default %d", got, capture.DefaultMaxCallsPerSession)
	}
	if got := (capture.Options{MaxCallsPerSession: 3}).CallLimit(); got != 3 {
		t.Errorf("set to 3: %d", got)
	}
}
