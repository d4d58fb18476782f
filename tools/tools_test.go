package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/sandbox"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if testDocker != nil {
		if err := testDocker.Close(context.Background()); err != nil {
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

func setup(t *testing.T) (*Set, *Runtime, *hostSandbox, string) {
	t.Helper()
	dir := t.TempDir()
	// Resolve symlinks so that pwd -P and our paths agree.
	dir, _ = filepath.EvalSymlinks(dir)
	sb := newHostSandbox(dir)
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	set, err := Default().Resolve(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rt := NewRuntime(sb, "r1")
	return set, rt, sb, dir
}

func call(t *testing.T, set *Set, rt *Runtime, name, args string) map[string]any {
	t.Helper()
	c, err := set.Prepare("call_1", name, args)
	if err != nil {
		t.Fatalf("prepare %s %s: %v", name, args, err)
	}
	out, err := set.Execute(context.Background(), rt, c)
	if err != nil {
		t.Fatalf("execute %s: %v", name, err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out.Content), &m); err != nil {
		t.Fatalf("%s result is not JSON: %v\n%s", name, err, out.Content)
	}
	return m
}

func TestPrepareInvalid(t *testing.T) {
	set, _, _, _ := setup(t)
	cases := []struct {
		name, tool, args, kind, want string
	}{
		{"unknown", "browse", `{}`, InvalidUnknownTool, `{"error":"Unknown tool 'browse'. Available tools: ['patch', 'process', 'read_file', 'search_files', 'terminal', 'todo', 'write_file']"}`},
		{"memory", "memory", `{}`, InvalidUnknownTool, `{"error":"Memory is not available in RL environments."}`},
		{"bad json", "terminal", `{"command": "ls"`, InvalidJSON, `{"error":"Invalid JSON in tool arguments: unexpected EOF. Please retry with valid JSON."}`},
		{"trailing", "terminal", `{"command": "ls"} x`, InvalidJSON, ""},
		{"array", "terminal", `[1]`, InvalidNotObject, `{"error":"Invalid tool arguments: expected a JSON object, got a JSON array. Please retry with the arguments as a JSON object."}`},
		{"string", "terminal", `"ls"`, InvalidNotObject, ""},
		{"missing required", "terminal", `{}`, InvalidSchema, ""},
		{"wrong type", "read_file", `{"path": "a", "offset": "x"}`, InvalidSchema, ""},
		{"bad enum", "process", `{"action": "explode"}`, InvalidSchema, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := set.Prepare("c", tc.tool, tc.args)
			var ic *InvalidCallError
			if !errors.As(err, &ic) {
				t.Fatalf("want InvalidCallError, got %v", err)
			}
			if ic.Kind != tc.kind {
				t.Fatalf("kind %s, want %s (%s)", ic.Kind, tc.kind, ic.Detail)
			}
			if tc.want != "" && ic.Result != tc.want {
				t.Fatalf("result\n got %s\nwant %s", ic.Result, tc.want)
			}
			if !json.Valid([]byte(ic.Result)) || !strings.Contains(ic.Result, `"error"`) {
				t.Fatalf("result is not an error object: %s", ic.Result)
			}
		})
	}
}

func TestCoercion(t *testing.T) {
	r := NewRegistry()
	schema := `{"type":"object","properties":{
		"i":{"type":"integer"},"n":{"type":"number"},"b":{"type":"boolean"},
		"arr":{"type":"array","items":{"type":"integer"}},"sarr":{"type":"array","items":{"type":"string"}},
		"obj":{"type":"object","properties":{"k":{"type":"integer"}}},
		"nul":{"type":["integer","null"]},"u":{"anyOf":[{"type":"integer"},{"type":"string"}]},"s":{"type":"string"}}}`
	if err := r.Register(Tool{Name: "t", Toolset: "x", Parameters: []byte(schema), Handler: func(context.Context, *Runtime, Args) (string, error) { return "", nil }}); err != nil {
		t.Fatal(err)
	}
	set, _ := r.Resolve(nil, nil)
	cases := []struct{ in, want string }{
		{`{"i":"42"}`, `{"i":42}`},
		{`{"n":"4.5"}`, `{"n":4.5}`},
		{`{"b":"true","s":"true"}`, `{"b":true,"s":"true"}`},
		{`{"b":"False"}`, `{"b":false}`},
		{`{"arr":"[1,\"2\"]"}`, `{"arr":[1,2]}`},
		{`{"arr":"7"}`, `{"arr":[7]}`},
		{`{"sarr":"x"}`, `{"sarr":["x"]}`},
		{`{"arr":3}`, `{"arr":[3]}`},
		{`{"obj":"{\"k\":\"3\"}"}`, `{"obj":{"k":3}}`},
		{`{"nul":"null"}`, `{"nul":null}`},
		{`{"u":"12"}`, `{"u":12}`},
		{`{"u":"abc"}`, `{"u":"abc"}`},
		{`{"s":"12"}`, `{"s":"12"}`},
	}
	for _, tc := range cases {
		c, err := set.Prepare("c", "t", tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		got, _ := json.Marshal(c.Args)
		var a, b any
		_ = json.Unmarshal(got, &a)
		_ = json.Unmarshal([]byte(tc.want), &b)
		if d := cmp.Diff(b, a); d != "" {
			t.Errorf("%s: got %s want %s", tc.in, got, tc.want)
		}
	}
	// An integer schema keeps "4.5" as a string, which then fails validation.
	if _, err := set.Prepare("c", "t", `{"i":"4.5"}`); err == nil {
		t.Error(`"4.5" must not become an integer`)
	}
}

func TestResolve(t *testing.T) {
	r := Default()
	cases := []struct {
		en, dis []string
		want    []string
		err     bool
	}{
		{nil, nil, []string{"patch", "process", "read_file", "search_files", "terminal", "todo", "write_file"}, false},
		{[]string{"terminal"}, nil, []string{"process", "terminal"}, false},
		{[]string{"file", "terminal"}, []string{"process", "write_file"}, []string{"patch", "read_file", "search_files", "terminal"}, false},
		{[]string{"todo"}, []string{"todo"}, nil, false},
		{[]string{"web"}, nil, nil, true},
		{nil, []string{"nope"}, nil, true},
	}
	for _, tc := range cases {
		s, err := r.Resolve(tc.en, tc.dis)
		if (err != nil) != tc.err {
			t.Fatalf("%v/%v: err %v", tc.en, tc.dis, err)
		}
		if err == nil && !cmp.Equal(s.Names(), tc.want, cmpEmpty) {
			t.Errorf("%v/%v: got %v want %v", tc.en, tc.dis, s.Names(), tc.want)
		}
	}
	if err := r.Register(Tool{Name: "terminal", Toolset: "x", Handler: runTodo}); err == nil {
		t.Error("duplicate registration must fail")
	}
	if err := r.Register(Tool{Name: "bad", Toolset: "x", Handler: runTodo, Parameters: []byte(`{"type": 3}`)}); err == nil {
		t.Error("invalid schema must fail")
	}
}

var cmpEmpty = cmp.Comparer(func(a, b []string) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return strings.Join(a, ",") == strings.Join(b, ",")
})

func TestSampleToolsets(t *testing.T) {
	r := Default()
	a, skipped, err := r.SampleToolsets("development", 7)
	if err != nil {
		t.Fatal(err)
	}
	b, _, _ := r.SampleToolsets("development", 7)
	if !cmp.Equal(a, b) {
		t.Fatalf("same seed, different draw: %v vs %v", a, b)
	}
	if !cmp.Equal(skipped, []string{"moa", "vision", "web"}) {
		t.Fatalf("skipped %v", skipped)
	}
	// browser_only has nothing we provide: an explicit error, not silence.
	if _, _, err := r.SampleToolsets("browser_only", 1); err == nil {
		t.Fatal("want error for a distribution with no available toolset")
	}
	// reasoning: terminal at 20 %; over many seeds the fallback keeps the
	// result non-empty and the frequency near 20 %... or 100 % via fallback
	// (terminal is the only available toolset).
	for seed := uint64(0); seed < 50; seed++ {
		ts, _, err := r.SampleToolsets("reasoning", seed)
		if err != nil || !cmp.Equal(ts, []string{"terminal"}) {
			t.Fatalf("seed %d: %v %v", seed, ts, err)
		}
	}
	// balanced: each toolset independently at 50 %.
	hits := map[string]int{}
	for seed := uint64(0); seed < 2000; seed++ {
		ts, _, _ := r.SampleToolsets("balanced", seed)
		for _, x := range ts {
			hits[x]++
		}
	}
	// terminal: 50 %; file: 50 % plus the fallback when nothing was drawn
	// (file is the first of the most probable ones): 75 %.
	if hits["terminal"] < 850 || hits["terminal"] > 1150 || hits["file"] < 1350 || hits["file"] > 1650 {
		t.Errorf("frequencies %v out of 2000", hits)
	}
	if _, _, err := r.SampleToolsets("nope", 1); err == nil {
		t.Fatal("unknown distribution must fail")
	}
}

func TestTerminal(t *testing.T) {
	set, rt, _, dir := setup(t)
	r := call(t, set, rt, "terminal", `{"command":"mkdir sub && cd sub && export FOO=bar && echo hi"}`)
	if r["output"] != "hi" || r["exit_code"] != float64(0) || r["error"] != nil {
		t.Fatalf("got %v", r)
	}
	r = call(t, set, rt, "terminal", `{"command":"pwd; echo $FOO"}`)
	if r["output"] != dir+"/sub\nbar" {
		t.Fatalf("cwd/env did not persist: %q", r["output"])
	}
	r = call(t, set, rt, "terminal", `{"command":"printf '\\033[31mred\\033[0m'"}`)
	if r["output"] != "red" {
		t.Fatalf("ANSI not stripped: %q", r["output"])
	}
	r = call(t, set, rt, "terminal", `{"command":"sleep 5", "timeout": "1"}`)
	if r["exit_code"] != float64(124) || !strings.Contains(r["output"].(string), "[Command timed out after 1s]") {
		t.Fatalf("timeout: %v", r)
	}
	r = call(t, set, rt, "terminal", `{"command":"grep nothing /dev/null"}`)
	if r["exit_code"] != float64(1) || r["exit_code_meaning"] == nil {
		t.Fatalf("grep: %v", r)
	}
	r = call(t, set, rt, "terminal", `{"command":"head -c 120000 /dev/zero | tr '\\0' a"}`)
	out := r["output"].(string)
	if !strings.Contains(out, "[OUTPUT TRUNCATED - 70000 chars omitted out of 120000 total]") || len(out) > 50_200 {
		t.Fatalf("truncation: len %d, %q", len(out), out[19990:20100])
	}
	r = call(t, set, rt, "terminal", `{"command":"sleep 1", "timeout": 601}`)
	if !strings.Contains(r["error"].(string), "exceeds the maximum of 600s") {
		t.Fatalf("cap: %v", r)
	}
	r = call(t, set, rt, "terminal", `{"command":"nohup sleep 100 &"}`)
	if r["exit_code"] != float64(-1) || r["status"] != "error" {
		t.Fatalf("guard: %v", r)
	}
	// The guard ignores quoted text.
	r = call(t, set, rt, "terminal", `{"command":"echo 'a & b'"}`)
	if r["output"] != "a & b" {
		t.Fatalf("quoted &: %v", r)
	}
}

func TestBackgroundProcess(t *testing.T) {
	set, rt, _, _ := setup(t)
	r := call(t, set, rt, "terminal", `{"command":"echo started; read x; echo got $x", "background": true}`)
	id, _ := r["session_id"].(string)
	if id == "" || r["output"] != "Background process started" {
		t.Fatalf("start: %v", r)
	}
	r = call(t, set, rt, "process", `{"action":"list"}`)
	if r["total"] != float64(1) {
		t.Fatalf("list: %v", r)
	}
	r = call(t, set, rt, "process", `{"action":"submit","session_id":"`+id+`","data":"hello"}`)
	if r["success"] != true {
		t.Fatalf("submit: %v", r)
	}
	r = call(t, set, rt, "process", `{"action":"wait","session_id":"`+id+`","timeout":10}`)
	if r["timed_out"] != false || !strings.Contains(r["output"].(string), "got hello") {
		t.Fatalf("wait: %v", r)
	}
	r = call(t, set, rt, "process", `{"action":"log","session_id":"`+id+`","offset":1,"limit":1}`)
	if r["output"] != "got hello" || r["total_lines"] != float64(2) {
		t.Fatalf("log: %v", r)
	}
	r = call(t, set, rt, "process", `{"action":"poll","session_id":"nope"}`)
	if !strings.Contains(r["error"].(string), "Unknown session_id 'nope'") {
		t.Fatalf("poll unknown: %v", r)
	}
	r = call(t, set, rt, "terminal", `{"command":"sleep 100", "background": true}`)
	r = call(t, set, rt, "process", `{"action":"kill","session_id":"`+r["session_id"].(string)+`"}`)
	if r["status"] != "killed" {
		t.Fatalf("kill: %v", r)
	}
}

func TestReadFile(t *testing.T) {
	set, rt, _, dir := setup(t)
	var b strings.Builder
	for i := 1; i <= 1200; i++ {
		b.WriteString("line ")
		b.WriteString(strings.Repeat("x", i%3))
		b.WriteString("\n")
	}
	os.WriteFile(filepath.Join(dir, "big.txt"), []byte(b.String()), 0o644)
	r := call(t, set, rt, "read_file", `{"path":"big.txt"}`)
	if r["total_lines"] != float64(1200) || r["truncated"] != true || !strings.HasPrefix(r["content"].(string), "     1|line x\n     2|line xx\n") {
		t.Fatalf("first page: %v", r["content"].(string)[:40])
	}
	if r["hint"] != "Use offset=501 to continue reading (showing 1-500 of 1200 lines)" {
		t.Fatalf("hint %v", r["hint"])
	}
	r = call(t, set, rt, "read_file", `{"path":"`+dir+`/big.txt","offset":1199,"limit":"5"}`)
	if r["content"] != "  1199|line xx\n  1200|line " || r["truncated"] != false {
		t.Fatalf("last page: %q", r["content"])
	}
	os.WriteFile(filepath.Join(dir, "bin.dat"), []byte{0, 1, 2, 3, 'a'}, 0o644)
	r = call(t, set, rt, "read_file", `{"path":"bin.dat"}`)
	if r["is_binary"] != true || r["error"] == nil {
		t.Fatalf("binary: %v", r)
	}
	r = call(t, set, rt, "read_file", `{"path":"bog.txt"}`)
	if r["error"] != "File not found: "+dir+"/bog.txt" {
		t.Fatalf("missing: %v", r)
	}
	if sim := r["similar_files"].([]any); len(sim) == 0 || sim[0] != dir+"/big.txt" {
		t.Fatalf("similar: %v", r["similar_files"])
	}
	long := strings.Repeat("y", 3000) + "\n"
	os.WriteFile(filepath.Join(dir, "long.txt"), []byte(strings.Repeat(long, 100)), 0o644)
	r = call(t, set, rt, "read_file", `{"path":"long.txt","limit":1}`)
	if !strings.HasSuffix(r["content"].(string), "... [truncated]") {
		t.Fatalf("long line not cut")
	}
	os.WriteFile(filepath.Join(dir, "wide.txt"), []byte(strings.Repeat(strings.Repeat("z", 1500)+"\n", 200)), 0o644)
	r = call(t, set, rt, "read_file", `{"path":"wide.txt","limit":200}`)
	if !strings.Contains(r["error"].(string), "exceeds the safety limit (100,000 chars)") {
		t.Fatalf("safety limit: %v", r["error"])
	}
}

func TestWriteAndPatch(t *testing.T) {
	set, rt, _, dir := setup(t)
	big := strings.Repeat("0123456789", 300_000) // 3 MB, no shell involved
	c, _ := set.Prepare("c", "write_file", `{"path":"a/b/c.txt","content":"`+big+`"}`)
	out, err := set.Execute(context.Background(), rt, c)
	if err != nil {
		t.Fatal(err)
	}
	var w map[string]any
	json.Unmarshal([]byte(out.Content), &w)
	if w["bytes_written"] != float64(len(big)) || w["dirs_created"] != true {
		t.Fatalf("write: %v", w)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "a/b/c.txt"))
	if string(got) != big {
		t.Fatal("content differs")
	}
	r := call(t, set, rt, "write_file", `{"path":"x.json","content":"{\"a\": }"}`)
	if r["lint"].(map[string]any)["status"] != "error" {
		t.Fatalf("lint: %v", r)
	}
	// A path with shell metacharacters is just a name.
	r = call(t, set, rt, "write_file", `{"path":"we ird;$(touch pwned).py","content":"x = 1\nx = 1\ny = 2\n"}`)
	if _, err := os.Stat(filepath.Join(dir, "pwned")); err == nil {
		t.Fatal("path was interpolated into a shell")
	}
	r = call(t, set, rt, "patch", `{"mode":"replace","path":"we ird;$(touch pwned).py","old_string":"x = 1","new_string":"x = 2"}`)
	if r["success"] != false || !strings.Contains(r["error"].(string), "matches 2 times") {
		t.Fatalf("uniqueness: %v", r)
	}
	r = call(t, set, rt, "patch", `{"mode":"replace","path":"we ird;$(touch pwned).py","old_string":"x = 1","new_string":"x = 2","replace_all":true}`)
	if r["success"] != true {
		t.Fatalf("replace_all: %v", r)
	}
	wantDiff := "--- a/" + strings.TrimPrefix(dir, "/") + "/we ird;$(touch pwned).py\n+++ b/" + strings.TrimPrefix(dir, "/") + "/we ird;$(touch pwned).py\n@@ -1,3 +1,3 @@\n-x = 1\n-x = 1\n+x = 2\n+x = 2\n y = 2\n"
	if r["diff"] != wantDiff {
		t.Fatalf("diff:\n%s\nwant\n%s", r["diff"], wantDiff)
	}
	r = call(t, set, rt, "patch", `{"mode":"replace","path":"we ird;$(touch pwned).py","old_string":"nope","new_string":"x"}`)
	if r["success"] != false || r["_hint"] == nil {
		t.Fatalf("miss: %v", r)
	}
	os.WriteFile(filepath.Join(dir, "m.py"), []byte("def f():\n    return 1\n\ndef g():\n    return 1\n"), 0o755)
	r = call(t, set, rt, "patch", `{"mode":"patch","patch":"*** Begin Patch\n*** Update File: m.py\n@@ def g\n def g():\n-    return 1\n+    return 2\n*** Add File: new/n.txt\n+hello\n*** End Patch"}`)
	if r["success"] != true {
		t.Fatalf("v4a: %v", r)
	}
	got, _ = os.ReadFile(filepath.Join(dir, "m.py"))
	if string(got) != "def f():\n    return 1\n\ndef g():\n    return 2\n" {
		t.Fatalf("v4a content: %q", got)
	}
	if st, _ := os.Stat(filepath.Join(dir, "m.py")); st.Mode().Perm() != 0o755 {
		t.Fatalf("mode not kept: %v", st.Mode())
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "new/n.txt")); string(got) != "hello\n" {
		t.Fatalf("add: %q", got)
	}
}

