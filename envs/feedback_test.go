package envs

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/datasets"
	"github.com/rollout-rl/rollout/inference/sim"
)

func asst(s string) openai.ChatCompletionMessage {
	return openai.ChatCompletionMessage{Role: "assistant", Content: s}
}

func TestGuessNumber(t *testing.T) {
	ctx := context.Background()
	e, err := New("guess-number", nil)
	if err != nil {
		t.Fatal(err)
	}
	g := e.(*GuessNumber)
	train, err := e.Items(ctx, "train")
	if err != nil || len(train) != 200 {
		t.Fatalf("train %d %v", len(train), err)
	}
	again, _ := e.Items(ctx, "train")
	eval, _ := e.Items(ctx, "eval")
	if len(eval) != 50 || train[0].Data["target"] != again[0].Data["target"] || train[0].ID == eval[0].ID {
		t.Fatalf("items not stable or splits not distinct: %v %v %v", train[0], again[0], eval[0])
	}
	if _, err := e.Items(ctx, "test"); !errors.Is(err, datasets.ErrInvalid) {
		t.Fatalf("unknown split: %v", err)
	}
	it := datasets.Item{ID: "g1", Data: map[string]any{"target": int64(37)}, Source: "t", Row: 1}
	task, err := e.Task(ctx, it)
	if err != nil || task.Answer != "37" || task.Sandbox != nil || !strings.Contains(task.Messages[1].Content, "Game g1") {
		t.Fatalf("task %+v %v", task, err)
	}
	conv := []openai.ChatCompletionMessage{task.Messages[0], task.Messages[1]}
	for _, c := range []struct {
		reply, want string
		reward      float64
		done        bool
	}{{"50", "Lower.", 0, false}, {"I think 20", "Higher.", 0, false}, {"no idea", "Please answer", -0.1, false}, {"500", "Please answer", -0.1, false}, {"37", "Correct!", 1, true}} {
		conv = append(conv, asst(c.reply))
		fb, err := g.Responder(it).Respond(ctx, 1, conv)
		if err != nil || len(fb.Messages) != 1 || !strings.HasPrefix(fb.Messages[0].Content, c.want) || fb.Reward == nil || *fb.Reward != c.reward || fb.Done != c.done {
			t.Fatalf("%q: %+v %v", c.reply, fb, err)
		}
		conv = append(conv, fb.Messages...)
	}
	s, err := e.Reward(ctx, it, Outcome{Messages: conv}, nil)
	if err != nil || s.Value != 0.8 || s.Components["solved"] != 1 || s.Components["invalid_guesses"] != 2 || s.Components["guesses"] != 5 {
		t.Fatalf("reward %+v %v", s, err)
	}
	s, _ = e.Reward(ctx, it, Outcome{Messages: conv[:6]}, nil)
	if s.Value != 0 || s.Components["solved"] != 0 {
		t.Fatalf("unsolved reward %+v", s)
	}
	if _, err := e.Task(ctx, datasets.Item{Data: map[string]any{"target": 3.5}}); !errors.Is(err, datasets.ErrInvalid) {
		t.Fatalf("fractional target: %v", err)
	}
	// The reference solution is a binary search ending on the target.
	for _, it := range train[:50] {
		raw, ok := g.Solution(it)
		if !ok {
			t.Fatal("no solution")
		}
		var sc sim.Script
		if err := json.Unmarshal(raw, &sc); err != nil {
			t.Fatal(err)
		}
		tgt, _ := g.target(it)
		if len(sc.Steps) == 0 || len(sc.Steps) > 7 || sc.Steps[len(sc.Steps)-1].Final != task2str(tgt) || len(sc.Wrong) == 0 {
			t.Fatalf("target %d: solution %+v", tgt, sc)
		}
	}
	for _, bad := range []string{"min: 5\nmax: 5\n", "max_turns: 0\n", "turn_penalty: -1\n", "nope: 1\n"} {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(bad), &n); err != nil {
			t.Fatal(err)
		}
		if _, err := New("guess-number", n.Content[0]); !errors.Is(err, ErrConfig) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func task2str(n int) string { b, _ := json.Marshal(n); return string(b) }

func loadYAMLEnv(t *testing.T, body string) (*YAMLEnv, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "env.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return LoadFile(p)
}

func TestScriptedResponder(t *testing.T) {
	ctx := context.Background()
	e, err := loadYAMLEnv(t, `name: capital-quiz
prompt: "What is the capital of {{.country}}?"
items:
  - {country: France, capital: Paris}
rewards:
  - type: format
    regex: "."
responder:
  scripted:
    rules:
      - match: "(?i){{.capital}}"
        reply: "Right, {{.match}} it is (turn {{.turn}})."
        done: true
        reward: 1
      - match: "(?i)i don't know"
        reward: -0.5
    otherwise: "No. Think about {{.country}} again."
    otherwise_reward: 0
`)
	if err != nil {
		t.Fatal(err)
	}
	items, _ := e.Items(ctx, "")
	it := items[0]
	r := ResponderOf(e, it)
	if r == nil {
		t.Fatal("no responder")
	}
	fb, err := r.Respond(ctx, 1, []openai.ChatCompletionMessage{asst("Lyon?")})
	if err != nil || fb.Done || fb.Messages[0].Content != "No. Think about France again." || fb.Reward == nil || *fb.Reward != 0 || fb.Detail != "otherwise" {
		t.Fatalf("otherwise: %+v %v", fb, err)
	}
	fb, _ = r.Respond(ctx, 2, []openai.ChatCompletionMessage{asst("I don't know")})
	if fb.Done || len(fb.Messages) != 0 || *fb.Reward != -0.5 || fb.Detail != "rule 1" {
		t.Fatalf("rule 1: %+v", fb)
	}
	fb, _ = r.Respond(ctx, 3, []openai.ChatCompletionMessage{asst("It is PARIS.")})
	if !fb.Done || fb.Messages[0].Content != "Right, PARIS it is (turn 3)." || *fb.Reward != 1 {
		t.Fatalf("rule 0: %+v", fb)
	}
	// A YAML env without a responder block has none.
	plain, err := loadYAMLEnv(t, "name: x\nprompt: p\nitems: [{a: 1}]\nrewards: [{type: format}]\n")
	if err != nil || ResponderOf(plain, datasets.Item{}) != nil {
		t.Fatalf("plain env: %v", err)
	}
	if ResponderOf(&ToolCallMatch{}, datasets.Item{}) != nil {
		t.Fatal("toolcall-match has a responder")
	}
	head := "name: x\nprompt: p\nitems: [{a: 1}]\nrewards: [{type: format}]\n"
	for _, b := range []struct{ body, want string }{
		{"responder: {}\n", "give scripted or user_simulator"},
		{"responder: {scripted: {}}\n", "at least one rule"},
		{"responder: {scripted: {rules: [{match: '('}]}}\n", "rules[0].match"},
		{"responder: {scripted: {rules: [{match: 'a'}]}}\n", "give reply, done or reward"},
		{"responder: {scripted: {rules: [{match: 'a', reply: '{{.x'}]}}\n", "rules[0].reply"},
		{"responder: {scripted: {rules: [{match: 'a', done: true}], otherwise_reward: .nan}}\n", "otherwise_reward"},
		{"responder: {user_simulator: {model: m, system: s}}\n", "base_url and model"},
		{"responder: {user_simulator: {base_url: 'http://x', model: m}}\n", "system"},
		{"responder: {user_simulator: {base_url: 'http://x', model: m, system: s, api_key_env: ROLLOUT_TEST_UNSET_KEY}}\n", "is empty"},
		{"responder: {scripted: {otherwise: x}, user_simulator: {base_url: 'http://x', model: m, system: s}}\n", "not both"},
		{"responder: {scripted: {otherwise: x, extra: 1}}\n", "extra"},
	} {
		if _, err := loadYAMLEnv(t, head+b.body); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%q: err = %v, want %q", b.body, err, b.want)
		}
	}
	// A per-item pattern that does not compile is the item's fault.
	e, _ = loadYAMLEnv(t, head+"responder: {scripted: {rules: [{match: '{{.a}}(', done: true}]}}\n")
	items, _ = e.Items(ctx, "")
	if _, err := ResponderOf(e, items[0]).Respond(ctx, 1, []openai.ChatCompletionMessage{asst("1")}); !errors.Is(err, datasets.ErrInvalid) {
		t.Fatalf("bad rendered pattern: %v", err)
	}
}

