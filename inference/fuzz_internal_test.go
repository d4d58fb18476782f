package inference

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// bodyTransport answers every request with a fixed 200 body, so decoders
// can be fuzzed without sockets.
type bodyTransport struct{ body []byte }

func (b bodyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(bytes.NewReader(b.body)), Request: r}, nil
}

// FuzzGenerateDecoders feeds arbitrary bodies to every tokens-mode decoder:
// each must either return ids and logprobs of equal length or an ErrInfra,
// and never panic.
func FuzzGenerateDecoders(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"index":0,"text":"ab","token_ids":[1,2],"finish_reason":"stop","stop_reason":null,"logprobs":{"tokens":["token_id:1","token_id:2"],"token_logprobs":[-0.1,-0.2]}}]}`,
		`{"choices":[{"index":0,"text":"ab","token_ids":[1,2],"finish_reason":"length","logprobs":{"tokens":["token_id:1"],"token_logprobs":[-0.1,null]}}]}`,
		`{"request_id":"x","choices":[{"index":0,"logprobs":{"content":[{"token":"token_id:3","logprob":-0.2}]},"finish_reason":"stop","token_ids":[3]}]}`,
		`{"text":" Paris.","output_ids":[12366,13],"meta_info":{"finish_reason":{"type":"stop","matched":151645},"output_token_logprobs":[[-0.12,12366,null],[-0.51,13,null]]}}`,
		`{"text":["a"],"finish_reasons":["stop"],"logprobs":[[[{"785":-0.21}]]],"prompt_token_ids":[1],"token_ids":[[785]]}`,
		`{"choices":[{"index":0,"token_ids":[1],"logprobs":{"content":[{"token":"token_id:2","logprob":"x"}]}}]}`,
		`[]`, `null`, `{"choices":null}`, `{"meta_info":{"output_token_logprobs":[[]]},"output_ids":[1]}`,
		`{"content":"a","tokens":[5,9],"stop_type":"eos","completion_probabilities":[{"id":5,"logprob":-0.5},{"id":9,"logprob":-0.1}],"generation_settings":{"top_k":40}}`,
		`{"content":"a","tokens":[5,9,7],"stop_type":"word","stopping_word":"x","completion_probabilities":[{"id":5,"logprob":-0.5}]}`,
		`{"tokens":[5],"stop_type":"limit","truncated":true,"completion_probabilities":[{"id":6,"prob":0.5}]}`,
	} {
		f.Add([]byte(s))
	}
	gens := []generator{completionsGen{}, vllmGenerateGen{}, sglangGen{}, atroposGen{}, llamaGen{}}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := NewPool(PoolConfig{Endpoints: []string{"http://fuzz.invalid"}, Retries: -1})
		if err != nil {
			t.Fatal(err)
		}
		p.caller.hc = &http.Client{Transport: bodyTransport{body}}
		for _, g := range gens {
			s, err := g.generate(context.Background(), p, genInput{model: "m", prompt: []int32{1}, maxTokens: 4, opts: CallOptions{RequestID: "fuzz"}})
			if err != nil {
				if !errors.Is(err, ErrInfra) {
					t.Fatalf("%s: error without ErrInfra class: %v", g.name(), err)
				}
				continue
			}
			if len(s.ids) != len(s.logprobs) {
				t.Fatalf("%s: %d ids, %d logprobs accepted", g.name(), len(s.ids), len(s.logprobs))
			}
		}
	})
}

func TestDiffTokens(t *testing.T) {
	cases := []struct {
		a, b []int32
		want int
	}{
		{nil, nil, 0},
		{[]int32{1, 2, 3}, []int32{1, 2, 3}, 0},
		{[]int32{1, 2, 3}, []int32{1, 3}, 1},
		{[]int32{1, 2, 3}, []int32{1, 9, 3}, 2},
		{[]int32{1, 2, 3, 4, 5}, []int32{1, 4, 5, 6}, 3},
		{[]int32{1, 2}, nil, 2},
		{[]int32{7, 1, 2, 3, 8, 4}, []int32{1, 2, 3, 4}, 2},
	}
	for _, c := range cases {
		if got := DiffTokens(c.a, c.b); got != c.want {
			t.Errorf("DiffTokens(%v, %v) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestWithExtra(t *testing.T) {
	got, err := withExtra([]byte(`{"a":1}`), map[string]any{"b": "x"})
	if err != nil || string(got) != `{"a":1,"b":"x"}` {
		t.Fatalf("%s %v", got, err)
	}
	got, err = withExtra([]byte(`{}`), map[string]any{"b": 2})
	if err != nil || string(got) != `{"b":2}` {
		t.Fatalf("%s %v", got, err)
	}
	if _, err := withExtra([]byte(`[1]`), map[string]any{"b": 2}); err == nil {
		t.Fatal("non-object accepted")
	}
}

// BenchmarkGeneratePathInMemory is the client's own CPU per generation
// (encode, routing, metrics, decode, validation) with the network replaced
// by an in-memory 200: the part of the overhead this package controls.
func BenchmarkGeneratePathInMemory(b *testing.B) {
	var resp bytes.Buffer
	resp.WriteString(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"`)
	resp.WriteString(strings.Repeat("x", 16))
	resp.WriteString(`","logprobs":{"text_offset":[`)
	for i := range 16 {
		if i > 0 {
			resp.WriteString(",")
		}
		fmt.Fprintf(&resp, "%d", i)
	}
	resp.WriteString(`],"token_logprobs":[`)
	for i := range 16 {
		if i > 0 {
			resp.WriteString(",")
		}
		resp.WriteString("-0.123456")
	}
	resp.WriteString(`],"tokens":[`)
	for i := range 16 {
		if i > 0 {
			resp.WriteString(",")
		}
		fmt.Fprintf(&resp, `"token_id:%d"`, 120+i)
	}
	resp.WriteString(`],"top_logprobs":null},"finish_reason":"length","stop_reason":null,"token_ids":[`)
	for i := range 16 {
		if i > 0 {
			resp.WriteString(",")
		}
		fmt.Fprintf(&resp, "%d", 120+i)
	}
	resp.WriteString(`],"prompt_logprobs":null,"prompt_token_ids":null}],"usage":{"prompt_tokens":512,"completion_tokens":16,"total_tokens":528}}`)
	p, err := NewPool(PoolConfig{Endpoints: []string{"http://bench.invalid"}, Retries: -1})
	if err != nil {
		b.Fatal(err)
	}
	p.caller.hc = &http.Client{Transport: bodyTransport{resp.Bytes()}}
	prompt := make([]int32, 512)
	for i := range prompt {
		prompt[i] = int32(1000 + i*37)
	}
	temp := 1.0
	in := genInput{model: "m", prompt: prompt, maxTokens: 16, s: Sampling{Temperature: &temp}, opts: CallOptions{RequestID: "bench-t1"}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := (completionsGen{}).generate(ctx, p, in); err != nil {
			b.Fatal(err)
		}
	}
}

