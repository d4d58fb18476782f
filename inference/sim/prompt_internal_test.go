package sim

import (
	"encoding/json"
	"slices"
	"testing"
)

// Every prompt shape vLLM's completions route takes is decoded (one
// decode, chosen by the first byte), and every other is refused.
func TestDecodePromptShapes(t *testing.T) {
	h, err := newHandler(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		raw   string
		texts []string
		ids   [][]int // nil: from the texts
	}{
		{raw: `"hello"`, texts: []string{"hello"}},
		{raw: ` ["a", "b"] `, texts: []string{"a", "b"}},
		{raw: `[1, 2, 3]`, texts: []string{""}, ids: [][]int{{1, 2, 3}}},
		{raw: `[ [4], [5, 6] ]`, texts: []string{"", ""}, ids: [][]int{{4}, {5, 6}}},
	} {
		pl, apiErr := h.decodePrompt(json.RawMessage(c.raw), false)
		if apiErr != nil {
			t.Fatalf("%s: %s", c.raw, apiErr.Msg)
		}
		if !slices.Equal(pl.texts, c.texts) || len(pl.ids) != len(c.texts) {
			t.Fatalf("%s: texts %q, %d id lists", c.raw, pl.texts, len(pl.ids))
		}
		for i := range c.ids {
			if !slices.Equal(pl.ids[i], c.ids[i]) {
				t.Fatalf("%s: prompt %d ids %v, want %v", c.raw, i, pl.ids[i], c.ids[i])
			}
		}
	}
	for _, raw := range []string{``, `null`, `[]`, `[1, "a"]`, `["a", 1]`, `{}`, `5`, `[[1], "a"]`, `"unterminated`} {
		if _, apiErr := h.decodePrompt(json.RawMessage(raw), false); apiErr == nil || apiErr.Status != 400 {
			t.Errorf("%q: %v, want a 400", raw, apiErr)
		}
	}
}
