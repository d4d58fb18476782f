package agentloop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/tools"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if itDocker != nil {
		if err := itDocker.Close(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "close docker backend:", err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// step produces one generation.
type step func(ctx context.Context, msgs []openai.ChatCompletionMessage) (inference.Turn, error)

// scriptPolicy is a unit-test fake of inference.Policy.
type scriptPolicy struct {
	steps    []step
	finished bool
	mu       sync.Mutex
}

type scriptEpisode struct {
	p *scriptPolicy
	n int
}

func (p *scriptPolicy) Start(ctx context.Context, spec inference.EpisodeSpec) (inference.Episode, error) {
	return &scriptEpisode{p: p}, nil
}

func (e *scriptEpisode) Generate(ctx context.Context, msgs []openai.ChatCompletionMessage) (inference.Turn, error) {
	i := e.n
	e.n++
	if i >= len(e.p.steps) {
		return inference.Turn{Parsed: true, Content: "done"}, nil
	}
	return e.p.steps[i](ctx, msgs)
}

func (e *scriptEpisode) Finish(ctx context.Context, msgs []openai.ChatCompletionMessage) (inference.Sequence, error) {
	e.p.mu.Lock()
	e.p.finished = true
	e.p.mu.Unlock()
	return inference.Sequence{Tokens: []int32{1, 2, 3}, Mask: []int8{0, 1, 1}, Logprobs: []float32{1, -0.5, -0.1}}, nil
}

func calls(cs ...[2]string) step {
	return func(context.Context, []openai.ChatCompletionMessage) (inference.Turn, error) {
		t := inference.Turn{Parsed: true, Reasoning: "thinking", FinishReason: "tool_calls"}
		for i, c := range cs {
			t.ToolCalls = append(t.ToolCalls, openai.ToolCall{ID: fmt.Sprintf("c%d", i), Type: "function", Function: openai.FunctionCall{Name: c[0], Arguments: c[1]}})
		}
		return t, nil
	}
}

func final(s string) step {
	return func(context.Context, []openai.ChatCompletionMessage) (inference.Turn, error) {
		return inference.Turn{Parsed: true, Content: s, FinishReason: "stop"}, nil
	}
}

func fail(err error) step {
	return func(context.Context, []openai.ChatCompletionMessage) (inference.Turn, error) {
		return inference.Turn{}, err
	}
}

func block(started chan<- struct{}) step {
	return func(ctx context.Context, _ []openai.ChatCompletionMessage) (inference.Turn, error) {
		close(started)
		<-ctx.Done()
		return inference.Turn{}, fmt.Errorf("generate: %w", ctx.Err())
	}
}

// memSandbox is a unit-test fake: it keeps written files in memory and
// accepts mkdir; everything else is unavailable.
type memSandbox struct {
	mu    sync.Mutex
	files map[string][]byte
}

var _ sandbox.Sandbox = (*memSandbox)(nil)

func (m *memSandbox) ID() string { return "mem" }
func (m *memSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	if len(req.Argv) > 0 && req.Argv[0] == "mkdir" {
		return sandbox.ExecResult{}, nil
	}
	return sandbox.ExecResult{}, sandbox.ErrUnavailable
}
func (m *memSandbox) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.files == nil {
		m.files = map[string][]byte{}
	}
	m.files[p] = data
	return nil
}
func (m *memSandbox) ReadFile(ctx context.Context, p string) ([]byte, error) {
	return nil, sandbox.ErrNotFound
}
func (m *memSandbox) Upload(context.Context, string, io.Reader) error { return sandbox.ErrUnavailable }
func (m *memSandbox) Download(context.Context, string, io.Writer) error {
	return sandbox.ErrUnavailable
}
func (m *memSandbox) Start(context.Context, sandbox.ExecRequest) (sandbox.ProcessInfo, error) {
	return sandbox.ProcessInfo{}, sandbox.ErrUnavailable
}
func (m *memSandbox) Poll(context.Context, string) (sandbox.ProcessInfo, error) {
	return sandbox.ProcessInfo{}, sandbox.ErrUnavailable
}
func (m *memSandbox) Wait(context.Context, string, time.Duration) (sandbox.ProcessInfo, error) {
	return sandbox.ProcessInfo{}, sandbox.ErrUnavailable
}
func (m *memSandbox) Kill(context.Context, string) error                       { return sandbox.ErrUnavailable }
func (m *memSandbox) WriteStdin(context.Context, string, []byte) error         { return sandbox.ErrUnavailable }
func (m *memSandbox) Processes(context.Context) ([]sandbox.ProcessInfo, error) { return nil, nil }
func (m *memSandbox) Close(context.Context) error                              { return nil }

