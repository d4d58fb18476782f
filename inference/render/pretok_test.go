package render

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// pieces returns the pre-tokens of s.
func pieces(p *preTokenizer, s string) []string {
	r := []rune(s)
	b := p.split(r)
	out := []string{}
	for i := 0; i+1 < len(b); i++ {
		out = append(out, string(r[b[i]:b[i+1]]))
	}
	return out
}

// regexPre is a preTokenizer running the expressions with regexp2.
func regexPre(t testing.TB, patterns ...string) *preTokenizer {
	t.Helper()
	p := &preTokenizer{name: "regexp2"}
	for _, pat := range patterns {
		s, err := compileSplitter(pat)
		if err != nil {
			t.Fatal(err)
		}
		p.steps = append(p.steps, s)
	}
	return p
}

// scannerCases pairs each scanner with the expressions it stands for.
func scannerCases(t testing.TB) []struct {
	name     string
	scanner  *preTokenizer
	patterns []string
} {
	t.Helper()
	pre := func(name string) *preTokenizer {
		lp, err := llamaPreTokenizer(name)
		if err != nil {
			t.Fatal(err)
		}
		return lp.pre
	}
	return []struct {
		name     string
		scanner  *preTokenizer
		patterns []string
	}{
		{"qwen2", pre("qwen2"), []string{reQwen2}},
		{"qwen2 (?i)", pre("qwen2"), []string{reQwen2HF}},
		{"llama3", pre("llama-bpe"), []string{reLlama3}},
		{"llama3 (?i)", pre("llama-bpe"), []string{reLlama3HF}},
		{"gpt2", pre("gpt-2"), []string{reGPT2}},
		{"default", pre("default"), []string{reDefaultPunct, reGPT2, reDefaultDigits, reDefault3}},
	}
}

var pretokFixed = []string{
	"", " ", "  ", "a", "hello world", "hello  world", "  leading", "trailing  ", "\n\n  \t", "a\n\n  b", " \n x",
	"1234567", "x 1234 y", "don't I'LL we'Re", "'s'S'", "rock'n'roll", "!!! ??? ...", " !x", "a  !b", "foo.\n\nbar",
	"中文测试，你好", "café ñ", "😀👍🏽", "\u00a0x\u3000y", "½²", "e\u0301", "x\r\ny", "\r\n\r\n  a", "$100 +5 <=> ^~|",
	"a\tb\t\tc", "   \n", "\t\n", " \u2003a", "<|im_start|>", "¡hola!", "_under_score_", "ab12cd345ef6789",
}

// TestScannersMatchRegexp: each hand-written scanner splits exactly as
// regexp2 running llama.cpp's (or tokenizer.json's) expression.
func TestScannersMatchRegexp(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	inputs := append([]string(nil), pretokFixed...)
	for range 3000 {
		inputs = append(inputs, randomPretokText(rng))
	}
	for _, c := range scannerCases(t) {
		re := regexPre(t, c.patterns...)
		bad := 0
		for _, s := range inputs {
			got, want := pieces(c.scanner, s), pieces(re, s)
			if !slices.Equal(got, want) {
				if bad++; bad <= 5 {
					t.Errorf("%s: %q\n scanner %q\n regexp2 %q", c.name, s, got, want)
				}
			}
		}
	}
}

// FuzzScanners: the scanners agree with regexp2 on any text, and the
// pieces always cover the text.
func FuzzScanners(f *testing.F) {
	for _, s := range pretokFixed {
		f.Add(s)
	}
	cases := scannerCases(f)
	res := make([]*preTokenizer, len(cases))
	for i, c := range cases {
		res[i] = regexPre(f, c.patterns...)
	}
	f.Fuzz(func(t *testing.T, s string) {
		s = strings.ToValidUTF8(s, "\uFFFD")
		for i, c := range cases {
			got := pieces(c.scanner, s)
			if strings.Join(got, "") != s {
				t.Fatalf("%s: pieces %q do not cover %q", c.name, got, s)
			}
			if want := pieces(res[i], s); !slices.Equal(got, want) {
				t.Fatalf("%s: %q\n scanner %q\n regexp2 %q", c.name, s, got, want)
			}
		}
	})
}

func randomPretokText(rng *rand.Rand) string {
	alphabet := []string{" ", " ", "  ", "\n", "\r", "\t", "\v", "\f", "\u00a0", "\u2003", "\u3000", "\u0085", "\u2028",
		"a", "B", "z", "é", "ß", "中", "ж", "'", "'", "s", "S", "t", "re", "VE", "m", "ll", "LL", "d", "D",
		"0", "1", "9", "٣", "½", "²", ".", ",", "!", "?", "-", "_", "$", "+", "<", "=", ">", "^", "~", "|", "`",
		"(", "\"", "😀", "\u0301", "\u200d", "\x00", "\x1f", "\u00ad", "🏽"}
	var b strings.Builder
	for range 1 + rng.IntN(16) {
		b.WriteString(alphabet[rng.IntN(len(alphabet))])
	}
	return b.String()
}
