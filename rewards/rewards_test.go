package rewards

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/internal/testkit/conntest"
	"github.com/rollout-rl/rollout/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeBox is a unit-test stand-in for a sandbox: files in a map and a
// command table. Integration tests against real sandboxes live in envs.
type fakeBox struct {
	files map[string][]byte
	exits map[string]int
	err   error
}

func (b *fakeBox) Exec(_ context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	if b.err != nil {
		return sandbox.ExecResult{}, b.err
	}
	return sandbox.ExecResult{ExitCode: b.exits[req.Command]}, nil
}

func (b *fakeBox) ReadFile(_ context.Context, path string) ([]byte, error) {
	if b.err != nil {
		return nil, b.err
	}
	d, ok := b.files[path]
	if !ok {
		return nil, fmt.Errorf("read %s: %w", path, sandbox.ErrNotFound)
	}
	return d, nil
}

func TestFileContentAndExitCode(t *testing.T) {
	box := &fakeBox{files: map[string][]byte{"/w/a.txt": []byte("hello world\n")}, exits: map[string]int{"false": 1}}
	mk := func(mode, want string, trim bool) Reward {
		r, err := NewFileContent("/w/a.txt", mode, want, trim)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	missing, _ := NewFileContent("/w/none", "", "x", false)
	cases := []struct {
		name string
		r    Reward
		want float64
	}{
		{"exact with trim", mk(MatchExact, "hello world", true), 1},
		{"exact without trim", mk(MatchExact, "hello world", false), 0},
		{"contains", mk(MatchContains, "lo wo", false), 1},
		{"contains miss", mk(MatchContains, "bye", false), 0},
		{"regex", mk(MatchRegex, `^hel+o\s\w+$`, false), 0},
		{"regex multiline", mk(MatchRegex, `(?m)^hel+o\s\w+$`, false), 1},
		{"missing file scores zero", missing, 0},
		{"exit 0", ExitCode{Command: "true"}, 1},
		{"exit 1", ExitCode{Command: "false"}, 0},
		{"want exit 1", ExitCode{Command: "false", Want: 1}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := c.r.Score(context.Background(), Input{Box: box})
			if err != nil {
				t.Fatal(err)
			}
			if s.Value != c.want {
				t.Errorf("score = %v, want %v (components %v)", s.Value, c.want, s.Components)
			}
		})
	}
	if _, err := NewFileContent("/x", "fuzzy", "", false); err == nil {
		t.Error("unknown mode accepted")
	}
}

func TestInfraErrorsAreNotZeroScores(t *testing.T) {
	box := &fakeBox{err: fmt.Errorf("container gone: %w", sandbox.ErrUnavailable)}
	fc, _ := NewFileContent("/w/a", "", "x", false)
	for _, r := range []Reward{fc, ExitCode{Command: "true"}, TestsPassed{Command: "pytest", Report: "/tmp/j.xml"}} {
		_, err := r.Score(context.Background(), Input{Box: box})
		if !errors.Is(err, ErrReward) || !errors.Is(err, sandbox.ErrUnavailable) {
			t.Errorf("%T: err = %v, want ErrReward wrapping ErrUnavailable", r, err)
		}
	}
	if _, err := (ExitCode{Command: "true"}).Score(context.Background(), Input{}); !errors.Is(err, ErrReward) {
		t.Errorf("no sandbox: err = %v", err)
	}
}