// testTools registers in-memory tools.
type testTools struct {
	mu      sync.Mutex
	order   []string
	barrier *sync.WaitGroup // read-only calls wait here for each other
	toolRun chan struct{}   // closed when "hang" starts
}

func (tt *testTools) set(t *testing.T) *tools.Set {
	r := tools.NewRegistry()
	obj := `{"type":"object","properties":{"path":{"type":"string"},"n":{"type":"integer"}},"required":["path"]}`
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	note := func(s string) {
		tt.mu.Lock()
		tt.order = append(tt.order, s)
		tt.mu.Unlock()
	}
	must(r.Register(tools.Tool{Name: "look", Toolset: "t", Class: tools.ReadOnly, Parameters: []byte(obj),
		Paths: func(a tools.Args) []string { return []string{a.String("path", "")} },
		Handler: func(ctx context.Context, rt *tools.Runtime, a tools.Args) (string, error) {
			if tt.barrier != nil {
				tt.barrier.Done()
				done := make(chan struct{})
				go func() { tt.barrier.Wait(); close(done) }()
				select {
				case <-done:
				case <-ctx.Done():
					return "", ctx.Err()
				}
			}
			note("look " + a.String("path", ""))
			return `{"content":"` + a.String("path", "") + `"}`, nil
		}}))
	must(r.Register(tools.Tool{Name: "put", Toolset: "t", Class: tools.PathScoped, Parameters: []byte(obj),
		Paths: func(a tools.Args) []string { return []string{a.String("path", "")} },
		Handler: func(ctx context.Context, rt *tools.Runtime, a tools.Args) (string, error) {
			note("put " + a.String("path", ""))
			return `{"ok":true}`, nil
		}}))
	must(r.Register(tools.Tool{Name: "big", Toolset: "t", Parameters: []byte(obj),
		Handler: func(ctx context.Context, rt *tools.Runtime, a tools.Args) (string, error) {
			return strings.Repeat("x", a.Int("n", 0)), nil
		}}))
	must(r.Register(tools.Tool{Name: "boom", Toolset: "t",
		Handler: func(ctx context.Context, rt *tools.Runtime, a tools.Args) (string, error) {
			return "", errors.New("disk on fire")
		}}))
	must(r.Register(tools.Tool{Name: "dead", Toolset: "t",
		Handler: func(ctx context.Context, rt *tools.Runtime, a tools.Args) (string, error) {
			return "", fmt.Errorf("exec: %w", sandbox.ErrUnavailable)
		}}))
	must(r.Register(tools.Tool{Name: "hang", Toolset: "t",
		Handler: func(ctx context.Context, rt *tools.Runtime, a tools.Args) (string, error) {
			close(tt.toolRun)
			<-ctx.Done()
			return "", ctx.Err()
		}}))
	s, err := r.Resolve(nil, nil)
	must(err)
	return s
}

func run(t *testing.T, ctx context.Context, cfg Config, tt *testTools, steps ...step) (Result, error, *scriptPolicy, *memSandbox) {
	t.Helper()
	if tt == nil {
		tt = &testTools{}
	}
	p := &scriptPolicy{steps: steps}
	sb := &memSandbox{}
	if cfg.Messages == nil {
		cfg.Messages = []openai.ChatCompletionMessage{{Role: "user", Content: "task"}}
	}
	cfg.Tools = tt.set(t)
	cfg.ID = "r1"
	res, err := Run(ctx, cfg, Deps{Policy: p, Runtime: tools.NewRuntime(sb, "r1")})
	return res, err, p, sb
}

