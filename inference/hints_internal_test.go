package inference

import (
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"
)

func TestParseHintVote(t *testing.T) {
	for _, c := range []struct {
		text string
		want hintVote
	}{
		{"[HINT_START] Run the tests first. [HINT_END]\n\\boxed{1}", hintVote{readable: true, positive: true, hint: "Run the tests first."}},
		{"nothing to learn here \\boxed{-1}", hintVote{readable: true}},
		{"\\boxed{ +1 } [HINT_START]a[HINT_END] then [HINT_START]check the exit code[HINT_END]", hintVote{readable: true, positive: true, hint: "check the exit code"}},
		// The last verdict counts: a judge that changes its mind.
		{"\\boxed{1} ... on reflection \\boxed{-1} [HINT_START]x y z w v u[HINT_END]", hintVote{readable: true, hint: "x y z w v u"}},
		{"I think it is fine.", hintVote{}},
		{"\\boxed{0} [HINT_START]unclosed", hintVote{}},
		{"\\boxed{1}\n[HINT_START]\nmulti\nline hint\n[HINT_END]", hintVote{readable: true, positive: true, hint: "multi\nline hint"}},
	} {
		if got := parseHintVote(c.text); got != c.want {
			t.Errorf("%q: got %+v, want %+v", c.text, got, c.want)
		}
	}
}

func TestChooseHint(t *testing.T) {
	votes := []hintVote{
		{readable: true, positive: true, hint: "too short"}, // 9 characters: not a hint
		{readable: true, positive: false, hint: "a much longer hint from a negative vote"},
		{readable: true, positive: true, hint: "use pytest -q"},
		{readable: true, positive: true, hint: "run pytest -q first"},
		{},
	}
	hint, positive := chooseHint(votes)
	if hint != "run pytest -q first" || positive != 3 {
		t.Fatalf("got %q with %d positive", hint, positive)
	}
	if hint, _ := chooseHint(votes[:2]); hint != "" {
		t.Fatalf("a short positive hint was taken: %q", hint)
	}
}

func TestWithHint(t *testing.T) {
	msgs := []openai.ChatCompletionMessage{
		{Role: "system", Content: "sys"},
		{Role: "user", Content: "task"},
		{Role: "assistant", Content: "a"},
		{Role: "user", Content: "feedback"},
		{Role: "assistant", Content: "b"},
		{Role: "tool", Content: "out"},
	}
	got, ok := withHint(msgs, "do X")
	if !ok || got[3].Content != "feedback\n\n[user's hint / instruction]\ndo X" || got[1].Content != "task" {
		t.Fatalf("hint not on the last user message: %+v", got)
	}
	if msgs[3].Content != "feedback" {
		t.Fatal("the caller's messages were changed")
	}
	multi := []openai.ChatCompletionMessage{{Role: "user", MultiContent: []openai.ChatMessagePart{{Type: openai.ChatMessagePartTypeText, Text: "look"}}}}
	got, ok = withHint(multi, "do Y")
	if !ok || len(got[0].MultiContent) != 2 || got[0].MultiContent[1].Text != hintHeader+"do Y" || len(multi[0].MultiContent) != 1 {
		t.Fatalf("multi-part user message: %+v", got)
	}
	if _, ok := withHint(msgs[:1], "z"); ok {
		t.Fatal("a hint without a user message to carry it")
	}
}

func TestHintTurnsLocatesTurns(t *testing.T) {
	msgs := []openai.ChatCompletionMessage{
		{Role: "user", Content: "task"},
		{Role: "assistant", Content: "few-shot"}, // the task's own: not generated
		{Role: "user", Content: "go"},
		{Role: "assistant", ToolCalls: []openai.ToolCall{{ID: "c1", Type: "function", Function: openai.FunctionCall{Name: "terminal", Arguments: `{"command":"ls"}`}}}},
		{Role: "tool", Name: "terminal", Content: strings.Repeat("x", 50)},
		{Role: "assistant", Content: "done"},
	}
	// prompt 6 | turn 1: 4 sampled (the last unscored) + 3 template | turn 2: 2 sampled
	seq := Sequence{
		Tokens:     make([]int32, 15),
		Mask:       []int8{0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1},
		TurnStarts: []int{6, 13},
	}
	turns, err := hintTurns(HintInput{Messages: msgs, First: 3, Sequence: seq})
	if err != nil {
		t.Fatal(err)
	}
	if len(turns) != 1 || turns[0].turn != 0 || turns[0].msg != 3 || turns[0].start != 6 || turns[0].end != 9 || len(turns[0].next) != 1 {
		t.Fatalf("turns %+v", turns)
	}
	if _, err := hintTurns(HintInput{Messages: msgs, First: 0, Sequence: seq}); err == nil {
		t.Fatal("three assistant messages for two generations were paired")
	}
	bad := seq
	bad.TurnStarts = []int{6, 40}
	if _, err := hintTurns(HintInput{Messages: msgs, First: 3, Sequence: bad}); err == nil {
		t.Fatal("a generation outside the sequence was accepted")
	}
	// A turn with no user message before it has nothing to carry a hint:
	// it is not judged.
	noUser := []openai.ChatCompletionMessage{{Role: "system", Content: "s"}, msgs[3], msgs[4], msgs[5]}
	if got, err := hintTurns(HintInput{Messages: noUser, First: 1, Sequence: seq}); err != nil || len(got) != 0 {
		t.Fatalf("a turn without a user message before it: %+v, %v", got, err)
	}
	if s := nextStateText(turns[0].next, 20); !strings.HasPrefix(s, "[tool: terminal]\nxxx") || !strings.HasSuffix(s, "… [truncated]") {
		t.Fatalf("next state %q", s)
	}
	if s := responseText(msgs[3]); s != `[tool call] terminal({"command":"ls"})` {
		t.Fatalf("response %q", s)
	}
}

// The judge's reply is model output: any text reads without a panic, a
// vote is readable exactly when a \boxed{±1} is in it, and a hint is text
// found between the markers.
func FuzzParseHintVote(f *testing.F) {
	for _, s := range []string{"", "\\boxed{1}", "[HINT_START]x[HINT_END]\\boxed{-1}", "\\boxed{ +1 }[HINT_START][HINT_START]a[HINT_END]", "[HINT_END][HINT_START]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		v := parseHintVote(text)
		if v.readable != boxedRE.MatchString(text) || (v.positive && !v.readable) {
			t.Fatalf("%q: %+v", text, v)
		}
		if v.hint != "" && (!strings.Contains(text, v.hint) || v.hint != strings.TrimSpace(v.hint)) {
			t.Fatalf("%q: hint %q", text, v.hint)
		}
	})
}
