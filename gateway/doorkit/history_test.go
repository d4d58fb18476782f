package doorkit

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// HistoryCache decodes only what follows the longest run of leading
// elements seen before; its results are always what decoding every element
// gives, whatever the history did (grew, was rewritten, shrank).
func TestHistoryCache(t *testing.T) {
	var c HistoryCache[string]
	decoded := 0
	decode := func(i int, raw []byte) (string, error) {
		decoded++
		if string(raw) == "bad" {
			return "", errors.New("bad element")
		}
		return fmt.Sprintf("%d:%s", i, raw), nil
	}
	want := func(elems [][]byte) []string {
		var out []string
		for i, e := range elems {
			out = append(out, fmt.Sprintf("%d:%s", i, e))
		}
		return out
	}
	el := func(ss ...string) [][]byte {
		var out [][]byte
		for _, s := range ss {
			out = append(out, []byte(s))
		}
		return out
	}
	for _, step := range []struct {
		elems   [][]byte
		decodes int // elements decoded by this call
	}{
		{el("sys", "user"), 2},
		{el("sys", "user", "reply", "tool"), 2},                    // extends: 2 new
		{el("sys", "user", "reply", "tool", "reply2", "tool2"), 2}, // again
		{el("sys", "user", "reply", "tool"), 4},                    // the extended entry replaced it: all again
		{el("sys", "summary", "reply3"), 3},                        // rewritten after the first: nothing shared stored
		{el("sys", "summary", "reply3", "tool3"), 1},
		{el("sy", "s", "summary", "reply3"), 4}, // the same bytes cut differently: no reuse
	} {
		decoded = 0
		got, err := c.Decode(step.elems, decode)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want(step.elems)) {
			t.Fatalf("%q: got %q, want %q", step.elems, got, want(step.elems))
		}
		if decoded != step.decodes {
			t.Fatalf("%q: decoded %d elements, want %d", step.elems, decoded, step.decodes)
		}
		got[0] = "changed by the caller" // the cache keeps its own copy
	}
	// An error is returned and nothing is cached.
	if _, err := c.Decode(el("sys", "summary", "reply3", "tool3", "bad"), decode); err == nil {
		t.Fatal("no error for a bad element")
	}
	decoded = 0
	if got, _ := c.Decode(el("sys", "summary", "reply3", "tool3", "ok"), decode); decoded != 1 || got[0] != "0:sys" {
		t.Fatalf("after an error: decoded %d, got %q", decoded, got)
	}
	// The bound: past MaxBytes the cache starts afresh.
	small := HistoryCache[string]{MaxBytes: 8}
	small.Decode(el("aaaa", "bbbb"), decode)
	small.Decode(el("cccc", "dddd"), decode)
	decoded = 0
	small.Decode(el("aaaa", "bbbb", "x"), decode)
	if decoded != 3 {
		t.Fatalf("over MaxBytes: decoded %d, want 3 (the first entry dropped)", decoded)
	}
}