func TestFinishedNaturally(t *testing.T) {
	in := []openai.ChatCompletionMessage{{Role: "system", Content: "sys"}, {Role: "user", Content: "task"}}
	res, err, p, _ := run(t, context.Background(), Config{Messages: in}, nil,
		calls([2]string{"look", `{"path":"a"}`}, [2]string{"put", `{"path":"b"}`}),
		final("all done"))
	if err != nil || res.StopReason != StopFinished || !res.FinishedNaturally || res.TurnsUsed != 2 {
		t.Fatalf("stop %s err %v turns %d", res.StopReason, err, res.TurnsUsed)
	}
	roles := []string{}
	for _, m := range res.Messages {
		roles = append(roles, m.Role)
	}
	if strings.Join(roles, ",") != "system,user,assistant,tool,tool,assistant" {
		t.Fatalf("roles %v", roles)
	}
	if res.Messages[2].ReasoningContent != "thinking" || len(res.Messages[2].ToolCalls) != 2 {
		t.Fatalf("assistant %+v", res.Messages[2])
	}
	if res.Messages[3].ToolCallID != "c0" || res.Messages[3].Content != `{"content":"a"}` || res.Messages[4].ToolCallID != "c1" {
		t.Fatalf("tool messages out of order: %+v", res.Messages[3:5])
	}
	if res.Messages[5].Content != "all done" || len(in) != 2 {
		t.Fatal("final message or caller's slice changed")
	}
	if !p.finished || len(res.Sequence.Tokens) != 3 {
		t.Fatal("Finish not called")
	}
	if len(res.ReasoningPerTurn) != 2 || *res.ReasoningPerTurn[0] != "thinking" || res.ReasoningPerTurn[1] != nil {
		t.Fatalf("reasoning %v", res.ReasoningPerTurn)
	}
	if res.Counters.ToolCalls != 2 || len(res.Turns) != 2 || res.Turns[0].ToolCalls != 2 {
		t.Fatalf("counters %+v turns %+v", res.Counters, res.Turns)
	}
}

func TestParallelReadOnly(t *testing.T) {
	var wg sync.WaitGroup
	wg.Add(3)
	tt := &testTools{barrier: &wg}
	// Each look waits until all three have started: this finishes only if
	// they run at the same time (sequential runs would hit the timeout).
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err, _, _ := run(t, ctx, Config{}, tt,
		calls([2]string{"look", `{"path":"a"}`}, [2]string{"look", `{"path":"b"}`}, [2]string{"look", `{"path":"a"}`}))
	if err != nil || res.StopReason != StopFinished || !res.Turns[0].Parallel || res.Counters.ParallelTurns != 1 {
		t.Fatalf("stop %s err %v turns %+v", res.StopReason, err, res.Turns)
	}
	for i, want := range []string{"a", "b", "a"} {
		if res.Messages[2+i].Content != `{"content":"`+want+`"}` {
			t.Fatalf("result %d out of call order: %s", i, res.Messages[2+i].Content)
		}
	}
}

func TestScheduling(t *testing.T) {
	mk := func(name, p string) *slot {
		set := (&testTools{}).set(t)
		c, err := set.Prepare("id", name, `{"path":"`+p+`"}`)
		if err != nil {
			t.Fatal(err)
		}
		return &slot{call: c}
	}
	cases := []struct {
		name  string
		calls []*slot
		want  bool
	}{
		{"reads", []*slot{mk("look", "a"), mk("look", "a")}, true},
		{"disjoint writes", []*slot{mk("put", "/w/a"), mk("put", "/w/b"), mk("look", "/w/c")}, true},
		{"same write", []*slot{mk("put", "a"), mk("put", "a")}, false},
		{"read under written dir", []*slot{mk("put", "/w"), mk("look", "/w/x")}, false},
		{"relative vs absolute", []*slot{mk("put", "a"), mk("look", "/w/a")}, false},
		{"exclusive", []*slot{mk("look", "a"), {call: mustPrepare(t, "big", `{"path":"x"}`)}}, false},
	}
	for _, tc := range cases {
		if got := canRunTogether(tc.calls); got != tc.want {
			t.Errorf("%s: got %v", tc.name, got)
		}
	}
}

