package render

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// hfTokenizer is the part of a Hugging Face tokenizer.json that matters.
type hfTokenizer struct {
	AddedTokens   []hfAddedToken  `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         hfModel         `json:"model"`
}

type hfAddedToken struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	Special    bool   `json:"special"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
}

type hfModel struct {
	Type                    string            `json:"type"`
	Vocab                   map[string]int32  `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
	Dropout                 *float64          `json:"dropout"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
}

// hfComponent is a normalizer, pre-tokenizer, post-processor or decoder.
type hfComponent struct {
	Type           string            `json:"type"`
	Pretokenizers  []json.RawMessage `json:"pretokenizers"`
	Normalizers    []json.RawMessage `json:"normalizers"`
	Processors     []json.RawMessage `json:"processors"`
	Pattern        map[string]string `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Single         []json.RawMessage `json:"single"`
}

// hfConfig is the part of tokenizer_config.json that matters.
type hfConfig struct {
	AddBOS       *bool           `json:"add_bos_token"`
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// ReadHF reads the tokenizer and chat template of a Hugging Face model
// directory: tokenizer.json and tokenizer_config.json (and
// chat_template.jinja when the config has no template). Only byte-level
// BPE is supported.
func ReadHF(dir string) (*Source, error) {
	src, err := readHF(dir)
	if err != nil {
		return nil, fmt.Errorf("render: read hf %s: %w", dir, err)
	}
	return src, nil
}

func readHF(dir string) (*Source, error) {
	var tj hfTokenizer
	if err := readJSON(filepath.Join(dir, "tokenizer.json"), &tj); err != nil {
		return nil, err
	}
	var cfg hfConfig
	if err := readJSON(filepath.Join(dir, "tokenizer_config.json"), &cfg); err != nil {
		return nil, err
	}
	spec, err := tj.spec()
	if err != nil {
		return nil, err
	}
	tok, err := newTokenizer(spec)
	if err != nil {
		return nil, err
	}
	src := &Source{Tokenizer: tok, BOSID: -1}
	if err := cfg.fill(src, dir); err != nil {
		return nil, err
	}
	if id, ok := tokenIDOf(src.BOS, spec.vocab, tj.AddedTokens); ok {
		src.BOSID = id
	}
	if cfg.AddBOS != nil {
		src.AddBOS = *cfg.AddBOS
	} else {
		src.AddBOS = postProcessorAddsBOS(tj.PostProcessor)
	}
	return src, nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return nil
}

// spec checks that tokenizer.json is byte-level BPE and gathers its parts.
func (tj *hfTokenizer) spec() (tokenizerSpec, error) {
	if err := tj.Model.check(); err != nil {
		return tokenizerSpec{}, err
	}
	normalize, err := hfNormalizer(tj.Normalizer)
	if err != nil {
		return tokenizerSpec{}, err
	}
	pre, err := hfPreTokenizer(tj.PreTokenizer)
	if err != nil {
		return tokenizerSpec{}, err
	}
	if err := checkDecoder(tj.Decoder); err != nil {
		return tokenizerSpec{}, err
	}
	merges, err := hfMerges(tj.Model.Merges)
	if err != nil {
		return tokenizerSpec{}, err
	}
	spec := tokenizerSpec{
		vocab: make(map[string]int32, len(tj.Model.Vocab)+len(tj.AddedTokens)), merges: merges,
		ignoreMerges: tj.Model.IgnoreMerges, pre: pre, normalize: normalize, leftmost: true,
	}
	for s, id := range tj.Model.Vocab {
		if id < 0 {
			return tokenizerSpec{}, fmt.Errorf("tokenizer.json: token %q has id %d", s, id)
		}
		spec.vocab[s] = id
		spec.size = max(spec.size, int(id)+1)
	}
	for _, a := range tj.AddedTokens {
		if err := a.check(); err != nil {
			return tokenizerSpec{}, err
		}
		spec.added = append(spec.added, addedToken{text: a.Content, id: a.ID})
		spec.size = max(spec.size, int(a.ID)+1)
	}
	return spec, nil
}

// check refuses models other than plain byte-level BPE.
func (m *hfModel) check() error {
	switch {
	case m.Type != "BPE":
		return fmt.Errorf("tokenizer model %q is not supported: only byte-level BPE", m.Type)
	case m.Dropout != nil && *m.Dropout != 0:
		return errors.New("BPE dropout is not supported")
	case m.ByteFallback:
		return errors.New("BPE byte_fallback (SentencePiece-style BPE) is not supported: only byte-level BPE")
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "",
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return errors.New("BPE continuing_subword_prefix/end_of_word_suffix are not supported")
	}
	return nil
}

func (a hfAddedToken) check() error {
	if a.ID < 0 || a.Content == "" {
		return fmt.Errorf("added token %q with id %d", a.Content, a.ID)
	}
	if a.LStrip || a.RStrip || a.SingleWord {
		return fmt.Errorf("added token %q: lstrip/rstrip/single_word are not supported", a.Content)
	}
	return nil
}

// hfMerges accepts "a b" strings and ["a","b"] pairs.
func hfMerges(raw []json.RawMessage) ([]string, error) {
	out := make([]string, 0, len(raw))
	for i, r := range raw {
		var s string
		if err := json.Unmarshal(r, &s); err == nil {
			out = append(out, s)
			continue
		}
		var pair []string
		if err := json.Unmarshal(r, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("tokenizer.json: merge %d %s is neither \"a b\" nor [\"a\",\"b\"]", i, r)
		}
		if strings.Contains(pair[0], " ") || strings.Contains(pair[1], " ") {
			return nil, fmt.Errorf("tokenizer.json: merge %d %s has a space in a part: not byte-level", i, r)
		}
		out = append(out, pair[0]+" "+pair[1])
	}
	return out, nil
}

func parseComponent(raw json.RawMessage) (*hfComponent, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// hfNormalizer accepts no normalizer, NFC, or a Sequence of those.
func hfNormalizer(raw json.RawMessage) (func(string) string, error) {
	c, err := parseComponent(raw)
	if err != nil || c == nil {
		return nil, err
	}
	switch c.Type {
	case "NFC":
		return norm.NFC.String, nil
	case "Sequence":
		var out func(string) string
		for _, sub := range c.Normalizers {
			f, err := hfNormalizer(sub)
			if err != nil {
				return nil, err
			}
			if f != nil {
				out = f
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("normalizer %q is not supported (only none or NFC)", c.Type)
}

// hfPreTokenizer accepts ByteLevel, Split (Isolated, by regex) and a
// Sequence of those containing a ByteLevel.
func hfPreTokenizer(raw json.RawMessage) (*preTokenizer, error) {
	c, err := parseComponent(raw)
	if err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	if c == nil {
		return nil, errors.New("no pre_tokenizer: only byte-level BPE (a ByteLevel pre-tokenizer) is supported")
	}
	parts := []json.RawMessage{raw}
	if c.Type == "Sequence" {
		parts = c.Pretokenizers
	}
	p := &preTokenizer{name: c.Type}
	byteLevel := false
	for _, part := range parts {
		step, isByteLevel, err := hfPreStep(part)
		if err != nil {
			return nil, err
		}
		byteLevel = byteLevel || isByteLevel
		if step != nil {
			p.steps = append(p.steps, step)
		}
	}
	if !byteLevel {
		return nil, fmt.Errorf("pre_tokenizer %q has no ByteLevel step: only byte-level BPE is supported", c.Type)
	}
	if len(p.steps) == 0 { // ByteLevel without its regex: each fragment is one word
		p.steps = append(p.steps, func(r []rune, match func(int, int)) { match(0, len(r)) })
	}
	return p, nil
}

// hfPreStep returns the splitter of one pre-tokenizer (nil for a
// ByteLevel step that only maps bytes) and whether it is ByteLevel.
func hfPreStep(raw json.RawMessage) (splitter, bool, error) {
	c, err := parseComponent(raw)
	if err != nil || c == nil {
		return nil, false, fmt.Errorf("pre_tokenizer: bad step %s", raw)
	}
	switch c.Type {
	case "ByteLevel":
		if c.AddPrefixSpace {
			return nil, true, errors.New("pre_tokenizer ByteLevel add_prefix_space=true is not supported")
		}
		if c.UseRegex == nil || *c.UseRegex {
			return scanGPT2, true, nil
		}
		return nil, true, nil
	case "Split":
		pattern, ok := c.Pattern["Regex"]
		if !ok {
			return nil, false, fmt.Errorf("pre_tokenizer Split pattern %v is not supported (only Regex)", c.Pattern)
		}
		if c.Behavior != "Isolated" || c.Invert {
			return nil, false, fmt.Errorf("pre_tokenizer Split behavior %q (invert %v) is not supported (only Isolated)", c.Behavior, c.Invert)
		}
		s, err := regexSplitter(pattern)
		return s, false, err
	}
	return nil, false, fmt.Errorf("pre_tokenizer %q is not supported (only ByteLevel, Split and Sequence)", c.Type)
}

// checkDecoder refuses decoders other than ByteLevel (or none).
func checkDecoder(raw json.RawMessage) error {
	c, err := parseComponent(raw)
	if err != nil {
		return fmt.Errorf("decoder: %w", err)
	}
	if c != nil && c.Type != "ByteLevel" {
		return fmt.Errorf("decoder %q is not supported: only byte-level BPE (a ByteLevel decoder)", c.Type)
	}
	return nil
}

// postProcessorAddsBOS reports whether a TemplateProcessing post-processor
// (alone or in a Sequence) starts a single sequence with a special token.
func postProcessorAddsBOS(raw json.RawMessage) bool {
	c, err := parseComponent(raw)
	if err != nil || c == nil {
		return false
	}
	switch c.Type {
	case "Sequence":
		for _, p := range c.Processors {
			if postProcessorAddsBOS(p) {
				return true
			}
		}
	case "TemplateProcessing":
		if len(c.Single) > 0 {
			var first map[string]json.RawMessage
			if json.Unmarshal(c.Single[0], &first) == nil {
				_, special := first["SpecialToken"]
				return special
			}
		}
	}
	return false
}

// fill sets the template and the BOS/EOS texts from tokenizer_config.json.
func (cfg *hfConfig) fill(src *Source, dir string) error {
	src.BOS = tokenText(cfg.BOS)
	src.EOS = tokenText(cfg.EOS)
	tmpl, err := chatTemplate(cfg.ChatTemplate)
	if err != nil {
		return err
	}
	if tmpl == "" {
		b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		tmpl = string(b)
	}
	src.ChatTemplate = tmpl
	return nil
}

// tokenText reads a token given as a string or as {"content": ...}.
func tokenText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return obj.Content
	}
	return ""
}

// chatTemplate reads chat_template: a string, or a list of named
// templates of which "default" is taken.
func chatTemplate(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("tokenizer_config.json: chat_template: %w", err)
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", nil
}

// tokenIDOf finds the id of a token text among the added tokens, then the
// vocabulary.
func tokenIDOf(text string, vocab map[string]int32, added []hfAddedToken) (int32, bool) {
	if text == "" {
		return 0, false
	}
	for _, a := range added {
		if a.Content == text {
			return a.ID, true
		}
	}
	id, ok := vocab[text]
	return id, ok
}
