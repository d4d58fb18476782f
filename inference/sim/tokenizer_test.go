package sim

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTokenizerRoundTrip(t *testing.T) {
	tok := NewTokenizer()
	cases := []struct {
		name  string
		text  string
		wantN int // expected number of ids
	}{
		{"empty", "", 0},
		{"ascii", "ls -la", 6},
		{"marker", "<|im_start|>", 1},
		{"marker_in_text", "a<tool_call>b", 3},
		{"longest_match", "<|im_start|>assistant\n", 11},
		{"partial_marker", "<|im_star", 9},
		{"unicode", "héllo ✓", 10},
		{"deepseek", "<｜tool▁calls▁begin｜>x", 2},
		{"adjacent", "</think><tool_call></tool_call>", 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ids := tok.Encode(tc.text)
			if len(ids) != tc.wantN {
				t.Errorf("Encode(%q) = %v (%d ids), want %d ids", tc.text, ids, len(ids), tc.wantN)
			}
			got, err := tok.Decode(ids, false)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.text {
				t.Errorf("Decode(Encode(%q)) = %q", tc.text, got)
			}
		})
	}
}

func TestTokenizerSpecials(t *testing.T) {
	tok := NewTokenizer()
	// Every marker is one id, ids are stable and distinct from bytes.
	seen := map[int]string{}
	for i, sp := range vocabSpecials {
		ids := tok.Encode(sp.text)
		if len(ids) != 1 || ids[0] != 256+i {
			t.Errorf("marker %q encodes to %v, want [%d]", sp.text, ids, 256+i)
		}
		if prev, dup := seen[ids[0]]; dup {
			t.Errorf("markers %q and %q share id %d", prev, sp.text, ids[0])
		}
		seen[ids[0]] = sp.text
	}
	if id, _ := tok.ID("<|im_end|>"); id != 258 {
		t.Errorf("<|im_end|> id %d, want 258 (ids are part of the golden contract)", id)
	}
	// skip_special_tokens drops control markers but keeps added ones.
	ids := tok.Encode("<|im_start|>assistant\n<think>x</think><|im_end|>")
	got, err := tok.Decode(ids, true)
	if err != nil {
		t.Fatal(err)
	}
	if got != "assistant\n<think>x</think>" {
		t.Errorf("skip-special decode = %q", got)
	}
	if _, err := tok.Decode([]int{tok.VocabSize()}, false); err == nil {
		t.Error("out-of-vocabulary id decoded without error")
	}
	if _, err := tok.Decode([]int{-1}, false); err == nil {
		t.Error("negative id decoded without error")
	}
	if s := tok.TokenString(0xe2); !strings.HasPrefix(s, "bytes:") {
		t.Errorf("partial UTF-8 byte shown as %q", s)
	}
}

func FuzzTokenizerRoundTrip(f *testing.F) {
	for _, s := range []string{"", "hello", "<|im_start|>user\nhi<|im_end|>\n", "<<think>>", "<｜User｜>é", "[INST][/INST]</s>"} {
		f.Add(s)
	}
	tok := NewTokenizer()
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		got, err := tok.Decode(ids, false)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if got != s {
			t.Fatalf("round trip %q -> %v -> %q", s, ids, got)
		}
		// Re-encoding the decoded text is stable (no marker can appear or
		// vanish across a round trip).
		again := tok.Encode(got)
		if len(again) != len(ids) {
			t.Fatalf("re-encode changed length: %v vs %v", ids, again)
		}
		if utf8.ValidString(s) && len(ids) > len(s) {
			t.Fatalf("more ids than bytes: %d > %d", len(ids), len(s))
		}
	})
}
