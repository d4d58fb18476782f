package render

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func tinySource(t *testing.T, pre string) *Source {
	t.Helper()
	src, err := ReadGGUF(writeFile(t, tinyGGUF(t, pre)))
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// ids returns the ids of token texts (byte-level form) in tok.
func ids(t *testing.T, tok *Tokenizer, texts ...string) []int32 {
	t.Helper()
	out := []int32{}
	for _, s := range texts {
		id, ok := tok.vocab[s]
		if !ok {
			t.Fatalf("no token %q", s)
		}
		out = append(out, id)
	}
	return out
}

func TestEncodeTiny(t *testing.T) {
	tok := tinySource(t, "qwen2").Tokenizer
	cases := []struct {
		text string
		want []string
	}{
		{"hello world", []string{"hello", "Ġworld"}},
		{"hello  world", []string{"hello", "Ġ", "Ġworld"}},                    // \s+(?!\S) leaves one space to the word
		{"hello   ", []string{"hello", "ĠĠ", "Ġ"}},                            // trailing run: "ĠĠ" merges first, leftmost
		{"hell", []string{"hell"}},                                            // merges stop when no rank applies
		{"122", []string{"1", "2", "2"}},                                      // qwen2: one digit per pre-token, "12" never merges
		{"hé", []string{"h", byteLevel[0xc3], byteLevel[0xa9]}},               // bytes of é
		{"\xff", []string{byteLevel[0xef], byteLevel[0xbf], byteLevel[0xbd]}}, // invalid UTF-8 is U+FFFD
		{"<think>", []string{"<", "t", "h", "i", "n", "k", ">"}},              // parseSpecial off below
	}
	for _, c := range cases {
		got, err := tok.Encode(c.text, false)
		if err != nil {
			t.Fatal(err)
		}
		if want := ids(t, tok, c.want...); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v %q", c.text, got, want, c.want)
		}
	}
	// llama-bpe: "\p{N}{1,3}" keeps "12" together, so the merge applies.
	tok3 := tinySource(t, "llama-bpe").Tokenizer
	if got, want := mustEncode(t, tok3, "122", false), ids(t, tok3, "12", "2"); !slices.Equal(got, want) {
		t.Errorf("llama-bpe Encode(122) = %v, want %v", got, want)
	}
}

