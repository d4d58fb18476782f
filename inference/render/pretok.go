package render

import (
	"fmt"
	"unicode"

	"github.com/dlclark/regexp2"
)

// The pre-tokenizer regular expressions, as llama.cpp runs them
// (src/llama-vocab.cpp, llm_tokenizer_bpe, read from ggml-org/llama.cpp
// master in November 2026; the project's engine image runs Debian's
// llama.cpp 0.7.0+dfsg, "build 11669") and as Hugging Face tokenizer.json
// files spell them. Each has a hand-written scanner below that is
// equivalent to it; pretok_test.go holds the scanners to regexp2 running
// the expression.
const (
	// reGPT2 is GPT-2's (llama.cpp "gpt-2"; Hugging Face ByteLevel with
	// use_regex). llama.cpp drops the final |\s+ but its scanner behaves as
	// if it were there.
	reGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// reQwen2HF and reQwen2 are Qwen2's in tokenizer.json and in llama.cpp
	// (its regex engine lacks (?i:...)), llama.cpp "qwen2".
	reQwen2HF = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	reQwen2   = `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// reLlama3HF and reLlama3 are Llama 3's, llama.cpp "llama-bpe".
	reLlama3HF = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	reLlama3   = `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// llama.cpp "default" applies four expressions in turn.
	reDefaultPunct  = `[\p{P}\$\+<=>\^~\|]+`
	reDefaultDigits = `\p{N}+`
	reDefault3      = `[0-9][0-9][0-9]`
)

// A splitter finds the matches of one expression in r, in order, each as
// [start, end) rune offsets. Text between matches becomes pieces of its
// own (llama.cpp's unicode_regex_split keeps it).
type splitter func(r []rune, match func(start, end int))

// preTokenizer applies its splitters in turn, each to every piece the
// previous one left.
type preTokenizer struct {
	name  string
	steps []splitter
}

// split returns the pieces of text as rune offsets (bounds[i] to
// bounds[i+1]).
func (p *preTokenizer) split(r []rune) []int {
	bounds := []int{0, len(r)}
	if len(r) == 0 {
		return bounds[:1]
	}
	for _, step := range p.steps {
		next := []int{0}
		for i := 0; i+1 < len(bounds); i++ {
			lo, hi := bounds[i], bounds[i+1]
			last := lo
			step(r[lo:hi], func(s, e int) {
				if lo+s > last {
					next = append(next, lo+s)
				}
				next = append(next, lo+e)
				last = lo + e
			})
			if last < hi {
				next = append(next, hi)
			}
		}
		bounds = next
	}
	return bounds
}

// llamaPre is what a GGUF's tokenizer.ggml.pre selects in llama.cpp
// (llama_vocab::impl::load): the pre-tokenizer, whether a word that is a
// whole token skips the merges, and whether BOS is added by default.
type llamaPre struct {
	pre          *preTokenizer
	ignoreMerges bool
	addBOS       bool
}

// llamaPreTokenizer returns what llama.cpp does for the pre-tokenizer
// name; "" is "default", as in llama.cpp; names llama.cpp does not know
// (it falls back to "default" with a warning) and the ones not
// implemented here are errors.
func llamaPreTokenizer(name string) (llamaPre, error) {
	one := func(s splitter) *preTokenizer { return &preTokenizer{name: name, steps: []splitter{s}} }
	switch name {
	case "qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan":
		return llamaPre{pre: one(scanQwen2)}, nil
	case "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2":
		return llamaPre{pre: one(scanLlama3), ignoreMerges: true, addBOS: true}, nil
	case "dbrx", "smaug-bpe":
		return llamaPre{pre: one(scanLlama3)}, nil
	case "gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4":
		return llamaPre{pre: one(scanGPT2)}, nil
	case "default", "":
		return llamaPre{pre: &preTokenizer{name: "default", steps: []splitter{
			classRuns(isDefaultPunct), scanGPT2, classRuns(unicode.IsNumber), asciiDigitTriples,
		}}}, nil
	}
	return llamaPre{}, fmt.Errorf("pre-tokenizer %q is not supported (supported: qwen2, llama-bpe/llama3, gpt-2, default)", name)
}

// regexSplitter returns a splitter for a Hugging Face Split pattern:
// the hand-written scanner when the pattern is one of the known ones,
// otherwise regexp2 running it.
func regexSplitter(pattern string) (splitter, error) {
	switch pattern {
	case reQwen2HF, reQwen2:
		return scanQwen2, nil
	case reLlama3HF, reLlama3:
		return scanLlama3, nil
	case reGPT2:
		return scanGPT2, nil
	}
	return compileSplitter(pattern)
}

// compileSplitter runs pattern with regexp2 (.NET syntax, close to the
// Oniguruma expressions Hugging Face tokenizers uses).
func compileSplitter(pattern string) (splitter, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("pre-tokenizer regex %q: %w", pattern, err)
	}
	return func(r []rune, match func(start, end int)) {
		m, err := re.FindRunesMatch(r)
		for err == nil && m != nil {
			if m.Length > 0 {
				match(m.Index, m.Index+m.Length)
			}
			m, err = re.FindNextMatch(m)
		}
	}, nil
}

// Character classes as llama.cpp sees them: \s is Unicode White_Space,
// \p{L} and \p{N} the Unicode letter and number categories.
// ASCII takes a table lookup.
func isSpace(c rune) bool {
	if c < 0x80 {
		return asciiClass[c] == classSpace
	}
	return unicode.IsSpace(c)
}