func mustPrepare(t *testing.T, name, args string) *tools.Call {
	c, err := (&testTools{}).set(t).Prepare("id", name, args)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestInvalidCalls(t *testing.T) {
	res, err, _, _ := run(t, context.Background(), Config{}, nil,
		calls([2]string{"nope", `{}`}, [2]string{"look", `{"path": "a"`}, [2]string{"look", `[1]`}, [2]string{"look", `{"n": 1}`}, [2]string{"boom", `{}`}),
		final("ok"))
	if err != nil || res.StopReason != StopFinished {
		t.Fatalf("stop %s err %v", res.StopReason, err)
	}
	want := []string{
		`{"error":"Unknown tool 'nope'. Available tools: ['big', 'boom', 'dead', 'hang', 'look', 'put']"}`,
		`{"error":"Invalid JSON in tool arguments: unexpected EOF. Please retry with valid JSON."}`,
		`{"error":"Invalid tool arguments: expected a JSON object, got a JSON array. Please retry with the arguments as a JSON object."}`,
		"", // schema message checked below
		`{"error":"Tool execution failed: disk on fire"}`,
	}
	for i, w := range want {
		got := res.Messages[2+i].Content
		if w != "" && got != w {
			t.Errorf("call %d: got %s want %s", i, got, w)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("call %d: not JSON: %s", i, got)
		}
	}
	if !strings.Contains(res.Messages[5].Content, "Invalid arguments for look") {
		t.Errorf("schema: %s", res.Messages[5].Content)
	}
	kinds := []string{}
	for _, te := range res.ToolErrors {
		kinds = append(kinds, te.Kind)
		if te.Turn != 1 {
			t.Errorf("turn %d", te.Turn)
		}
	}
	if strings.Join(kinds, ",") != "unknown_tool,invalid_json,not_object,schema,execution" {
		t.Fatalf("tool errors %v", kinds)
	}
}

func TestConsecutiveInvalidStops(t *testing.T) {
	bad := calls([2]string{"nope", `{}`}, [2]string{"nope", `{}`})
	res, err, _, _ := run(t, context.Background(), Config{MaxConsecutiveInvalid: 5}, nil, bad, bad, bad, final("never"))
	if err != nil || res.StopReason != StopInvalidCalls || res.TurnsUsed != 3 || res.Counters.InvalidCalls != 6 {
		t.Fatalf("stop %s err %v turns %d counters %+v", res.StopReason, err, res.TurnsUsed, res.Counters)
	}
	// A valid call resets the count.
	mixed := calls([2]string{"nope", `{}`}, [2]string{"nope", `{}`}, [2]string{"look", `{"path":"a"}`})
	res, _, _, _ = run(t, context.Background(), Config{MaxConsecutiveInvalid: 3}, nil, mixed, mixed, mixed, final("fine"))
	if res.StopReason != StopFinished {
		t.Fatalf("stop %s", res.StopReason)
	}
}

func TestMaxTurnsAndWarnings(t *testing.T) {
	loop := calls([2]string{"look", `{"path":"a"}`})
	steps := []step{}
	for i := 0; i < 20; i++ {
		steps = append(steps, loop)
	}
	res, err, _, _ := run(t, context.Background(), Config{MaxTurns: 10, BudgetWarnings: true}, nil, steps...)
	if err != nil || res.StopReason != StopMaxTurns || res.TurnsUsed != 10 || res.FinishedNaturally {
		t.Fatalf("stop %s err %v turns %d", res.StopReason, err, res.TurnsUsed)
	}
	last := res.Messages[len(res.Messages)-1]
	if last.Role != "tool" {
		t.Fatalf("last message %s", last.Role)
	}
	var warnings []string
	for _, m := range res.Messages {
		if strings.Contains(m.Content, "_budget_warning") {
			var v map[string]any
			if err := json.Unmarshal([]byte(m.Content), &v); err != nil {
				t.Fatalf("warning broke JSON: %s", m.Content)
			}
			warnings = append(warnings, v["_budget_warning"].(string))
		}
	}
	if len(warnings) != 2 || !strings.Contains(warnings[0], "7 of 10") || !strings.Contains(warnings[1], "9 of 10") {
		t.Fatalf("warnings %v", warnings)
	}
	res, _, _, _ = run(t, context.Background(), Config{MaxTurns: 10}, nil, steps...)
	for _, m := range res.Messages {
		if strings.Contains(m.Content, "Budget warning") {
			t.Fatal("warnings are off by default")
		}
	}
}

func TestGenerationErrors(t *testing.T) {
	cases := []struct {
		err    error
		reason StopReason
		class  error
	}{
		{fmt.Errorf("prompt 40000 > 32768: %w", inference.ErrContextLength), StopContextLength, nil},
		{fmt.Errorf("503: %w", inference.ErrInfra), StopInferenceErr, inference.ErrInfra},
		{fmt.Errorf("400: %w", inference.ErrRequest), StopRequestErr, inference.ErrRequest},
		{errors.New("weird"), StopInferenceErr, inference.ErrInfra},
	}
	for _, tc := range cases {
		res, err, _, _ := run(t, context.Background(), Config{}, nil, calls([2]string{"look", `{"path":"a"}`}), fail(tc.err))
		if res.StopReason != tc.reason || res.TurnsUsed != 2 || res.FinishedNaturally {
			t.Errorf("%v: stop %s turns %d", tc.err, res.StopReason, res.TurnsUsed)
		}
		if tc.class == nil && err != nil || tc.class != nil && !errors.Is(err, tc.class) {
			t.Errorf("%v: err %v", tc.err, err)
		}
	}
}

func TestSandboxFailure(t *testing.T) {
	res, err, _, _ := run(t, context.Background(), Config{}, nil, calls([2]string{"dead", `{}`}), final("never"))
	if res.StopReason != StopSandboxErr || !errors.Is(err, sandbox.ErrUnavailable) || !res.StopReason.Failed() {
		t.Fatalf("stop %s err %v", res.StopReason, err)
	}
}

func TestCancellation(t *testing.T) {
	t.Run("mid-generation", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan struct{})
		go func() { <-started; cancel() }()
		res, err, p, _ := run(t, ctx, Config{}, nil, block(started))
		if res.StopReason != StopCancelled || !errors.Is(err, context.Canceled) || p.finished {
			t.Fatalf("stop %s err %v", res.StopReason, err)
		}
	})
	t.Run("mid-tool", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		tt := &testTools{toolRun: make(chan struct{})}
		go func() { <-tt.toolRun; cancel() }()
		res, err, _, _ := run(t, ctx, Config{}, tt, calls([2]string{"hang", `{}`}))
		if res.StopReason != StopCancelled || !errors.Is(err, context.Canceled) {
			t.Fatalf("stop %s err %v", res.StopReason, err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		started := make(chan struct{})
		res, err, p, _ := run(t, context.Background(), Config{Timeout: 50 * time.Millisecond}, nil, block(started))
		if res.StopReason != StopTimeout || err != nil || !p.finished {
			t.Fatalf("stop %s err %v finished %v", res.StopReason, err, p.finished)
		}
	})
}

