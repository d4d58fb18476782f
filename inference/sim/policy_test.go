package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/parsers"
)

type chatResp struct {
	Choices []struct {
		Message struct {
			Content   *string `json:"content"`
			Reasoning *string `json:"reasoning"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
		TokenIDs     []int  `json:"token_ids"`
	} `json:"choices"`
}

// runEpisode drives the chat route like an agent loop and returns one line
// per assistant turn: "call name args; ..." or "final: content".
func runEpisode(t *testing.T, url, user string, seed int64, tools string) []string {
	t.Helper()
	msgs := []any{map[string]any{"role": "user", "content": user}}
	var turns []string
	for range 8 {
		req := map[string]any{"messages": msgs}
		if seed >= 0 {
			req["seed"] = seed
		}
		if tools != "" {
			req["tools"] = json.RawMessage(tools)
		}
		status, b := post(t, url+"/v1/chat/completions", mustJSON(t, req))
		if status != 200 {
			t.Fatalf("chat status %d: %s", status, b)
		}
		r := decode[chatResp](t, b)
		m := r.Choices[0].Message
		if len(m.ToolCalls) == 0 {
			// Reasoning models put "\n\n" after </think>; vLLM keeps it.
			turns = append(turns, "final: "+strings.TrimLeft(deref(m.Content), "\n"))
			return turns
		}
		var parts []string
		var calls []any
		for i, tc := range m.ToolCalls {
			parts = append(parts, tc.Function.Name+" "+tc.Function.Arguments)
			calls = append(calls, map[string]any{"id": fmt.Sprintf("call%02d%03d", len(turns), i), "type": "function",
				"function": map[string]any{"name": tc.Function.Name, "arguments": tc.Function.Arguments}})
		}
		turns = append(turns, strings.Join(parts, "; "))
		msgs = append(msgs, map[string]any{"role": "assistant", "content": m.Content, "tool_calls": calls})
		for i := range calls {
			msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": fmt.Sprintf("call%02d%03d", len(turns)-1, i), "content": "ok"})
		}
	}
	t.Fatalf("episode did not finish: %v", turns)
	return nil
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

var fixScript = Script{
	Match: "fix the bug",
	Steps: []Step{
		{ToolCalls: []Call{{Name: "read_file", Arguments: map[string]any{"path": "a.py"}}}},
		{ToolCalls: []Call{{Name: "terminal", Arguments: map[string]any{"command": "python a.py", "timeout": 30}}}},
		{Final: "Fixed the division."},
	},
	Wrong: []Step{{Final: "I give up."}},
}

var correctPath = []string{
	`read_file {"path":"a.py"}`,
	`terminal {"command":"python a.py","timeout":30}`,
	"final: Fixed the division.",
}

// terminalWithTimeout declares timeout as an integer so that schema-driven
// parsers (qwen3_coder, glm45) type it.
const terminalWithTimeout = `{"type":"function","function":{"name":"terminal","parameters":{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"integer"}}}}}`

func TestScriptedEpisode(t *testing.T) {
	tools := "[" + terminalWithTimeout + "," + readFileTool + "]"
	for _, fam := range Families() {
		t.Run(fam, func(t *testing.T) {
			srv := startSim(t, Config{Family: fam, Scripts: []Script{fixScript}, Reasoning: true})
			got := runEpisode(t, srv.URL, "Please fix the bug in a.py", 1, tools)
			if strings.Join(got, "\n") != strings.Join(correctPath, "\n") {
				t.Fatalf("episode:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(correctPath, "\n"))
			}
		})
	}
}

func TestSuccessProb(t *testing.T) {
	tools := "[" + terminalTool + "," + readFileTool + "]"
	t.Run("zero", func(t *testing.T) {
		srv := startSim(t, Config{Scripts: []Script{fixScript}, SuccessProb: 0, SuccessProbSet: true})
		if got := runEpisode(t, srv.URL, "fix the bug", 1, tools); got[0] != "final: I give up." {
			t.Fatalf("SuccessProb 0 took the correct path: %v", got)
		}
	})
	t.Run("half", func(t *testing.T) {
		srv := startSim(t, Config{Scripts: []Script{fixScript}, SuccessProb: 0.5})
		correct := 0
		const n = 60
		for seed := range int64(n) {
			got := runEpisode(t, srv.URL, "fix the bug", seed, tools)
			switch strings.Join(got, "\n") {
			case strings.Join(correctPath, "\n"):
				correct++
			case "final: I give up.":
			default:
				t.Fatalf("seed %d: episode mixed the paths: %v", seed, got)
			}
		}
		// Loose bounds: a binomial(60, 0.5) is outside [15, 45] with
		// probability below 1e-4.
		if correct < 15 || correct > 45 {
			t.Fatalf("%d/%d episodes correct with SuccessProb 0.5", correct, n)
		}
	})
	t.Run("unseeded group", func(t *testing.T) {
		// A GRPO group: the same prompt, no seed. Episodes must still
		// spread over both paths and each stay on one path.
		srv := startSim(t, Config{Scripts: []Script{fixScript}, SuccessProb: 0.5, Seed: 1})
		correct := 0
		const n = 40
		for range n {
			got := runEpisode(t, srv.URL, "fix the bug", -1, tools)
			switch strings.Join(got, "\n") {
			case strings.Join(correctPath, "\n"):
				correct++
			case "final: I give up.":
			default:
				t.Fatalf("episode mixed the paths: %v", got)
			}
		}
		if correct < 8 || correct > 32 {
			t.Fatalf("%d/%d unseeded episodes correct with SuccessProb 0.5", correct, n)
		}
	})
	t.Run("multi-step wrong path", func(t *testing.T) {
		sc := fixScript
		sc.Wrong = []Step{
			{ToolCalls: []Call{{Name: "terminal", Arguments: map[string]any{"command": "rm -rf /"}}}},
			{Final: "Oops."},
		}
		for _, fam := range Families() {
			srv := startSim(t, Config{Family: fam, Scripts: []Script{sc}, SuccessProb: 0.5})
			seen := map[string]bool{}
			for range 16 {
				got := strings.Join(runEpisode(t, srv.URL, "fix the bug", -1, "["+terminalWithTimeout+","+readFileTool+"]"), "\n")
				if got != strings.Join(correctPath, "\n") && got != "terminal {\"command\":\"rm -rf /\"}\nfinal: Oops." {
					t.Fatalf("%s: episode mixed the paths:\n%s", fam, got)
				}
				seen[got] = true
			}
			if len(seen) != 2 {
				t.Errorf("%s: 16 unseeded episodes all took one path", fam)
			}
		}
	})
	t.Run("reproducible", func(t *testing.T) {
		a := startSim(t, Config{Scripts: []Script{fixScript}, SuccessProb: 0.5, Seed: 3})
		b := startSim(t, Config{Scripts: []Script{fixScript}, SuccessProb: 0.5, Seed: 3})
		for seed := range int64(10) {
			x, y := runEpisode(t, a.URL, "fix the bug", seed, tools), runEpisode(t, b.URL, "fix the bug", seed, tools)
			if strings.Join(x, "|") != strings.Join(y, "|") {
				t.Fatalf("seed %d differs between identical servers: %v vs %v", seed, x, y)
			}
		}
	})
}

func TestDefaultPolicy(t *testing.T) {
	srv := startSim(t, Config{})
	got := runEpisode(t, srv.URL, "what is here?", 1, "["+terminalTool+"]")
	if len(got) != 2 || got[0] != `terminal {"command":"ls -la"}` || !strings.HasPrefix(got[1], "final: ") {
		t.Fatalf("default episode with a terminal tool: %v", got)
	}
	got = runEpisode(t, srv.URL, "hi", 1, "")
	if len(got) != 1 || !strings.HasPrefix(got[0], "final: Hello") {
		t.Fatalf("default episode without tools: %v", got)
	}
}

func TestBenchMode(t *testing.T) {
	srv := startSim(t, Config{Bench: &Bench{Tool: "terminal", CallsPerTurn: 3, Turns: 2, Arguments: map[string]any{"command": "true"}}})
	got := runEpisode(t, srv.URL, "bench", 1, "["+terminalTool+"]")
	call := `terminal {"command":"true"}`
	want := []string{call + "; " + call + "; " + call, call + "; " + call + "; " + call, "final: bench done"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("bench episode %v, want %v", got, want)
	}
}

func TestExactLength(t *testing.T) {
	srv := startSim(t, Config{ExactLength: true})
	for _, n := range []int{1, 17, 300} {
		_, b := post(t, srv.URL+"/v1/chat/completions", fmt.Sprintf(`{"messages":[{"role":"user","content":"x"}],"max_tokens":%d,"return_token_ids":true}`, n))
		r := decode[chatResp](t, b)
		if len(r.Choices[0].TokenIDs) != n || r.Choices[0].FinishReason != "length" {
			t.Errorf("max_tokens %d: got %d ids, finish %q", n, len(r.Choices[0].TokenIDs), r.Choices[0].FinishReason)
		}
	}
}

// TestLengthCutHasNoEOT checks the drift case of a turn cut by max_tokens:
// no end-of-turn token is sampled.
func TestLengthCutHasNoEOT(t *testing.T) {
	srv := startSim(t, Config{})
	_, b := post(t, srv.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"return_token_ids":true}`)
	r := decode[chatResp](t, b)
	ids := r.Choices[0].TokenIDs
	if r.Choices[0].FinishReason != "length" || len(ids) != 4 || ids[3] == 258 {
		t.Fatalf("length cut: finish %q ids %v", r.Choices[0].FinishReason, ids)
	}
	_, b = post(t, srv.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"return_token_ids":true}`)
	r = decode[chatResp](t, b)
	ids = r.Choices[0].TokenIDs
	if r.Choices[0].FinishReason != "stop" || ids[len(ids)-1] != 258 {
		t.Fatalf("full turn must end with <|im_end|> (258): finish %q ids %v", r.Choices[0].FinishReason, ids)
	}
}

func TestStopStrings(t *testing.T) {
	srv := startSim(t, Config{})
	_, b := post(t, srv.URL+"/v1/completions", `{"prompt":"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n","max_tokens":100,"stop":["I am"]}`)
	var r struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
			StopReason   any    `json:"stop_reason"`
		}
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	c := r.Choices[0]
	if c.Text != "Hello! " || c.FinishReason != "stop" || c.StopReason != "I am" {
		t.Fatalf("stop string: %+v", c)
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		is   error
	}{
		{"family", Config{Family: "pythonic"}, ErrUnsupportedFamily},
		{"template", Config{Template: "gemma"}, ErrUnsupportedTemplate},
		{"fault sum", Config{Faults: Faults{ErrorRate: 0.7, DropRate: 0.7}}, nil},
		{"negative latency", Config{Latency: Latency{TTFT: -1}}, nil},
		{"success prob", Config{SuccessProb: 2}, nil},
		{"script without match", Config{Scripts: []Script{{Steps: []Step{{Final: "x"}}}}}, nil},
		{"bench without tool", Config{Bench: &Bench{CallsPerTurn: 1}}, nil},
	}
	for _, tc := range cases {
		_, err := NewHandler(tc.cfg)
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: %v is not %v", tc.name, err, tc.is)
		}
	}
	for alias := range familyAliases {
		if _, err := NewHandler(Config{Family: alias}); err != nil {
			t.Errorf("alias %s: %v", alias, err)
		}
	}
	if _, err := NewHandler(Config{Family: "pythonic"}); err == nil || !strings.Contains(err.Error(), "not supported by the simulator") {
		t.Errorf("unsupported family error should say so: %v", err)
	}
}

// An alias's parser reads what the simulator emits for its canonical
// family.
func TestFamilyAliasesParse(t *testing.T) {
	calls := []emitCall{{Name: "terminal", Args: map[string]any{"command": "ls -la"}}, {Name: "read_file", Args: map[string]any{"path": "/a b"}}}
	for alias, canon := range familyAliases {
		p, err := parsers.Get(alias)
		if err != nil {
			t.Fatal(err)
		}
		r := p.Parse(emitCalls(canon, calls, 0), nil)
		if len(r.ToolCalls) != 2 || len(r.Errors) != 0 || r.ToolCalls[0].Name != "terminal" || r.ToolCalls[1].Arguments != `{"path":"/a b"}` {
			t.Errorf("%s (as %s): %+v", alias, canon, r)
		}
	}
}
