package render_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/inference/render"
	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
	"github.com/rollout-rl/rollout/sandbox/image"
)

// TestRealEngine holds Encode to llama-server's /tokenize on the
// project's tiny Qwen3 GGUF: read with ReadGGUF, and rebuilt as a Hugging
// Face tokenizer.json read with ReadHF.
func TestRealEngine(t *testing.T) {
	e := llamacpptest.Start(t, llamacpptest.Options{})
	gguf := e.CopyFile(t, image.LlamacppModel, t.TempDir())
	src, err := render.ReadGGUF(gguf)
	if err != nil {
		t.Fatal(err)
	}
	checkGGUFSource(t, src)
	hf := writeHF(t, gguf, qwen2Regex)
	hfSrc, err := render.ReadHF(hf)
	if err != nil {
		t.Fatal(err)
	}
	if hfSrc.BOS != src.BOS || hfSrc.BOSID != src.BOSID || hfSrc.EOS != src.EOS || hfSrc.AddBOS != src.AddBOS {
		t.Errorf("ReadHF BOS %q/%d EOS %q AddBOS %v; ReadGGUF BOS %q/%d EOS %q AddBOS %v",
			hfSrc.BOS, hfSrc.BOSID, hfSrc.EOS, hfSrc.AddBOS, src.BOS, src.BOSID, src.EOS, src.AddBOS)
	}
	if hfSrc.Tokenizer.VocabSize() != src.Tokenizer.VocabSize() {
		t.Errorf("VocabSize: hf %d, gguf %d", hfSrc.Tokenizer.VocabSize(), src.Tokenizer.VocabSize())
	}

	corpus := append(fixedCorpus(), randomCorpus(300, 1)...)
	mismatches := 0
	for _, s := range corpus {
		want := toInt32(e.Tokenize(t, s))
		for _, c := range []struct {
			name string
			tok  *render.Tokenizer
		}{{"gguf", src.Tokenizer}, {"hf", hfSrc.Tokenizer}} {
			got, err := c.tok.Encode(s, true)
			if err != nil {
				t.Fatalf("%s: Encode(%q): %v", c.name, s, err)
			}
			if !slices.Equal(got, want) {
				mismatches++
				if mismatches <= 20 {
					t.Errorf("%s: Encode(%q, true)\n got %v\nwant %v (llama-server /tokenize)", c.name, s, got, want)
				}
			}
		}
	}
	t.Logf("compared %d strings with llama-server /tokenize through ReadGGUF and ReadHF: %d mismatches", len(corpus), mismatches)

	// Without parseSpecial every added token is text. llama.cpp's
	// parse_special=false still matches user-defined tokens (<think>,
	// <tool_call>, ...), so only strings without them are compared.
	userDefined := []string{"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"}
	compared := 0
	for _, s := range corpus {
		if slices.ContainsFunc(userDefined, func(u string) bool { return strings.Contains(s, u) }) {
			continue
		}
		var r struct{ Tokens []int }
		e.MustCall(t, "/tokenize", map[string]any{"content": s, "add_special": false, "parse_special": false}, &r)
		got, err := src.Tokenizer.Encode(s, false)
		if err != nil {
			t.Fatal(err)
		}
		if want := toInt32(r.Tokens); !slices.Equal(got, want) {
			t.Errorf("Encode(%q, false)\n got %v\nwant %v (llama-server /tokenize parse_special=false)", s, got, want)
		}
		compared++
	}
	t.Logf("compared %d strings without user-defined tokens with parse_special=false", compared)
}

func checkGGUFSource(t *testing.T, src *render.Source) {
	t.Helper()
	if src.EOS != "<|im_end|>" || src.BOS != "<|endoftext|>" || src.BOSID < 0 || src.AddBOS {
		t.Errorf("BOS %q (%d), EOS %q, AddBOS %v: want <|endoftext|>, <|im_end|>, false", src.BOS, src.BOSID, src.EOS, src.AddBOS)
	}
	if !strings.Contains(src.ChatTemplate, "<|im_start|>") {
		t.Errorf("chat template lacks <|im_start|>: %.200q", src.ChatTemplate)
	}
}