func TestTestsPassed(t *testing.T) {
	xml, err := os.ReadFile("testdata/pytest-junit.xml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseJUnit(xml)
	if err != nil {
		t.Fatal(err)
	}
	if c != (JUnitCounts{Total: 4, Passed: 2, Failed: 2, Skipped: 1}) {
		t.Fatalf("counts = %+v", c)
	}
	box := &fakeBox{files: map[string][]byte{"/tmp/j.xml": xml}, exits: map[string]int{"pytest": 1}}
	s, err := TestsPassed{Command: "pytest", Report: "/tmp/j.xml"}.Score(context.Background(), Input{Box: box})
	if err != nil {
		t.Fatal(err)
	}
	if s.Value != 0.5 || s.Components["tests_passed"] != 2 || s.Components["tests_total"] != 4 {
		t.Errorf("score = %+v", s)
	}
	s, err = TestsPassed{Command: "pytest", Report: "/tmp/none.xml"}.Score(context.Background(), Input{Box: box})
	if err != nil || s.Value != 0 {
		t.Errorf("no report: %+v %v", s, err)
	}
	box.files["/tmp/bad.xml"] = []byte("<testsuite><testcase")
	if _, err := (TestsPassed{Command: "pytest", Report: "/tmp/bad.xml"}).Score(context.Background(), Input{Box: box}); !errors.Is(err, ErrReward) {
		t.Errorf("corrupt report: err = %v", err)
	}
}

func TestExtractAnswer(t *testing.T) {
	cases := []struct {
		text, want string
		found      bool
	}{
		{`so the answer is \boxed{42}.`, "42", true},
		{`\boxed{1} then \boxed{\frac{3}{4}}`, `\frac{3}{4}`, true},
		{"The total is 1,234.5 dollars.", "1,234.5", true},
		{"it is -7", "-7", true},
		{"x-7", "7", true},
		{"no numbers here", "", false},
		{"ends with 3.", "3", true},
	}
	for _, c := range cases {
		got, ok := ExtractAnswer(c.text)
		if got != c.want || ok != c.found {
			t.Errorf("ExtractAnswer(%q) = %q %v, want %q %v", c.text, got, ok, c.want, c.found)
		}
	}
}

func TestNumericMatch(t *testing.T) {
	cases := []struct {
		answer, final string
		want          float64
	}{
		{"42", `\boxed{42}`, 1},
		{"42", "I think 41", 0},
		{"0.75", `\boxed{\frac{3}{4}}`, 1},
		{"0.75", "3/4", 1},
		{"1234.5", "$1,234.5", 1},
		{"50%", "0.5", 1},
		{"42", "no idea", 0},
	}
	for _, c := range cases {
		s, err := NumericMatch{}.Score(context.Background(), Input{Answer: c.answer, Final: c.final})
		if err != nil {
			t.Fatalf("%q: %v", c.final, err)
		}
		if s.Value != c.want {
			t.Errorf("answer %q final %q: %v, want %v", c.answer, c.final, s.Value, c.want)
		}
	}
	if _, err := (NumericMatch{}).Score(context.Background(), Input{Answer: "forty", Final: "40"}); !errors.Is(err, ErrReward) {
		t.Errorf("non-numeric reference: %v", err)
	}
}

func TestSumAndSpecs(t *testing.T) {
	box := &fakeBox{files: map[string][]byte{"/w/a": []byte("ok")}}
	sum, err := BuildSum([]Spec{
		{Type: "file_content", Path: "/w/a", Want: "ok", Weight: 0.7},
		{Type: "format", Regex: `^\S+$`, Weight: 0.3},
		{Type: "format", MaxChars: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := sum.Score(context.Background(), Input{Box: box, Final: "yes"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Value != 1.0 || s.Components["file_content"] != 1 || s.Components["format"] != 1 || s.Components["format_2"] != 0 || s.Components["file_content.file_exists"] != 1 {
		t.Errorf("sum = %+v", s)
	}
	bad := []struct {
		spec Spec
		want string
	}{
		{Spec{Type: "nope"}, `unknown reward type "nope"`},
		{Spec{}, "reward type is required"},
		{Spec{Type: "exit_code"}, "command is required"},
		{Spec{Type: "exit_code", Command: "x", Want: "0"}, "want must be an integer"},
		{Spec{Type: "file_content", Path: "/a", Want: 3}, "want must be a string"},
		{Spec{Type: "format", Regex: "("}, "bad regex"},
		{Spec{Type: "match_fraction"}, "match_fraction: regex is required"},
		{Spec{Type: "match_fraction", Regex: "["}, "match_fraction: bad regex"},
		{Spec{Type: "llm_judge"}, "base_url and model are required"},
	}
	for _, b := range bad {
		if _, err := BuildSum([]Spec{b.spec}); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%+v: err = %v, want %q", b.spec, err, b.want)
		}
	}
}

// Verdicts asked for by many rollouts at once reuse their connections.
func TestJudgeKeepsConnections(t *testing.T) {
	srv := conntest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"choices":[{"message":{"content":"{\"score\": 1}"}}]}`))
	}))
	defer srv.Close()
	defer judgeClient.CloseIdleConnections()
	j, err := NewJudge(Judge{BaseURL: srv.URL, Model: "judge"})
	if err != nil {
		t.Fatal(err)
	}
	const callers, rounds = 16, 4
	conntest.Rounds(t, callers, rounds, func() error {
		_, err := j.Score(context.Background(), Input{Final: "x"})
		return err
	})
	if n := srv.Conns(); n > callers {
		t.Fatalf("%d rounds of %d concurrent verdicts used %d connections, want at most %d", rounds, callers, n, callers)
	}
}

func TestJudge(t *testing.T) {
	var calls atomic.Int32
	replies := []struct {
		status int
		body   string
	}{
		{429, "rate limited"}, // a hosted judge's limit: asked again, like a 5xx
		{500, "overloaded"},
		{200, `{"choices":[{"message":{"content":"thinking... no json"}}]}`},
		{200, `{"choices":[{"message":{"content":"Verdict: {\"score\": 0.8, \"reason\": \"close {enough}\"}"}}]}`},
	}
	var sawZeroTemp atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		body := make([]byte, 1<<16)
		n, _ := r.Body.Read(body)
		if strings.Contains(string(body[:n]), `"temperature":0`) {
			sawZeroTemp.Store(true)
		}
		i := int(calls.Add(1)) - 1
		rep := replies[min(i, len(replies)-1)]
		w.WriteHeader(rep.status)
		_, _ = w.Write([]byte(rep.body))
	}))
	defer srv.Close()
	j, err := NewJudge(Judge{BaseURL: srv.URL, Model: "judge", Retries: 4})
	if err != nil {
		t.Fatal(err)
	}
	s, err := j.Score(context.Background(), Input{Answer: "4", Final: "four"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Value != 0.8 || calls.Load() != 4 {
		t.Errorf("score %v after %d calls", s.Value, calls.Load())
	}
	if !sawZeroTemp.Load() {
		t.Error("temperature 0 was not sent")
	}

	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(400)
		_, _ = w.Write([]byte(`{"error":"bad model"}`))
	}))
	defer bad.Close()
	j2, _ := NewJudge(Judge{BaseURL: bad.URL + "/v1", Model: "x"})
	if _, err := j2.Score(context.Background(), Input{}); !errors.Is(err, ErrReward) || !strings.Contains(err.Error(), "HTTP 400") {
		t.Errorf("4xx: err = %v", err)
	}
	bad.CloseClientConnections()
}

func TestParseVerdict(t *testing.T) {
	for text, want := range map[string]float64{
		`{"score": 1}`:                      1,
		"```json\n{\"score\": 0.25}\n```":   0.25,
		`{"reason":"a"} {"score":0,"x":{}}`: 0,
	} {
		got, err := parseVerdict(text)
		if err != nil || got != want {
			t.Errorf("parseVerdict(%q) = %v %v", text, got, err)
		}
	}
	for _, text := range []string{`{"score": 2}`, `{"score": "high"}`, `no`} {
		if _, err := parseVerdict(text); err == nil {
			t.Errorf("parseVerdict(%q) accepted", text)
		}
	}
}

func TestMatchFraction(t *testing.T) {
	cases := []struct {
		regex, final string
		want         float64
	}{
		{`[0-9]`, "", 0},
		{`[0-9]`, "abcd", 0},
		{`[0-9]`, "1234", 1},
		{`[0-9]`, "a1b2", 0.5},
		{`[0-9]+`, "12 34", 0.8},
		{`é`, "éa", 0.5},       // runes, not bytes
		{`aa`, "aaa", 2.0 / 3}, // non-overlapping
	}
	for _, c := range cases {
		r, err := Build(Spec{Type: "match_fraction", Regex: c.regex})
		if err != nil {
			t.Fatal(err)
		}
		s, err := r.Score(context.Background(), Input{Final: c.final})
		if err != nil {
			t.Fatal(err)
		}
		if diff := s.Value - c.want; diff > 1e-12 || diff < -1e-12 {
			t.Errorf("match_fraction %q on %q = %v, want %v", c.regex, c.final, s.Value, c.want)
		}
	}
}
