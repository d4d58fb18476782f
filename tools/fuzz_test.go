package tools

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzPrepare: any arguments string yields either a validated call or an
// invalid-call error whose message is a JSON object — never a panic.
func FuzzPrepare(f *testing.F) {
	set, err := Default().Resolve(nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{`{}`, `{"command":"ls"}`, `{"path":"a","offset":"2"}`, `[1]`, `"x"`, `{"todos":"[{\"id\":1}]"}`, `{"a":`, ``, `null`, `{"timeout":"1e400"}`} {
		for _, tool := range []string{"terminal", "read_file", "todo", "search_files", "nope"} {
			f.Add(tool, s)
		}
	}
	f.Fuzz(func(t *testing.T, tool, args string) {
		c, err := set.Prepare("id", tool, args)
		if err != nil {
			var ic *InvalidCallError
			if !errors.As(err, &ic) {
				t.Fatalf("error is not an InvalidCallError: %v", err)
			}
			var v map[string]any
			if json.Unmarshal([]byte(ic.Result), &v) != nil || v["error"] == nil {
				t.Fatalf("result is not an error object: %q", ic.Result)
			}
			return
		}
		if c.Args == nil {
			t.Fatal("validated call without arguments")
		}
	})
}

// FuzzParseV4A: the patch parser never panics, and what it accepts
// applies to an empty file without panicking either.
func FuzzParseV4A(f *testing.F) {
	f.Add("*** Begin Patch\n*** Update File: a\n@@ x\n ctx\n-old\n+new\n*** End Patch")
	f.Add("*** Begin Patch\n*** Add File: b\n+hi\n*** Delete File: c\n*** End Patch")
	f.Add("garbage")
	f.Fuzz(func(t *testing.T, text string) {
		ops, err := parseV4A(text)
		if err != nil {
			return
		}
		for _, o := range ops {
			_, _ = applyChunks("line one\nline two\n", o.chunks)
		}
	})
}
