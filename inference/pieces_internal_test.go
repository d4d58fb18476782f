package inference

import (
	"context"
	"strings"
	"testing"
)

func probsOf(ids []int32, pieces []string) []LlamaProb {
	out := make([]LlamaProb, len(ids))
	for i := range ids {
		id := ids[i]
		var b []int
		for _, c := range []byte(pieces[i]) {
			b = append(b, int(c))
		}
		out[i] = LlamaProb{ID: &id, Bytes: b}
	}
	return out
}

func TestLlamaPieces(t *testing.T) {
	ids := []int32{10, 11, 12, 13}
	ok := probsOf(ids, []string{"<tool_call>", "{\"a\"", ": 1}", ""})
	p := llamaPieces(ids, ok)
	if p == nil {
		t.Fatal("one entry per id: want pieces")
	}
	if got, ok := p.textOf(3); !ok || got != "<tool_call>{\"a\": 1}" {
		t.Fatalf("textOf(3) = %q, %v", got, ok)
	}
	if _, ok := p.textOf(4); ok {
		t.Fatal("textOf through an empty (control) piece must ask the server")
	}
	if _, ok := p.textOf(0); ok {
		t.Fatal("textOf(0)")
	}

	bad := probsOf(ids, []string{"a", "b", "c", "d"})
	wrong := int32(99)
	bad[2].ID = &wrong
	for name, probs := range map[string][]LlamaProb{
		"withheld entry": ok[:3],
		"id mismatch":    bad,
		"byte out of range": func() []LlamaProb {
			c := probsOf(ids, []string{"a", "b", "c", "d"})
			c[1].Bytes = []int{300}
			return c
		}(),
		"no id": func() []LlamaProb {
			c := probsOf(ids, []string{"a", "b", "c", "d"})
			c[0].ID = nil
			return c
		}(),
	} {
		if llamaPieces(ids, probs) != nil {
			t.Errorf("%s: want no pieces", name)
		}
	}

	// A piece that is half a character: valid only once completed.
	euro := "€" // 3 bytes
	ids = []int32{1, 2, 3}
	p = llamaPieces(ids, probsOf(ids, []string{"x", euro[:1], euro[1:]}))
	if _, ok := p.textOf(2); ok {
		t.Fatal("textOf ending inside a character must ask the server")
	}
	if got, ok := p.textOf(3); !ok || got != "x€" {
		t.Fatalf("textOf(3) = %q, %v", got, ok)
	}
}

// Spans from the pieces are the spans the server's detokenizer gives,
// for every range of a text with multi-byte characters and a final
// control token (spelled empty in the pieces, written out by the server).
func TestPrefixerLocalMatchesServer(t *testing.T) {
	const eot = int32(1000)
	text := "ab€<c>ü€ d"
	ids := append(byteIDs(text), eot)
	server := func(ctx context.Context, ids []int32) (string, error) {
		n := len(ids)
		if n > 0 && ids[n-1] == eot {
			s, err := byteDetok(ctx, ids[:n-1])
			return s + "<|im_end|>", err
		}
		return byteDetok(ctx, ids)
	}
	pieces := make([]string, len(ids))
	for i := range len(text) {
		pieces[i] = text[i : i+1]
	}
	lp := llamaPieces(ids, probsOf(ids, pieces))
	if lp == nil {
		t.Fatal("no pieces")
	}
	ctx := context.Background()
	noDetok := func(context.Context, []int32) (string, error) {
		t.Fatal("local prefixer asked the server")
		return "", nil
	}
	for start := 0; start <= len(text); start++ {
		for end := start; end <= len(text)+1; end++ {
			r := ByteRange{start, end}
			srv := prefixer{ids: ids, text: text, known: map[int]int{0: 0}, detok: server}
			loc := prefixer{ids: ids, text: text, known: map[int]int{0: 0}, detok: noDetok, local: lp}
			want, err := srv.span(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			got, err := loc.span(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("range %v: local %v, server %v", r, got, want)
			}
		}
	}
	// Pieces that do not spell the text are no prefix at all.
	loc := prefixer{ids: ids, text: strings.ToUpper(text), known: map[int]int{0: 0}, detok: noDetok, local: lp}
	if got, _ := loc.span(ctx, ByteRange{0, 2}); got != noSpan {
		t.Errorf("foreign text: %v", got)
	}
}
