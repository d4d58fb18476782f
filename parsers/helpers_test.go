package parsers

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// checkFreshIDs draws n ids from gen: each must have the shape and none
// may repeat.
func checkFreshIDs(t *testing.T, n int, gen func() string, shape func(string) bool, what string) {
	t.Helper()
	seen := map[string]bool{}
	for range n {
		id := gen()
		if !shape(id) {
			t.Fatalf("id %q is not %s", id, what)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
	}
}

func TestNewCallID(t *testing.T) {
	checkFreshIDs(t, 100, NewCallID, isCallID, "call_ + 24 lowercase hex")
}

func TestNewMistralCallID(t *testing.T) {
	checkFreshIDs(t, 1000, NewMistralCallID, isMistralCallID, "9 alphanumerics")
	// Every position draws from all 62 symbols (one draw makes the whole
	// id, so a slip in its base-62 digits would starve some position).
	var seen [9]map[byte]bool
	for i := range seen {
		seen[i] = map[byte]bool{}
	}
	for range 3000 {
		id := NewMistralCallID()
		for i := range seen {
			seen[i][id[i]] = true
		}
	}
	for i := range seen {
		if len(seen[i]) != 62 {
			t.Fatalf("position %d drew %d of the 62 symbols", i, len(seen[i]))
		}
	}
	p, err := Get("mistral")
	if err != nil {
		t.Fatal(err)
	}
	if id := NewCallIDFor(p); !isMistralCallID(id) {
		t.Fatalf("NewCallIDFor(mistral) = %q", id)
	}
	h, err := Get("hermes")
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []Parser{h, nil} {
		if id := NewCallIDFor(other); !isCallID(id) {
			t.Fatalf("NewCallIDFor(%T) = %q", other, id)
		}
	}
	// A model that gives the same [CALL_ID] twice: the second call gets a
	// fresh id of the family's shape.
	r := p.Parse(`[TOOL_CALLS]f[CALL_ID]abcdefghi[ARGS]{"a":1}[TOOL_CALLS]g[CALL_ID]abcdefghi[ARGS]{"b":2}`, nil)
	if len(r.ToolCalls) != 2 || r.ToolCalls[0].ID != "abcdefghi" || r.ToolCalls[1].ID == "abcdefghi" || !isMistralCallID(r.ToolCalls[1].ID) {
		t.Fatalf("repeated native id: %+v (errors %+v)", r.ToolCalls, r.Errors)
	}
}

func TestParamTypes(t *testing.T) {
	tools := []ToolSchema{{Name: "f", Parameters: json.RawMessage(`{"type":"object","properties":{
		"s":{"type":"string"},
		"i":{"type":"int64"},
		"n":{"type":["number","null"]},
		"e":{"enum":[1,"a",null]},
		"u":{"anyOf":[{"type":"object"},{"oneOf":[{"type":"array"}]}]},
		"d":{"type":"dict"},
		"x":{"description":"nothing typed"}
	}}`)}}
	for _, tc := range []struct {
		fn, param string
		want      []string
	}{
		{"f", "s", []string{"string"}},
		{"f", "i", []string{"integer"}},
		{"f", "n", []string{"number", "null"}},
		{"f", "e", []string{"integer", "string", "null"}},
		{"f", "u", []string{"object", "array"}},
		{"f", "d", []string{"object"}},
		{"f", "x", []string{"string"}},
		{"f", "missing", []string{"string"}},
		{"g", "s", []string{"string"}},
	} {
		got := paramTypes(tools, tc.fn, tc.param)
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("paramTypes(%s.%s) = %v, want %v", tc.fn, tc.param, got, tc.want)
		}
	}
}

