package render

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"unicode"

	openai "github.com/sashabaranov/go-openai"
)

// Model renders conversations to token ids in-process: a model's own chat
// template and tokenizer, read from its files.
type Model struct {
	src    *Source
	tmpl   *Template
	path   string
	markup []string

	invOnce sync.Once
	inv     []string // id → text (Decode)
	has     []bool
}

// Open reads the model at path: a GGUF file (llama.cpp) or a Hugging Face
// model directory (tokenizer.json and tokenizer_config.json, as vLLM and
// SGLang load them).
func Open(path string) (*Model, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("render: open model %s: %w", path, err)
	}
	var src *Source
	if st.IsDir() {
		src, err = ReadHF(path)
	} else {
		src, err = ReadGGUF(path)
	}
	if err != nil {
		return nil, err
	}
	if src.ChatTemplate == "" {
		return nil, fmt.Errorf("render: model %s has no chat template", path)
	}
	tmpl, err := NewTemplate(src.ChatTemplate, src.BOS, src.EOS)
	if err != nil {
		return nil, fmt.Errorf("render: model %s: %w", path, err)
	}
	return &Model{src: src, tmpl: tmpl, path: path, markup: markupLiterals(src.ChatTemplate)}, nil
}

// Path is where the model was read from.
func (m *Model) Path() string { return m.path }

// Render is the ids of msgs under the chat template: the template's text
// tokenised with special tokens parsed, as llama.cpp's /apply-template then
// /tokenize and vLLM's /tokenize with messages give them. addSpecial
// prepends BOS when the tokenizer adds one (llama.cpp's add_special; vLLM
// tokenises a chat render without).
func (m *Model) Render(msgs []openai.ChatCompletionMessage, tools json.RawMessage, genPrompt bool, kwargs map[string]any, addSpecial bool) ([]int32, error) {
	text, err := m.tmpl.Apply(msgs, tools, genPrompt, kwargs)
	if err != nil {
		return nil, err
	}
	ids, err := m.src.Tokenizer.Encode(text, true)
	if err != nil {
		return nil, err
	}
	if addSpecial && m.src.AddBOS && m.src.BOSID >= 0 {
		ids = append([]int32{m.src.BOSID}, ids...)
	}
	return ids, nil
}

// Text is msgs under the chat template, as text.
func (m *Model) Text(msgs []openai.ChatCompletionMessage, tools json.RawMessage, genPrompt bool, kwargs map[string]any) (string, error) {
	return m.tmpl.Apply(msgs, tools, genPrompt, kwargs)
}

// Encode tokenises text as a render is tokenised: special tokens parsed,
// no BOS added.
func (m *Model) Encode(text string) ([]int32, error) {
	return m.src.Tokenizer.Encode(text, true)
}

// ReadsClock reports whether the template may render the current date
// (strftime_now, as Llama 3's do), so that the same conversation renders
// differently from one day to the next.
func (m *Model) ReadsClock() bool {
	return strings.Contains(m.src.ChatTemplate, "strftime_now")
}

// Markup is the template's string literals that look like markup (three
// characters or more, one of them neither a letter, a digit nor white
// space): what a template may look for in a message's text to render it
// differently, e.g. "<tool_response>" or "</think>". A text that contains
// none of them is only ever output or skipped by the usual templates.
func (m *Model) Markup() []string { return m.markup }

// markupLiterals are the quoted string literals inside a template's tags
// ({{ }}, {% %}) that look like markup (see Markup), each once.
func markupLiterals(src string) []string {
	seen := map[string]bool{}
	var out []string
	for {
		open := strings.IndexAny(src, "{")
		if open < 0 || open+1 >= len(src) {
			return out
		}
		var end string
		switch src[open+1] {
		case '{':
			end = "}}"
		case '%':
			end = "%}"
		default:
			src = src[open+1:]
			continue
		}
		closeAt := strings.Index(src[open+2:], end)
		if closeAt < 0 {
			return out
		}
		for _, lit := range quoted(src[open+2 : open+2+closeAt]) {
			lit = strings.TrimSpace(lit)
			if len(lit) >= 3 && !seen[lit] && strings.IndexFunc(lit, isMarkupRune) >= 0 {
				seen[lit] = true
				out = append(out, lit)
			}
		}
		src = src[open+2+closeAt+2:]
	}
}

// quoted is the string literals of a Jinja expression, escapes resolved
// (\n, \t, and a backslash before any other character).
func quoted(expr string) []string {
	var out []string
	for i := 0; i < len(expr); i++ {
		q := expr[i]
		if q != '\'' && q != '"' {
			continue
		}
		var b strings.Builder
		j := i + 1
		for ; j < len(expr) && expr[j] != q; j++ {
			c := expr[j]
			if c == '\\' && j+1 < len(expr) {
				j++
				switch expr[j] {
				case 'n':
					c = '\n'
				case 't':
					c = '\t'
				default:
					c = expr[j]
				}
			}
			b.WriteByte(c)
		}
		if j >= len(expr) {
			return out
		}
		out = append(out, b.String())
		i = j
	}
	return out
}

func isMarkupRune(r rune) bool {
	return !unicode.IsLetter(r) && !unicode.IsDigit(r) && !unicode.IsSpace(r)
}

// Decode is the text of ids, special tokens written out.
func (m *Model) Decode(ids []int32) (string, error) {
	m.invOnce.Do(m.buildInverse)
	var b strings.Builder
	for _, id := range ids {
		if id < 0 || int(id) >= len(m.inv) || !m.has[id] {
			return "", fmt.Errorf("render: token id %d is not in the vocabulary", id)
		}
		b.WriteString(m.inv[id])
	}
	return b.String(), nil
}

// buildInverse maps every id to its text: added tokens as written, the
// others from their byte-level form.
func (m *Model) buildInverse() {
	t := m.src.Tokenizer
	n := t.VocabSize()
	m.inv, m.has = make([]string, n), make([]bool, n)
	var unByte [0x180]int16
	for i := range unByte {
		unByte[i] = -1
	}
	for b, r := range byteLevel {
		unByte[[]rune(r)[0]] = int16(b)
	}
	for text, id := range t.vocab {
		if id < 0 || int(id) >= n {
			continue
		}
		raw := make([]byte, 0, len(text))
		ok := true
		for _, r := range text {
			if int(r) >= len(unByte) || unByte[r] < 0 {
				ok = false
				break
			}
			raw = append(raw, byte(unByte[r]))
		}
		if ok {
			m.inv[id], m.has[id] = string(raw), true
		}
	}
	for _, a := range t.added {
		if a.id >= 0 && int(a.id) < n {
			m.inv[a.id], m.has[a.id] = a.text, true
		}
	}
}