func TestSearch(t *testing.T) {
	set, rt, _, dir := setup(t)
	os.MkdirAll(filepath.Join(dir, "src/.git"), 0o755)
	os.WriteFile(filepath.Join(dir, "src/a.py"), []byte("import os\nTODO one\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "src/b.go"), []byte("// TODO two\n// TODO three\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "src/.git/c"), []byte("TODO hidden\n"), 0o644)
	r := call(t, set, rt, "search_files", `{"pattern":"TODO","path":"src"}`)
	if r["total_count"] != float64(3) {
		t.Fatalf("content: %v", r)
	}
	r = call(t, set, rt, "search_files", `{"pattern":"TODO","path":"src","file_glob":"*.go","limit":1}`)
	if r["total_count"] != float64(2) || r["truncated"] != true || len(r["matches"].([]any)) != 1 {
		t.Fatalf("glob/pagination: %v", r)
	}
	m := r["matches"].([]any)[0].(map[string]any)
	if m["path"] != dir+"/src/b.go" || m["line"] != float64(1) || m["content"] != "// TODO two" {
		t.Fatalf("match: %v", m)
	}
	r = call(t, set, rt, "search_files", `{"pattern":"TODO","path":"src","output_mode":"count"}`)
	if r["counts"].(map[string]any)[dir+"/src/b.go"] != float64(2) {
		t.Fatalf("count: %v", r)
	}
	r = call(t, set, rt, "search_files", `{"pattern":"*.py","target":"files","path":"."}`)
	if r["total_count"] != float64(1) || r["files"].([]any)[0] != dir+"/src/a.py" {
		t.Fatalf("files: %v", r)
	}
	r = call(t, set, rt, "search_files", `{"pattern":"x","path":"nowhere"}`)
	if !strings.Contains(r["error"].(string), "Path not found") {
		t.Fatalf("missing path: %v", r)
	}
}

func TestTodo(t *testing.T) {
	set, rt, _, _ := setup(t)
	r := call(t, set, rt, "todo", `{"todos":[{"id":"1","content":"a","status":"pending"},{"id":"2","content":"b","status":"in_progress"}]}`)
	if r["summary"].(map[string]any)["total"] != float64(2) {
		t.Fatalf("%v", r)
	}
	r = call(t, set, rt, "todo", `{"todos":"[{\"id\":\"1\",\"content\":\"a\",\"status\":\"completed\"}]","merge":"true"}`)
	s := r["summary"].(map[string]any)
	if s["completed"] != float64(1) || s["in_progress"] != float64(1) || s["total"] != float64(2) {
		t.Fatalf("merge: %v", r)
	}
}

func TestBudget(t *testing.T) {
	set, rt, _, _ := setup(t)
	b := DefaultBudget()
	b.Dir = t.TempDir()
	term, _ := set.Tool("terminal")
	content := strings.Repeat("line of output\n", 10_000) // 150,000 chars
	got := b.ApplyResult(context.Background(), rt, term, "call_9", content)
	if !strings.HasPrefix(got, "<persisted-output>\nThis tool result was too large (150000 characters, 146.5 KB).\nFull output saved to: "+b.Dir+"/call_9.txt\n") {
		t.Fatalf("spill: %s", got[:200])
	}
	if saved, _ := os.ReadFile(b.Dir + "/call_9.txt"); string(saved) != content {
		t.Fatal("spilled file differs")
	}
	rf, _ := set.Tool("read_file")
	if b.ApplyResult(context.Background(), rt, rf, "c", content) != content {
		t.Fatal("read_file must never spill")
	}
	b.Overrides = map[string]int{"terminal": 10}
	if !strings.Contains(b.ApplyResult(context.Background(), rt, term, "c2", "0123456789ab"), "<persisted-output>") {
		t.Fatal("override ignored")
	}
	// Turn budget: 3 × 80,000 = 240,000 > 200,000 → the largest spills.
	ids := []string{"a", "b", "c"}
	contents := []string{strings.Repeat("a", 80_000), strings.Repeat("b", 90_000), strings.Repeat("c", 70_000)}
	b.ApplyTurn(context.Background(), rt, ids, contents)
	if !strings.Contains(contents[1], "<persisted-output>") || strings.Contains(contents[0], "<persisted") || strings.Contains(contents[2], "<persisted") {
		t.Fatal("turn budget must spill exactly the largest result")
	}
	// A dead sandbox falls back to a truncated preview.
	rt.Sandbox.(*hostSandbox).dead = true
	got = DefaultBudget().ApplyResult(context.Background(), rt, term, "c3", content)
	if !strings.Contains(got, "[Truncated: tool response was 150000 chars. Full output could not be saved to sandbox.]") {
		t.Fatalf("fallback: %s", got[len(got)-200:])
	}
}

func TestInfraErrors(t *testing.T) {
	set, rt, sb, _ := setup(t)
	sb.dead = true
	for _, tc := range []struct{ tool, args string }{
		{"terminal", `{"command":"ls"}`},
		{"read_file", `{"path":"/x"}`},
		{"write_file", `{"path":"/tmp/x","content":"a"}`},
		{"search_files", `{"pattern":"a","path":"/"}`},
	} {
		c, err := set.Prepare("c", tc.tool, tc.args)
		if err != nil {
			t.Fatal(err)
		}
		_, err = set.Execute(context.Background(), rt, c)
		if !errors.Is(err, sandbox.ErrUnavailable) || !IsInfra(err) {
			t.Errorf("%s: want infra error, got %v", tc.tool, err)
		}
	}
}

func TestUnifiedDiff(t *testing.T) {
	a := "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n"
	b := "1\n2\nthree\n4\n5\n6\n7\n8\n9\n10\n11\ntwelve\nthirteen"
	want := "--- a/f\n+++ b/f\n@@ -1,6 +1,6 @@\n 1\n 2\n-3\n+three\n 4\n 5\n 6\n@@ -9,4 +9,5 @@\n 9\n 10\n 11\n-12\n+twelve\n+thirteen\n\\ No newline at end of file\n"
	if got := UnifiedDiff("f", a, b); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func TestTruncateHeadTail(t *testing.T) {
	s := strings.Repeat("é", 100)
	got := TruncateHeadTail(s, 10, 0)
	if got != "éééé\n\n... [OUTPUT TRUNCATED - 90 chars omitted out of 100 total] ...\n\néééééé" {
		t.Fatalf("%q", got)
	}
}

func TestBudgetWithoutSandbox(t *testing.T) {
	set, _ := Default().Resolve(nil, nil)
	term, _ := set.Tool("terminal")
	got := DefaultBudget().ApplyResult(context.Background(), NewRuntime(nil, "x"), term, "c", strings.Repeat("y", 200_000))
	if !strings.Contains(got, "Full output could not be saved to sandbox.") {
		t.Fatalf("%.100s", got)
	}
}