func toInt32(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// writeHF writes a Hugging Face tokenizer.json and tokenizer_config.json
// with the GGUF's vocabulary, merges and added tokens, and a Split
// pre-tokenizer with pattern, and returns their directory.
func writeHF(t testing.TB, gguf, pattern string) string {
	t.Helper()
	tokens, types, merges, err := render.GGUFVocab(gguf)
	if err != nil {
		t.Fatal(err)
	}
	return writeHFDir(t, tokens, types, merges, splitPre(pattern), false)
}

// splitPre is tokenizer.json's pre-tokenizer for a Split with pattern
// followed by ByteLevel, as Qwen and Llama 3 have.
func splitPre(pattern string) any {
	return map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]string{"Regex": pattern}, "behavior": "Isolated", "invert": false},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
	}}
}

// writeHFDir writes tokenizer.json and tokenizer_config.json for the
// vocabulary (GGUF token types: 3 and 4 become added tokens) and returns
// their directory.
func writeHFDir(t testing.TB, tokens []string, types []int64, merges []string, pre any, ignoreMerges bool) string {
	t.Helper()
	vocab := map[string]int{}
	var added []map[string]any
	for i, tok := range tokens {
		switch types[i] {
		case 3, 4: // control, user-defined
			added = append(added, map[string]any{"id": i, "content": tok, "single_word": false,
				"lstrip": false, "rstrip": false, "normalized": false, "special": types[i] == 3})
		}
		vocab[tok] = i
	}
	pairs := make([][2]string, len(merges))
	for i, m := range merges {
		a, b, _ := strings.Cut(m, " ")
		pairs[i] = [2]string{a, b}
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
	tj := map[string]any{
		"version": "1.0", "added_tokens": added, "normalizer": nil, "pre_tokenizer": pre,
		"post_processor": byteLevel, "decoder": byteLevel,
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "",
			"end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignoreMerges,
			"vocab": vocab, "merges": pairs},
	}
	// The GGUF names BOS <|endoftext|>; so does Qwen's config.
	cfg := map[string]any{"add_bos_token": false, "eos_token": "<|im_end|>", "chat_template": "{{ '<|im_start|>' }}",
		"bos_token": map[string]any{"content": "<|endoftext|>", "special": true}}
	dir := t.TempDir()
	writeJSON(t, filepath.Join(dir, "tokenizer.json"), tj)
	writeJSON(t, filepath.Join(dir, "tokenizer_config.json"), cfg)
	return dir
}

// qwen2Regex is Qwen2's pre-tokenizer expression as its tokenizer.json
// spells it.
const qwen2Regex = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

func writeJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// fixedCorpus is hand-picked text: prose, code, JSON, whitespace runs,
// digits, contractions, scripts, emoji and the model's special tokens.
func fixedCorpus() []string {
	base := []string{
		"", " ", "  ", "\n", "\n\n", "\n\n  \t", " \n", "\t\t", "\r\n", "a\r\n\r\nb", "   leading", "trailing   ",
		"  both  ", "hello world", "Hello, World!", "The quick brown fox jumps over the lazy dog.",
		"1234567", "3.14159", "x=1234567890", "v1.2.3", "0xDEADBEEF", "2024-01-02T03:04:05Z",
		"don't I'll we're they've she'd it's", "DON'T I'LL WE'RE", "'s 't 're 've 'm 'll 'd", "rock'n'roll", "O'Neil's",
		"func main() {\n\tfmt.Println(\"hi\")\n}\n", "def f(x):\n    return x ** 2\n\n\nprint(f(3))",
		"if (a && b || !c) { return a->b; }", "SELECT * FROM t WHERE id = 42;",
		`{"name": "terminal", "arguments": {"command": "ls -la /tmp"}}`, `[1, 2, {"a": null, "b": true}]`,
		"<html><body class=\"x\">Hi</body></html>", "path/to/file_name.go:12:5: error",
		"中文测试，你好世界。", "日本語のテキスト", "한국어 텍스트", "Привет, мир!", "Ελληνικά", "עברית", "العربية",
		"हिन्दी", "ไทย", "café naïve résumé façade", "Ärger über Öl", "ñandú", "e\u0301", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
		"emoji 😀🎉👍🏽 and 👨‍👩‍👧‍👦", "🙂", "a😀b", "★☆♥ ← → ∑∫√", "€100 £5 ¥3", "½ ² ³ ⅓",
		"\u00a0nbsp\u00a0", "\u3000ideographic\u3000space", "zero\u200bwidth", "tab\there", "mixed 中文 and English 123",
		"!!!???...", "---===+++", "a  b   c    d", "word\n\n\nword", " \n \n ", "\t\n\t\n", "x \n", "end with space ",
		"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
		"<think>\nreasoning here\n</think>\n\nanswer",
		"<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>",
		"<tool_response>\nfile1\nfile2\n</tool_response>", "a<|im_start|>b", "<|im_end|><|im_end|>", "<|endoftext|>",
		"<|im_start|", "<think", "< think>", "<|im_start|><|im_start|>x", " <think> ", "x<tool_call>y</tool_call>z",
		"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>",
	}
	var out []string
	out = append(out, base...)
	// Variants: each with a leading space, a trailing newline, and doubled.
	for _, s := range base[:60] {
		out = append(out, " "+s, s+"\n", s+s)
	}
	return out
}