func TestResultBudgetSpill(t *testing.T) {
	res, err, _, sb := run(t, context.Background(), Config{}, nil,
		calls([2]string{"big", `{"path":"x","n":150000}`}, [2]string{"big", `{"path":"x","n":10}`}))
	if err != nil {
		t.Fatal(err)
	}
	got := res.Messages[2].Content
	if !strings.HasPrefix(got, "<persisted-output>") || !strings.Contains(got, "/tmp/hermes-results/c0.txt") {
		t.Fatalf("not spilled: %.200s", got)
	}
	if len(sb.files["/tmp/hermes-results/c0.txt"]) != 150000 || res.Counters.SpilledResults != 1 {
		t.Fatalf("spill file missing; counters %+v", res.Counters)
	}
	if res.Messages[3].Content != "xxxxxxxxxx" {
		t.Fatal("small result changed")
	}
}

func TestConfigErrors(t *testing.T) {
	_, err := Run(context.Background(), Config{}, Deps{Policy: &scriptPolicy{}})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("no messages: %v", err)
	}
	_, err = Run(context.Background(), Config{Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "x"}}, Parser: "no-such-parser"}, Deps{Policy: &scriptPolicy{}})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("bad parser: %v", err)
	}
}

func text(s string) step {
	return func(context.Context, []openai.ChatCompletionMessage) (inference.Turn, error) {
		return inference.Turn{Text: s, CompletionIDs: []int32{1}, Logprobs: []float32{-1}}, nil
	}
}