func TestUserSimulatorResponder(t *testing.T) {
	ctx := context.Background()
	srv, err := sim.Start(ctx, sim.Config{Family: "hermes", Scripts: []sim.Script{{Match: "Which city do you want to fly to",
		// The simulator picks a step by the number of assistant messages
		// in its prompt: the task's opening line is the first.
		Steps: []sim.Step{{Final: "(not used)"}, {Final: "Paris, on Friday please."}, {Final: "Thanks, that's all. [DONE]"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	e, err := loadYAMLEnv(t, `name: travel-desk
prompt: "Hi, I need a flight."
items: [{persona: "a traveller going to Paris on Friday"}]
rewards: [{type: format, regex: "."}]
responder:
  user_simulator:
    base_url: `+srv.URL+`
    model: rollout-sim
    system: "You are {{.persona}}. Answer the agent briefly; say [DONE] when your flight is booked."
    done_marker: "[DONE]"
`)
	if err != nil {
		t.Fatal(err)
	}
	r := e.resp.(*userSim)
	defer r.policy.(io.Closer).Close()
	items, _ := e.Items(ctx, "")
	conv := []openai.ChatCompletionMessage{{Role: "system", Content: "You are a travel agent."}, {Role: "user", Content: "Hi, I need a flight."},
		asst("Which city do you want to fly to?")}
	fb, err := r.respond(ctx, items[0], 1, conv)
	if err != nil || fb.Done || len(fb.Messages) != 1 || fb.Messages[0].Content != "Paris, on Friday please." || fb.Messages[0].Role != "user" {
		t.Fatalf("turn 1: %+v %v", fb, err)
	}
	conv = append(conv, fb.Messages[0], asst("Booked: Paris, Friday 9:00."))
	fb, err = r.respond(ctx, items[0], 2, conv)
	if err != nil || !fb.Done || fb.Messages[0].Content != "Thanks, that's all." {
		t.Fatalf("turn 2: %+v %v", fb, err)
	}
	// The simulated user saw the roles swapped, behind its own system prompt.
	got := swapRoles("S", conv)
	want := "system,assistant,user,assistant,user"
	var rs []string
	for _, m := range got {
		rs = append(rs, m.Role)
	}
	if strings.Join(rs, ",") != want || got[1].Content != "Hi, I need a flight." || got[2].Content != "Which city do you want to fly to?" {
		t.Fatalf("swapped %s %+v", strings.Join(rs, ","), got)
	}
	// A tool-only turn leaves nothing to answer.
	fb, err = r.respond(ctx, items[0], 3, append(conv, openai.ChatCompletionMessage{Role: "assistant", ToolCalls: []openai.ToolCall{{ID: "c", Type: "function"}}}))
	if err != nil || len(fb.Messages) != 0 || fb.Done {
		t.Fatalf("tool turn: %+v %v", fb, err)
	}
	// An unreachable endpoint is an error (a failed rollout), never a reply.
	dead, err := loadYAMLEnv(t, `name: dead
prompt: p
items: [{a: 1}]
rewards: [{type: format}]
responder: {user_simulator: {base_url: "http://127.0.0.1:1", model: m, system: s, timeout: 2s}}
`)
	if err != nil {
		t.Fatal(err)
	}
	du := dead.resp.(*userSim)
	defer du.policy.(io.Closer).Close()
	if _, err := du.respond(ctx, items[0], 1, conv); !errors.Is(err, ErrUserSim) {
		t.Fatalf("dead endpoint: %v", err)
	}
}

func TestAgenticOPDConfigAndScoring(t *testing.T) {
	e, err := New("agentic-opd", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ResponderOf(e, datasets.Item{}) != nil || e.(Distilled).Teacher() != nil {
		t.Fatal("agentic-opd without config has a responder or a teacher")
	}
	for _, c := range []struct {
		turns, max int
		want       float64
	}{{3, 15, 1}, {7, 15, 0.8}, {11, 15, 0.5}, {12, 15, 0.2}} {
		if got := opdEfficiency(c.turns, c.max); got != c.want {
			t.Errorf("efficiency(%d, %d) = %v, want %v", c.turns, c.max, got, c.want)
		}
	}
	call := func(names ...string) Outcome {
		m := openai.ChatCompletionMessage{Role: "assistant"}
		for _, n := range names {
			m.ToolCalls = append(m.ToolCalls, openai.ToolCall{Function: openai.FunctionCall{Name: n}})
		}
		return Outcome{Messages: []openai.ChatCompletionMessage{m}}
	}
	for _, c := range []struct {
		names []string
		want  float64
	}{{[]string{"terminal", "patch"}, 1}, {[]string{"terminal"}, 0.6}, {[]string{"read_file"}, 0.3}, {nil, 0}} {
		if got := opdToolUsage(call(c.names...)); got != c.want {
			t.Errorf("tool usage %v = %v, want %v", c.names, got, c.want)
		}
	}
	for _, bad := range []string{"hints: yes please\n", "teacher: {model: m}\n", "max_turns: -1\n"} {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(bad), &n); err != nil {
			t.Fatal(err)
		}
		if _, err := New("agentic-opd", n.Content[0]); !errors.Is(err, ErrConfig) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	var n yaml.Node
	_ = yaml.Unmarshal([]byte("teacher: {endpoint: 'http://t:8000', model: teacher, top_k: 8}\n"), &n)
	e, err = New("agentic-opd", n.Content[0])
	if err != nil || e.(Distilled).Teacher().TopK != 8 {
		t.Fatalf("teacher config: %v", err)
	}
	if e.(Hinted).DistillHints() {
		t.Error("hints on without hints: true")
	}
	_ = yaml.Unmarshal([]byte("hints: true\n"), &n)
	if e, err = New("agentic-opd", n.Content[0]); err != nil || !e.(Hinted).DistillHints() {
		t.Fatalf("hints: true: %v", err)
	}
}