func mustEncode(t *testing.T, tok *Tokenizer, s string, special bool) []int32 {
	t.Helper()
	got, err := tok.Encode(s, special)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestEncodeSpecial(t *testing.T) {
	tok := tinySource(t, "qwen2").Tokenizer
	got := mustEncode(t, tok, "<|im_start|>hello<think></think><tool_call><|im_end|><x>", true)
	want := ids(t, tok, "<|im_start|>", "hello", "<think>", "</think>", "<tool_call>", "<|im_end|>")
	// <x> is "unused" (type 5): ordinary text.
	want = append(want, ids(t, tok, "<", "x", ">")...)
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got := mustEncode(t, tok, "", true); len(got) != 0 {
		t.Errorf("empty text: %v", got)
	}
	// Fragments are pre-tokenised apart: the space before <think> does not
	// join "hello".
	got = mustEncode(t, tok, " <think>hello", true)
	if want := ids(t, tok, "Ġ", "<think>", "hello"); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// Overlapping added tokens: llama.cpp takes the longest token first
// anywhere in the text; Hugging Face the leftmost match, longest there.
func TestAddedTokenOrder(t *testing.T) {
	vocab := map[string]int32{}
	for b := range 256 {
		vocab[byteLevel[b]] = int32(b)
	}
	lp, _ := llamaPreTokenizer("qwen2")
	added := []addedToken{{"xA", 300}, {"ABC", 301}}
	for _, c := range []struct {
		leftmost bool
		want     []int32
	}{{false, []int32{'x', 301}}, {true, []int32{300, 'B', 'C'}}} {
		tok, err := newTokenizer(tokenizerSpec{vocab: vocab, size: 302, pre: lp.pre, added: added, leftmost: c.leftmost})
		if err != nil {
			t.Fatal(err)
		}
		if got := mustEncode(t, tok, "xABC", true); !slices.Equal(got, c.want) {
			t.Errorf("leftmost=%v: got %v, want %v", c.leftmost, got, c.want)
		}
	}
}

func TestEncodeCacheAndConcurrency(t *testing.T) {
	tok := tinySource(t, "qwen2").Tokenizer
	text := strings.Repeat("hello world <|im_start|> 12 héllo\n", 50)
	want := mustEncode(t, tok, text, true)
	done := make(chan []int32)
	for range 4 {
		go func() {
			got, _ := tok.Encode(text, true)
			done <- got
		}()
	}
	for range 4 {
		if got := <-done; !slices.Equal(got, want) {
			t.Fatal("concurrent Encode differs")
		}
	}
	long := strings.Repeat(" ", 5000) + strings.Repeat("hello", 3000)
	// 4999 spaces are 2499 "ĠĠ" and a "Ġ"; then "Ġ" (no "Ġ h" merge) and 3000 "hello".
	if got := mustEncode(t, tok, long, false); len(got) != 2500+1+3000 {
		t.Errorf("long input: %d ids", len(got))
	}
}

// hfDir writes tokenizer.json and tokenizer_config.json with the tiny
// GGUF's vocabulary; edit changes tokenizer.json before it is written.
func hfDir(t *testing.T, edit func(tj map[string]any), cfg map[string]any) string {
	t.Helper()
	meta, err := readGGUFPath(writeFile(t, tinyGGUF(t, "qwen2")))
	if err != nil {
		t.Fatal(err)
	}
	tokens := meta[keyTokens].([]string)
	types := meta[keyTokenType].([]int64)
	vocab := map[string]int{}
	added := []map[string]any{}
	for i, s := range tokens {
		if types[i] == tokControl || types[i] == tokUserDefined {
			added = append(added, map[string]any{"id": i, "content": s, "special": types[i] == tokControl})
			continue
		}
		vocab[s] = i
	}
	merges := []any{}
	for i, m := range meta[keyMerges].([]string) {
		if i%2 == 0 {
			merges = append(merges, m)
		} else {
			a, b, _ := strings.Cut(m, " ")
			merges = append(merges, []string{a, b})
		}
	}
	tj := map[string]any{
		"added_tokens": added,
		"normalizer":   map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": reQwen2HF}, "behavior": "Isolated"},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<|endoftext|>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": merges, "dropout": nil},
	}
	if edit != nil {
		edit(tj)
	}
	dir := t.TempDir()
	for name, v := range map[string]any{"tokenizer.json": tj, "tokenizer_config.json": cfg} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestReadHF(t *testing.T) {
	dir := hfDir(t, nil, map[string]any{"bos_token": map[string]any{"content": "<|endoftext|>"}, "eos_token": "<|im_end|>",
		"chat_template": []any{map[string]any{"name": "tool_use", "template": "T"}, map[string]any{"name": "default", "template": "D"}}})
	src, err := ReadHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	if src.BOS != "<|endoftext|>" || src.BOSID != 267 || src.EOS != "<|im_end|>" || !src.AddBOS || src.ChatTemplate != "D" {
		t.Errorf("source %+v", src)
	}
	gg := tinySource(t, "qwen2").Tokenizer
	for _, s := range []string{"hello  world<|im_start|>12 <think>", "e\u0301", "hello   "} {
		want := mustEncode(t, gg, strings.ReplaceAll(s, "e\u0301", "é"), true) // NFC composes e + U+0301
		if got := mustEncode(t, src.Tokenizer, s, true); !slices.Equal(got, want) {
			t.Errorf("hf Encode(%q) = %v, gguf %v", s, got, want)
		}
	}
	// add_bos_token in the config wins over the post-processor; a
	// chat_template.jinja serves when the config has none.
	dir = hfDir(t, nil, map[string]any{"add_bos_token": false})
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("J"), 0o644); err != nil {
		t.Fatal(err)
	}
	if src, err = ReadHF(dir); err != nil || src.AddBOS || src.ChatTemplate != "J" || src.BOSID != -1 {
		t.Errorf("source %+v, %v", src, err)
	}
}

func TestReadHFErrors(t *testing.T) {
	set := func(path string, v any) func(map[string]any) {
		return func(tj map[string]any) {
			keys := strings.Split(path, ".")
			m := tj
			for _, k := range keys[:len(keys)-1] {
				m = m[k].(map[string]any)
			}
			m[keys[len(keys)-1]] = v
		}
	}
	cases := []struct {
		name string
		edit func(map[string]any)
		want string
	}{
		{"unigram", set("model.type", "Unigram"), `tokenizer model "Unigram" is not supported: only byte-level BPE`},
		{"wordpiece", set("model.type", "WordPiece"), `"WordPiece" is not supported`},
		{"byte fallback", set("model.byte_fallback", true), "byte_fallback"},
		{"lowercase", set("normalizer", map[string]any{"type": "Lowercase"}), `normalizer "Lowercase" is not supported`},
		{"metaspace", set("pre_tokenizer", map[string]any{"type": "Metaspace"}), `pre_tokenizer "Metaspace" is not supported`},
		{"no byte level", set("pre_tokenizer", map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "a"}, "behavior": "Isolated"}), "no ByteLevel step"},
		{"removed", set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "a"}, "behavior": "Removed"}, map[string]any{"type": "ByteLevel"}}}), `behavior "Removed"`},
		{"prefix space", set("pre_tokenizer", map[string]any{"type": "ByteLevel", "add_prefix_space": true}), "add_prefix_space"},
		{"bad regex", set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(a"}, "behavior": "Isolated"}, map[string]any{"type": "ByteLevel"}}}), "pre-tokenizer regex"},
		{"lstrip", set("added_tokens", []any{map[string]any{"id": 1, "content": "<m>", "lstrip": true}}), "lstrip/rstrip/single_word are not supported"},
		{"bad merge", set("model.merges", []any{[]string{"a"}}), "merge 0"},
		{"decoder", set("decoder", map[string]any{"type": "Metaspace"}), `decoder "Metaspace" is not supported`},
		{"not json", nil, "tokenizer.json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := hfDir(t, c.edit, map[string]any{})
			if c.edit == nil {
				if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte("{"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err := ReadHF(dir)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "render: read hf ") {
				t.Errorf("err %v, want it to contain %q", err, c.want)
			}
		})
	}
	dir := hfDir(t, nil, map[string]any{})
	if err := os.Remove(filepath.Join(dir, "tokenizer_config.json")); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadHF(dir); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") {
		t.Errorf("missing config: %v", err)
	}
	if _, err := ReadHF(t.TempDir()); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("missing tokenizer.json: %v", err)
	}
	var nilTok *Tokenizer
	if _, err := nilTok.Encode("x", true); err == nil {
		t.Error("nil Tokenizer: no error")
	}
}