func TestTokensModeParsing(t *testing.T) {
	out := "<think>\nplan it\n</think>\n\nI will look.\n<tool_call>\n{\"name\": \"look\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>\n" +
		"<tool_call>\n{\"name\": \"look\", \"arguments\": {\"path\": \n</tool_call>\n<tool_call>\n{\"name\": \"put\", \"arguments\": {\"path\": \"b\"}}\n</tool_call>"
	res, err, _, _ := run(t, context.Background(), Config{Parser: "hermes", ReasoningParser: "qwen3"}, nil, text(out), text("finished."))
	if err != nil || res.StopReason != StopFinished {
		t.Fatalf("stop %s err %v", res.StopReason, err)
	}
	a := res.Messages[1]
	if a.Content != "I will look." || a.ReasoningContent == "" || !strings.Contains(a.ReasoningContent, "plan it") || len(a.ToolCalls) != 2 {
		t.Fatalf("assistant %+v", a)
	}
	// Results follow the order the model wrote the calls, the malformed
	// one included.
	if res.Messages[2].ToolCallID != a.ToolCalls[0].ID || !strings.Contains(res.Messages[3].Content, "Could not parse tool call 1 (look)") ||
		res.Messages[4].ToolCallID != a.ToolCalls[1].ID {
		t.Fatalf("order: %+v", res.Messages[2:5])
	}
	if len(res.ToolErrors) != 1 || res.ToolErrors[0].Kind != tools.InvalidParse || res.ToolErrors[0].CallID != res.Messages[3].ToolCallID {
		t.Fatalf("tool errors %+v", res.ToolErrors)
	}
	// Tools offered, text returned, no parser configured: a clear error.
	res, err, _, _ = run(t, context.Background(), Config{}, nil, text(out))
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("missing parser: %v (%s)", err, res.StopReason)
	}
}

func TestChatModeTextFallback(t *testing.T) {
	content := "<tool_call>\n{\"name\": \"look\", \"arguments\": {\"path\": \"z\"}}\n</tool_call>"
	res, err, _, _ := run(t, context.Background(), Config{Parser: "hermes"}, nil, final(content), final("ok"))
	if err != nil || len(res.Messages[1].ToolCalls) != 1 || res.Messages[2].Content != `{"content":"z"}` {
		t.Fatalf("fallback: %v %+v", err, res.Messages)
	}
}

func TestConfigErrorStopReason(t *testing.T) {
	res, err := Run(context.Background(), Config{}, Deps{Policy: &scriptPolicy{}})
	if res.StopReason != StopConfigErr || !res.StopReason.Failed() || !errors.Is(err, ErrConfig) {
		t.Fatalf("%s %v", res.StopReason, err)
	}
}

// An episode that ends well but whose caller is cancelled before the token
// sequence is taken is not an ok episode: without its tokens it would be
// silently wrong training data.
func TestCancelledBeforeFinish(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	answer := func(context.Context, []openai.ChatCompletionMessage) (inference.Turn, error) {
		cancel() // the run is stopped while this last turn is in flight
		return inference.Turn{Parsed: true, Content: "done", FinishReason: "stop"}, nil
	}
	res, _, _, _ := run(t, ctx, Config{}, nil, answer)
	if res.StopReason != StopCancelled || !res.StopReason.Failed() {
		t.Fatalf("stop %s: an episode without its sequence passed as ok", res.StopReason)
	}
}
