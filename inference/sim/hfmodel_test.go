package sim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteHFModel(t *testing.T) {
	dir := t.TempDir()
	if err := WriteHFModel(dir, "hermes"); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tj struct {
		Model struct {
			Type   string         `json:"type"`
			Vocab  map[string]int `json:"vocab"`
			Merges []string       `json:"merges"`
		} `json:"model"`
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		PreTokenizer map[string]any `json:"pre_tokenizer"`
	}
	if err := json.Unmarshal(raw, &tj); err != nil {
		t.Fatal(err)
	}
	if tj.Model.Type != "BPE" || len(tj.Model.Vocab) != 256 || tj.Model.Merges == nil || len(tj.Model.Merges) != 0 {
		t.Fatalf("model: type %q, %d vocab entries, merges %v", tj.Model.Type, len(tj.Model.Vocab), tj.Model.Merges)
	}
	// GPT-2's table: 'A' is itself, space is Ġ (U+0120), newline Ċ (U+010A).
	for sym, want := range map[string]int{"A": 'A', "Ġ": ' ', "Ċ": '\n', "ÿ": 0xFF, "Ā": 0} {
		if got := tj.Model.Vocab[sym]; got != want {
			t.Errorf("vocab[%q] = %d, want %d", sym, got, want)
		}
	}
	tok := NewTokenizer()
	if len(tj.AddedTokens) != tok.VocabSize()-256 {
		t.Fatalf("%d added tokens, want %d", len(tj.AddedTokens), tok.VocabSize()-256)
	}
	for _, a := range tj.AddedTokens {
		if id, ok := tok.ID(a.Content); !ok || id != a.ID || tok.IsControl(id) != a.Special {
			t.Errorf("added token %q id %d special %v disagrees with the tokenizer", a.Content, a.ID, a.Special)
		}
	}
	if tj.PreTokenizer["type"] != "ByteLevel" || tj.PreTokenizer["use_regex"] != false {
		t.Errorf("pre_tokenizer %v", tj.PreTokenizer)
	}
	raw, err = os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg["chat_template"] != hermesJinja || cfg["eos_token"] != "<|im_end|>" || cfg["bos_token"] != nil || cfg["add_bos_token"] != false {
		t.Errorf("tokenizer_config: eos %v bos %v add_bos %v", cfg["eos_token"], cfg["bos_token"], cfg["add_bos_token"])
	}
}

func TestWriteHFModelUnknownFamily(t *testing.T) {
	if err := WriteHFModel(t.TempDir(), "mistral"); err == nil {
		t.Fatal("want an error for a family without a Jinja template")
	}
}