// randomCorpus draws n strings from a seeded generator over a mix of
// ASCII, whitespace, punctuation, digits, letters of several scripts,
// emoji and the special tokens.
func randomCorpus(n int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	pieces := []string{
		" ", "  ", "\n", "\t", "\r", "\n\n", "a", "b", "Z", "the", " the", "hello", "'s", "'LL", "'", "\"", "0", "7", "42",
		"12345", ".", ",", "!", "?", "-", "_", "(", ")", "{", "}", "[", "]", "<", ">", "/", "\\", ":", ";", "=", "+",
		"é", "ß", "中", "文", "あ", "한", "ж", "λ", "😀", "👍🏽", "\u00a0", "\u2003", "\u3000", "½", "²", "٣",
		"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<|endoftext|>",
		"\u0301", "\u200d", "~", "`", "^", "|", "$", "%", "#", "@", "&", "*",
	}
	out := make([]string, n)
	for i := range out {
		var b strings.Builder
		k := 1 + rng.IntN(24)
		for range k {
			if rng.IntN(8) == 0 {
				fmt.Fprintf(&b, "%c", rune(0x20+rng.IntN(0x3000)))
				continue
			}
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		out[i] = b.String()
	}
	return out
}

// BenchmarkEncode tokenises ~4 KB of mixed text (prose, code, JSON, CJK,
// emoji, whitespace runs, special tokens) with the tiny Qwen3 GGUF's
// tokenizer: "cold" empties the per-word cache before each run, "warm"
// keeps it; "regexp2" is cold with the Qwen2 expression run by regexp2
// (through ReadHF, the expression wrapped so it is not recognised)
// instead of the hand-written scanner. It reports ns/byte.
func BenchmarkEncode(b *testing.B) {
	e := llamacpptest.Start(b, llamacpptest.Options{})
	gguf := e.CopyFile(b, image.LlamacppModel, b.TempDir())
	src, err := render.ReadGGUF(gguf)
	if err != nil {
		b.Fatal(err)
	}
	slow, err := render.ReadHF(writeHF(b, gguf, "(?:"+qwen2Regex+")"))
	if err != nil {
		b.Fatal(err)
	}
	text := benchText(4096)
	if x, y := mustEncode(b, src.Tokenizer, text), mustEncode(b, slow.Tokenizer, text); !slices.Equal(x, y) {
		b.Fatalf("the scanner and regexp2 disagree on the benchmark text")
	}
	for _, c := range []struct {
		name string
		tok  *render.Tokenizer
		cold bool
	}{{"cold", src.Tokenizer, true}, {"warm", src.Tokenizer, false}, {"regexp2", slow.Tokenizer, true}} {
		tok := c.tok
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if c.cold {
					render.ResetCache(tok)
				}
				if _, err := tok.Encode(text, true); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(text)), "ns/byte")
		})
	}
}

func mustEncode(b *testing.B, tok *render.Tokenizer, s string) []int32 {
	ids, err := tok.Encode(s, true)
	if err != nil {
		b.Fatal(err)
	}
	return ids
}

// benchText is about n bytes of the fixed corpus, cut at a string
// boundary.
func benchText(n int) string {
	var sb strings.Builder
	for sb.Len() < n {
		for _, s := range fixedCorpus() {
			if sb.Len()+len(s) > n {
				return sb.String()
			}
			sb.WriteString(s)
		}
	}
	return sb.String()
}