// Entries are matched from the end: a character split over several tokens
// has an entry only for its last token.
func TestAlignProbs(t *testing.T) {
	id := func(v int32) *int32 { return &v }
	lp := func(v float64) *float64 { return &v }
	// 0xE3 0x80 0x80 (one 3-byte character), then 'a': entries for the
	// completing 0x80 and for 'a' only.
	ids := []int32{0xE3, 0x80, 0x80, 'a'}
	probs := []LlamaProb{{ID: id(0x80), Logprob: lp(-0.5), Bytes: []int{0xE3, 0x80, 0x80}}, {ID: id('a'), Logprob: lp(-0.25), Bytes: []int{'a'}}}
	lps, missing, err := alignProbs(ids, probs)
	if err != nil || !slices.Equal(missing, []int{0, 1}) || !slices.Equal(lps, []float32{1, 1, -0.5, -0.25}) {
		t.Fatalf("lps %v missing %v err %v", lps, missing, err)
	}
	// A generation cut inside a character: the trailing ids have none.
	lps, missing, err = alignProbs([]int32{'a', 0xE3}, []LlamaProb{{ID: id('a'), Logprob: lp(-1), Bytes: []int{'a'}}})
	if err != nil || !slices.Equal(missing, []int{1}) || lps[0] != -1 {
		t.Fatalf("lps %v missing %v err %v", lps, missing, err)
	}
	if _, _, err := alignProbs([]int32{1, 2}, []LlamaProb{{ID: id(3), Logprob: lp(-1)}}); err == nil {
		t.Fatal("an entry for an id never sampled was accepted")
	}
}

// Repeated ids make more than one placement of the entries fit: the
// entries' byte counts decide where they can, and an entry whose place is
// still open is not used (its ids stay untrained) — never a guess.
func TestAlignProbsAmbiguous(t *testing.T) {
	id := func(v int32) *int32 { return &v }
	lp := func(v float64) *float64 { return &v }
	// Without byte counts, 0xE3 0x80 0x80 'a' with entries for a 0x80 and
	// 'a': the 0x80 entry may be either continuation byte.
	lps, missing, err := alignProbs([]int32{0xE3, 0x80, 0x80, 'a'}, []LlamaProb{{ID: id(0x80), Logprob: lp(-0.5)}, {ID: id('a'), Logprob: lp(-0.25)}})
	if err != nil || !slices.Equal(missing, []int{0, 1, 2}) || !slices.Equal(lps, []float32{1, 1, 1, -0.25}) {
		t.Fatalf("open placement: lps %v missing %v err %v", lps, missing, err)
	}
	// 'a' 'a' 0xE3 with one entry for 'a' of one byte: it covers only its
	// own token, so it is the first id.
	lps, missing, err = alignProbs([]int32{'a', 'a', 0xE3}, []LlamaProb{{ID: id('a'), Logprob: lp(-1), Bytes: []int{'a'}}})
	if err != nil || !slices.Equal(missing, []int{1, 2}) || !slices.Equal(lps, []float32{-1, 1, 1}) {
		t.Fatalf("placement by byte count: lps %v missing %v err %v", lps, missing, err)
	}
	// One entry per id: positional, and a mismatching id is an error.
	if _, _, err := alignProbs([]int32{1, 2}, []LlamaProb{{ID: id(2), Logprob: lp(-1)}, {ID: id(1), Logprob: lp(-1)}}); err == nil {
		t.Fatal("entries out of order were accepted")
	}
}
