package jsonscan

import (
	"encoding/json"
	"testing"
)

func TestUnquote(t *testing.T) {
	for raw, want := range map[string]string{
		`""`:                          "",
		`"plain"`:                     "plain",
		`"a\nb\tc\"d\\e\/f\bg\fh\ri"`: "a\nb\tc\"d\\e/f\bg\fh\ri",
		`"\u00e9\u4e2d\ud83d\ude00x"`: "é中😀x",
		`"é and 中"`:                   "é and 中",
		`"\u0000"`:                    "\x00",
	} {
		got, ok := Unquote([]byte(raw))
		if !ok || got != want {
			t.Errorf("Unquote(%s) = %q, %v; want %q", raw, got, ok, want)
		}
	}
	// Left to the full decoder: errors, and what it repairs.
	for _, raw := range []string{`"`, `x`, `"a"b"`, "\"a\nb\"", `"\x"`, `"\u12"`, `"\ud83d"`, `"\ude00"`, `"\ud83dx"`, `"\ud83d\u0041"`, "\"\xff\"", `"a\"`, `"\'"`} {
		if got, ok := Unquote([]byte(raw)); ok {
			t.Errorf("Unquote(%q) = %q, ok; want it left to the decoder", raw, got)
		}
	}
}

// FuzzUnquote: whatever Unquote decodes, encoding/json decodes the same.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{`"a\nb"`, `"\u00e9\ud83d\ude00"`, `"\"\\\/"`, `"\ud83d"`, `"x`, "\"\xff\"", `"abc"`, `"a"b"`, "\"a\tb\"", `""`, `x"`, `"é"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := Unquote([]byte(s))
		if !ok {
			return
		}
		var want string
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			t.Fatalf("Unquote(%q) = %q, but encoding/json refuses it: %v", s, got, err)
		}
		if got != want {
			t.Fatalf("Unquote(%q) = %q, encoding/json %q", s, got, want)
		}
	})
}