// TestRealEnginePreTokenizers holds each supported GGUF pre-tokenizer to
// llama.cpp: the tiny Qwen3 GGUF is rewritten (same tensors) with a
// vocabulary whose merges cross the places where the pre-tokenizers
// differ (space runs, newlines, digits, contractions, punctuation before
// letters, scripts), and tokenizer.ggml.pre set to each name; a second
// llama-server in the engine's container serves each file. The same
// vocabulary as a tokenizer.json with the matching pre-tokenizer (for
// llama-bpe also ignore_merges) goes through ReadHF.
func TestRealEnginePreTokenizers(t *testing.T) {
	e := llamacpptest.Start(t, llamacpptest.Options{})
	dir := t.TempDir()
	orig := e.CopyFile(t, image.LlamacppModel, dir)
	tokens, types, _, err := render.GGUFVocab(orig)
	if err != nil {
		t.Fatal(err)
	}
	words := []string{
		"    ", "   ", "  ", "\n\n\n", "\n\n", " \n", "\t\t", "\r\n", "\n ", ".\n\n", "!\n", " {\n", "});\n",
		"123", "12", "1234", "999", " 12", " 7", "'s", "'S", "'re", "'RE", "'ll", "'d", "'t",
		"\thello", " hello", "(hello", "\nhello", "hello", "\u00a0hi", " world", "world", "Sam", "ab1",
		"$100", "+=", "<=>", "...", " ...", "$x", "|>", "__init__", " x", "x=1",
		"héllo", "中文", "你好", "😀", " café", "Привет",
	}
	whole := []string{" xylophone", "xylophone", " quantum", "1", "zebra"}
	synTokens, synTypes, merges, err := render.SyntheticVocab(tokens, types, words, whole)
	if err != nil {
		t.Fatal(err)
	}
	corpus := append(fixedCorpus(), randomCorpus(150, 2)...)
	corpus = append(corpus, wordCorpus(words, whole, 200, 3)...)
	for i, pre := range []string{"qwen2", "llama-bpe", "gpt-2", "default"} {
		t.Run(pre, func(t *testing.T) {
			path := filepath.Join(dir, "tiny-"+pre+".gguf")
			render.RewriteGGUF(t, orig, path, map[string]any{
				"tokenizer.ggml.tokens": synTokens, "tokenizer.ggml.token_type": synTypes,
				"tokenizer.ggml.merges": merges, "tokenizer.ggml.pre": pre,
			})
			src, err := render.ReadGGUF(path)
			if err != nil {
				t.Fatal(err)
			}
			toks := map[string]*render.Tokenizer{"gguf": src.Tokenizer}
			if hfPre, ok := hfPreTokenizers[pre]; ok {
				hf, err := render.ReadHF(writeHFDir(t, synTokens, toInt64(synTypes), merges, hfPre, pre == "llama-bpe"))
				if err != nil {
					t.Fatal(err)
				}
				toks["hf"] = hf.Tokenizer
			}
			srv := e.Serve(t, e.CopyFileIn(t, path, "/tmp"), 8090+i)
			bad := 0
			for _, s := range corpus {
				want := toInt32(srv.Tokenize(t, s))
				for name, tok := range toks {
					got, err := tok.Encode(s, true)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got, want) {
						if bad++; bad <= 10 {
							t.Errorf("%s: Encode(%q, true)\n got %v\nwant %v (llama-server, pre %q)", name, s, got, want, pre)
						}
					}
				}
			}
			t.Logf("pre %q: compared %d strings with llama-server through %d readers: %d mismatches", pre, len(corpus), len(toks), bad)
		})
	}
}

// hfPreTokenizers are the tokenizer.json pre-tokenizers of the GGUF
// pre-tokenizer names ("default" has none).
var hfPreTokenizers = map[string]any{
	"qwen2":     splitPre(qwen2Regex),
	"llama-bpe": splitPre(`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`),
	"gpt-2":     map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
}

func toInt64(x []int32) []int64 {
	out := make([]int64, len(x))
	for i, v := range x {
		out[i] = int64(v)
	}
	return out
}

// wordCorpus joins random words and whole-word tokens with random
// separators.
func wordCorpus(words, whole []string, n int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	all := append(append([]string(nil), words...), whole...)
	seps := []string{"", "", " ", "  ", "\n", "\t", "'", "1", ".", "a", "<think>", "<|im_end|>"}
	out := make([]string, n)
	for i := range out {
		var b strings.Builder
		for range 1 + rng.IntN(10) {
			b.WriteString(all[rng.IntN(len(all))])
			b.WriteString(seps[rng.IntN(len(seps))])
		}
		out[i] = b.String()
	}
	return out
}