func TestCoerceValue(t *testing.T) {
	for _, tc := range []struct {
		raw   string
		types []string
		want  string
	}{
		{"123", []string{"string"}, `"123"`},
		{"123", []string{"string", "integer"}, `123`},
		{"null", []string{"integer", "null"}, `null`},
		{"NULL", []string{"integer", "null"}, `null`},
		{"null", []string{"string"}, `"null"`},
		{"none", []string{"string", "null"}, `"none"`},
		{"some text", []string{"string", "integer", "null"}, `"some text"`},
		{"5.0", []string{"number"}, `5`},
		{"2.5", []string{"number"}, `2.5`},
		{" 42 ", []string{"integer"}, `42`},
		{"1", []string{"boolean"}, `true`},
		{"False", []string{"boolean"}, `false`},
		{`{"a": [1, 2]}`, []string{"object"}, `{"a":[1,2]}`},
		{`[1, "x"]`, []string{"array"}, `[1,"x"]`},
		{"abc", []string{"integer"}, `"abc"`},
		{"[1,2]", []string{"integer"}, `[1,2]`},
		{"héllo \"q\"\n<b>", []string{"string"}, `"héllo \"q\"\n<b>"`},
		{"NaN", []string{"number"}, `"NaN"`},
	} {
		got := string(coerceValue(tc.raw, tc.types))
		if got != tc.want {
			t.Errorf("coerceValue(%q, %v) = %s, want %s", tc.raw, tc.types, got, tc.want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("coerceValue(%q) = %s is not JSON", tc.raw, got)
		}
	}
}

func TestArgsBuilder(t *testing.T) {
	var a argsBuilder
	if a.String() != "{}" {
		t.Fatalf("empty builder = %s", a.String())
	}
	a.addString("z", "é<&>\x01")
	a.add("a", json.RawMessage("1"))
	a.add("z", json.RawMessage("true"))
	if got, want := a.String(), `{"z":true,"a":1}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	var b argsBuilder
	b.addString("k\"", "é<&>\x01\xff")
	if got, want := b.String(), `{"k\"":"é<&>\u0001`+"\ufffd"+`"}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestNormalizeArgs(t *testing.T) {
	for _, tc := range []struct {
		raw, want, err string
	}{
		{`{ "b": 1, "a": "é<>" }`, `{"b":1,"a":"é<>"}`, ""},
		{"  {}\n", `{}`, ""},
		{` { "a" : "x y\" z\\" ,` + "\n\t" + `"b":[1, 2, {"c" : "\u00e9 "}] }`, `{"a":"x y\" z\\","b":[1,2,{"c":"\u00e9 "}]}`, ""},
		{`{"a":"no space"}`, `{"a":"no space"}`, ""},
		{`[1,2]`, "", "JSON array, not an object"},
		{`"x"`, "", "JSON string, not an object"},
		{`42`, "", "JSON integer, not an object"},
		{``, "", "empty"},
		{`{"a": 1`, "", "truncated"},
		{`{"a": 1}}`, "", "invalid JSON at offset"},
		{`{"a": tru}`, "", "invalid JSON at offset"},
		{`not json`, "", "invalid JSON at offset"},
	} {
		got, err := normalizeArgs(tc.raw)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("normalizeArgs(%q) err = %v, want containing %q", tc.raw, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("normalizeArgs(%q) = %q, %v; want %q", tc.raw, got, err, tc.want)
		}
	}
}

func TestTextPtrAndSnippet(t *testing.T) {
	if textPtr(" \n ") != nil {
		t.Error("textPtr(blank) != nil")
	}
	if p := textPtr(" a "); p == nil || *p != "a" {
		t.Errorf("textPtr(' a ') = %v", p)
	}
	long := strings.Repeat("é", 500)
	s := snippet(long)
	if len(s) > snippetMax+16 || !strings.Contains(s, "…") {
		t.Errorf("snippet length %d", len(s))
	}
	if snippet("short") != "short" {
		t.Error("short snippet changed")
	}
}

// The word-at-a-time skips must stop exactly where the byte tables do: every
// byte value, at every position of a word and in the tail, after runs of
// plain text or of other special bytes.
func TestSkipPlainRuns(t *testing.T) {
	tableSkip := func(table *[256]bool, s string, i int) int {
		for i < len(s) && table[s[i]] {
			i++
		}
		return i
	}
	for c := range 256 {
		for pos := range 20 {
			for _, fill := range []byte{'a', '\\', 0xe9} {
				buf := []byte(strings.Repeat("x", 20))
				buf[pos] = byte(c)
				buf[min(pos+3, 19)] = fill
				s := string(buf)
				for from := range 3 {
					if got, want := skipStrPlain(s, from), tableSkip(&strPlain, s, from); got != want {
						t.Fatalf("skipStrPlain(%q, %d) = %d, want %d", s, from, got, want)
					}
					if got, want := skipASCIIPlain(s, from), tableSkip(&asciiPlain, s, from); got != want {
						t.Fatalf("skipASCIIPlain(%q, %d) = %d, want %d", s, from, got, want)
					}
				}
			}
		}
	}
}

func TestIsASCII(t *testing.T) {
	for n := range 20 {
		for pos := range n {
			for _, c := range []byte{0x00, 0x7f, 0x80, 0xc3, 0xff} {
				buf := []byte(strings.Repeat("a", n))
				buf[pos] = c
				if got, want := isASCII(string(buf)), c < 0x80; got != want {
					t.Fatalf("isASCII(%q) = %v", buf, got)
				}
			}
		}
	}
}

// scanCompact validates like scanValue and compacts like json.Compact (which
// neither escapes nor reorders).
func TestScanCompact(t *testing.T) {
	for _, s := range []string{
		`{}`, `[]`, `"x"`, `-1.5e3`, `true`, `null`,
		`{"a":1,"b":[1,2]}`,
		"{ \"a\" :\t1 ,\n\"b\" : [ 1 , 2 , { } , [ ] ] }",
		` {"s": "  spaced  \" \\ \n ", "u": "é\u00e9<&>"}`,
		`[ "x" , {"k" : null} ]  trailing`,
		`{"a": 1`, `{"a" 1}`, `{"a": [1, 2,]}`, `{"a": "x` + "\x01" + `"}`, `[1 2]`, ` `,
		// Around the size of scanCompact's stack room, and far past it.
		`{"a": "` + strings.Repeat("x", 494) + `", "b": 1}`,
		`{"a": "` + strings.Repeat("x", 495) + `", "b": 1}`,
		`{"a": "` + strings.Repeat("x", 496) + `", "b": 1}`,
		"{\n  \"a\": \"" + strings.Repeat("y ", 3000) + "\",\n  \"b\": [1, 2]\n}",
	} {
		for i := range 2 {
			if i >= len(s) {
				continue
			}
			end, out, err := scanCompact(s, i)
			wantEnd, wantErr := scanValue(s, i)
			if end != wantEnd || (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
				t.Fatalf("scanCompact(%q, %d) = %d, %v; scanValue gives %d, %v", s, i, end, err, wantEnd, wantErr)
			}
			if err != nil {
				continue
			}
			var want bytes.Buffer
			if err := json.Compact(&want, []byte(s[i:end])); err != nil {
				t.Fatal(err)
			}
			if out != want.String() {
				t.Errorf("scanCompact(%q, %d) = %q, want %q", s, i, out, want.String())
			}
		}
	}
}