func isLetter(c rune) bool {
	if c < 0x80 {
		return asciiClass[c] == classLetter
	}
	return unicode.IsLetter(c)
}

func isNumber(c rune) bool {
	if c < 0x80 {
		return asciiClass[c] == classNumber
	}
	return unicode.IsNumber(c)
}

func isNL(c rune) bool { return c == '\r' || c == '\n' }

// isOther is [^\s\p{L}\p{N}].
func isOther(c rune) bool {
	if c < 0x80 {
		return asciiClass[c] == classOther
	}
	return !unicode.IsSpace(c) && !unicode.IsLetter(c) && !unicode.IsNumber(c)
}

// ASCII character classes.
const (
	classOther = iota
	classSpace
	classLetter
	classNumber
)

var asciiClass = func() (t [0x80]uint8) {
	for c := range rune(0x80) {
		switch {
		case unicode.IsSpace(c):
			t[c] = classSpace
		case unicode.IsLetter(c):
			t[c] = classLetter
		case unicode.IsNumber(c):
			t[c] = classNumber
		}
	}
	return t
}()

// isDefaultPunct is [\p{P}\$\+<=>\^~\|].
func isDefaultPunct(c rune) bool {
	switch c {
	case '$', '+', '<', '=', '>', '^', '~', '|':
		return true
	}
	return unicode.IsPunct(c)
}

// at returns r[i], or -1 past the end.
func at(r []rune, i int) rune {
	if i < len(r) {
		return r[i]
	}
	return -1
}

// run returns the end of the run of runes from i that satisfy in.
func run(r []rune, i int, in func(rune) bool) int {
	for i < len(r) && in(r[i]) {
		i++
	}
	return i
}

// contraction matches '[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]
// at i (lower case only unless anyCase), returning its end or -1.
func contraction(r []rune, i int, anyCase bool) int {
	if at(r, i) != '\'' {
		return -1
	}
	lower := func(c rune) rune {
		if anyCase && c >= 'A' && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	c1, c2 := lower(at(r, i+1)), lower(at(r, i+2))
	switch {
	case c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd':
		return i + 2
	case (c1 == 'r' || c1 == 'v') && c2 == 'e', c1 == 'l' && c2 == 'l':
		return i + 3
	}
	return -1
}

// whitespace matches \s+(?!\S)|\s+ at i, where r[i] is whitespace.
func whitespace(r []rune, i int) int {
	end := run(r, i, isSpace)
	if end < len(r) && end-i > 1 {
		return end - 1 // leave the last space to the word that follows
	}
	return end
}

// scanQwen2 is reQwen2.
func scanQwen2(r []rune, match func(start, end int)) { scanQwenLike(r, 1, match) }

// scanLlama3 is reLlama3: reQwen2 with \p{N}{1,3}.
func scanLlama3(r []rune, match func(start, end int)) { scanQwenLike(r, 3, match) }

func scanQwenLike(r []rune, maxDigits int, match func(start, end int)) {
	for i := 0; i < len(r); {
		end := qwenToken(r, i, maxDigits)
		match(i, end)
		i = end
	}
}

// qwenToken returns the end of the pre-token that starts at i.
func qwenToken(r []rune, i, maxDigits int) int {
	c, c1 := r[i], at(r, i+1)
	if e := contraction(r, i, true); e >= 0 {
		return e
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isLetter(c) {
		return run(r, i, isLetter)
	}
	if !isNL(c) && !isNumber(c) && c1 >= 0 && isLetter(c1) {
		return run(r, i+1, isLetter)
	}
	// \p{N}{1,maxDigits}
	if isNumber(c) {
		e := i + 1
		for e < len(r) && e-i < maxDigits && isNumber(r[e]) {
			e++
		}
		return e
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	if s := i + btoi(c == ' '); s < len(r) && isOther(r[s]) {
		return run(r, run(r, s, isOther), isNL)
	}
	// \s*[\r\n]+: up to the last newline of the whitespace run
	ws := run(r, i, isSpace)
	for e := ws; e > i; e-- {
		if isNL(r[e-1]) {
			return e
		}
	}
	if ws > i {
		return whitespace(r, i)
	}
	return i + 1 // unreachable: every rune is in one of the classes
}

// scanGPT2 is reGPT2.
func scanGPT2(r []rune, match func(start, end int)) {
	for i := 0; i < len(r); {
		end := gpt2Token(r, i)
		match(i, end)
		i = end
	}
}

func gpt2Token(r []rune, i int) int {
	if e := contraction(r, i, false); e >= 0 {
		return e
	}
	s := i + btoi(r[i] == ' ')
	if s < len(r) {
		for _, class := range []func(rune) bool{isLetter, isNumber, isOther} {
			if class(r[s]) {
				return run(r, s, class)
			}
		}
	}
	if isSpace(r[i]) {
		return whitespace(r, i)
	}
	return i + 1
}

// classRuns matches maximal runs of runes in the class.
func classRuns(in func(rune) bool) splitter {
	return func(r []rune, match func(start, end int)) {
		for i := 0; i < len(r); {
			if !in(r[i]) {
				i++
				continue
			}
			e := run(r, i, in)
			match(i, e)
			i = e
		}
	}
}

// asciiDigitTriples is [0-9][0-9][0-9].
func asciiDigitTriples(r []rune, match func(start, end int)) {
	isDigit := func(c rune) bool { return c >= '0' && c <= '9' }
	for i := 0; i+3 <= len(r); {
		if isDigit(r[i]) && isDigit(r[i+1]) && isDigit(r[i+2]) {
			match(i, i+3)
			i += 3
			continue
		}
		i++
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
