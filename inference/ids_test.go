package inference

import (
	stdjson "encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	json "github.com/segmentio/encoding/json"
)

func TestTokenIDsDecode(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []int32
		null bool
	}{
		{in: `[1,2,3]`, want: []int32{1, 2, 3}},
		{in: ` [ 0 , -5 ,2147483647, -2147483648 ] `, want: []int32{0, -5, 2147483647, -2147483648}},
		{in: `[]`, want: []int32{}},
		{in: `null`, null: true},
	} {
		for name, dec := range map[string]func([]byte, any) error{"segmentio": json.Unmarshal, "stdlib": stdjson.Unmarshal} {
			var v struct {
				T TokenIDs `json:"t"`
			}
			if err := dec([]byte(`{"t":`+c.in+`}`), &v); err != nil {
				t.Fatalf("%s %s: %v", name, c.in, err)
			}
			if c.null != (v.T == nil) || !slices.Equal(v.T, c.want) {
				t.Errorf("%s %s: got %#v, want %#v (nil %v)", name, c.in, v.T, c.want, c.null)
			}
		}
	}
	for _, bad := range []string{`[1.5]`, `[1e3]`, `[2147483648]`, `[-2147483649]`, `[99999999999999999999]`, `["1"]`, `[null]`, `[[1]]`, `{"a":1}`, `"x"`, `[true]`} {
		var v struct {
			T TokenIDs `json:"t"`
		}
		if err := json.Unmarshal([]byte(`{"t":`+bad+`}`), &v); err == nil {
			t.Errorf("%s: decoded as %v, want an error", bad, v.T)
		}
	}
	// Encoding is the codec's own: a plain JSON array.
	b, err := json.Marshal(&CompletionRequest{Prompt: TokenIDs{7, -1, 300}})
	if err != nil || !strings.Contains(string(b), `"prompt":[7,-1,300]`) {
		t.Fatalf("encoded %s, %v", b, err)
	}
}

func TestLogprobsAndTokenStringsDecode(t *testing.T) {
	in := `{"tokens":["token_id:1","a\"b","\u00e9",null,"token_id:22"],"token_logprobs":[-0.5, null, -1e-3, 0, -12.25]}`
	var got CompletionLogprobs
	if err := json.Unmarshal([]byte(in), &got); err != nil {
		t.Fatal(err)
	}
	var want struct {
		Tokens        []string   `json:"tokens"`
		TokenLogprobs []*float64 `json:"token_logprobs"`
	}
	if err := stdjson.Unmarshal([]byte(in), &want); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Tokens, want.Tokens) {
		t.Errorf("tokens %q, want %q", got.Tokens, want.Tokens)
	}
	if len(got.TokenLogprobs) != len(want.TokenLogprobs) {
		t.Fatalf("%d logprobs, want %d", len(got.TokenLogprobs), len(want.TokenLogprobs))
	}
	for i := range want.TokenLogprobs {
		g, w := got.TokenLogprobs[i], want.TokenLogprobs[i]
		if (g == nil) != (w == nil) || (g != nil && *g != *w) {
			t.Errorf("logprob %d: got %v, want %v", i, g, w)
		}
	}
	for _, bad := range []string{`{"token_logprobs":["x"]}`, `{"token_logprobs":[true]}`, `{"token_logprobs":{}}`, `{"tokens":[1]}`, `{"tokens":{"a":"b"}}`} {
		var v CompletionLogprobs
		if err := json.Unmarshal([]byte(bad), &v); err == nil {
			t.Errorf("%s: decoded as %+v, want an error", bad, v)
		}
	}
	var empty CompletionLogprobs
	if err := json.Unmarshal([]byte(`{"tokens":[],"token_logprobs":[]}`), &empty); err != nil || empty.Tokens == nil || len(empty.Tokens) != 0 || len(empty.TokenLogprobs) != 0 {
		t.Fatalf("empty arrays: %+v, %v", empty, err)
	}
}

// FuzzTokenIDs checks the hand-written id decoder against encoding/json
// on any input both accept: same ids, and no panic on anything.
func FuzzTokenIDs(f *testing.F) {
	for _, s := range []string{`[1,2]`, `[]`, `null`, `[-1, 2147483647]`, `[1.0]`, `[01]`, `[1,]`, `[`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var got TokenIDs
		gerr := json.Unmarshal([]byte(s), &got)
		var want []int32
		werr := stdjson.Unmarshal([]byte(s), &want)
		if gerr == nil && werr != nil {
			t.Fatalf("%q: accepted as %v, encoding/json says %v", s, got, werr)
		}
		if gerr == nil && !slices.Equal(got, want) {
			t.Fatalf("%q: got %v, want %v", s, got, want)
		}
	})
}

// FuzzCompletionLogprobs checks the logprobs and token-string decoders
// against encoding/json on any input both accept, and for panics.
func FuzzCompletionLogprobs(f *testing.F) {
	for _, s := range []string{`{"tokens":["token_id:1","a\"b"],"token_logprobs":[-0.5,null]}`, `{"tokens":null,"token_logprobs":[]}`,
		`{"tokens":["\ud83d\ude00"],"token_logprobs":[1e-2]}`, `{"token_logprobs":[-0]}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var got CompletionLogprobs
		gerr := json.Unmarshal([]byte(s), &got)
		var want struct {
			Tokens        []string   `json:"tokens"`
			TokenLogprobs []*float64 `json:"token_logprobs"`
		}
		werr := stdjson.Unmarshal([]byte(s), &want)
		if gerr != nil || werr != nil {
			return
		}
		if len(got.Tokens) != len(want.Tokens) || len(got.TokenLogprobs) != len(want.TokenLogprobs) {
			t.Fatalf("%q: lengths %d/%d, want %d/%d", s, len(got.Tokens), len(got.TokenLogprobs), len(want.Tokens), len(want.TokenLogprobs))
		}
		for i := range want.Tokens {
			if got.Tokens[i] != want.Tokens[i] && utf8.ValidString(want.Tokens[i]) && utf8.ValidString(got.Tokens[i]) {
				t.Fatalf("%q: token %d is %q, want %q", s, i, got.Tokens[i], want.Tokens[i])
			}
		}
		for i := range want.TokenLogprobs {
			g, w := got.TokenLogprobs[i], want.TokenLogprobs[i]
			if (g == nil) != (w == nil) || (g != nil && *g != *w) {
				t.Fatalf("%q: logprob %d is %v, want %v", s, i, g, w)
			}
		}
	})
}
