package inference

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// byteDetok decodes ids that are byte values (a byte-level vocabulary)
// as a server does: an unfinished UTF-8 character at the end becomes
// U+FFFD, so that prefix is not a prefix of the text.
func byteDetok(_ context.Context, ids []int32) (string, error) {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), nil
}

func byteIDs(s string) []int32 {
	ids := make([]int32, len(s))
	for i := range len(s) {
		ids[i] = int32(s[i])
	}
	return ids
}

func TestPrefixerSpans(t *testing.T) {
	text := "ab€<c>ü€ d"
	ids := byteIDs(text)
	p := prefixer{ids: ids, text: text, known: map[int]int{0: 0}, detok: byteDetok}
	ctx := context.Background()
	for _, tc := range []struct {
		r    ByteRange
		want TokenSpan
	}{
		{ByteRange{0, 2}, TokenSpan{0, 2}},
		{ByteRange{5, 8}, TokenSpan{5, 8}},   // "<c>"
		{ByteRange{8, 13}, TokenSpan{8, 13}}, // "ü€": ids inside characters are no boundaries
		{ByteRange{0, len(text)}, TokenSpan{0, len(ids)}},
		{ByteRange{3, 3}, TokenSpan{2, 5}},    // inside "€": the whole character
		{ByteRange{4, 6}, TokenSpan{2, 6}},    // starts inside "€": widened to its start
		{ByteRange{0, len(text) + 1}, noSpan}, // past the text
		{ByteRange{3, 1}, noSpan},             // reversed
	} {
		got, err := p.span(ctx, tc.r)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("range %v: got %v want %v", tc.r, got, tc.want)
		}
		if got.Start >= 0 {
			s, _ := byteDetok(ctx, ids[got.Start:got.End])
			if !strings.Contains(s, text[tc.r.Start:tc.r.End]) && utf8.ValidString(text[tc.r.Start:tc.r.End]) {
				t.Errorf("range %v: span text %q lacks %q", tc.r, s, text[tc.r.Start:tc.r.End])
			}
		}
	}

	// Text the detokenizer does not reproduce: no span, no error.
	p = prefixer{ids: ids, text: "xyz" + text, known: map[int]int{0: 0}, detok: byteDetok}
	if got, err := p.span(ctx, ByteRange{3, 5}); err != nil || got != noSpan {
		t.Errorf("foreign text: %v, %v", got, err)
	}

	// A failed request is an error.
	boom := errors.New("boom")
	p = prefixer{ids: ids, text: text, known: map[int]int{0: 0}, detok: func(context.Context, []int32) (string, error) { return "", boom }}
	if _, err := p.span(ctx, ByteRange{0, 2}); !errors.Is(err, boom) {
		t.Errorf("failed detokenize: %v", err)
	}
}
