package inference

import (
	"math"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"

	json "github.com/segmentio/encoding/json"
)

// completionSeed is a /v1/completions answer as vLLM sends it.
const completionSeed = `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"ab","token_ids":[1,2],` +
	`"prompt_token_ids":[5,6,7],"finish_reason":"stop","stop_reason":null,"logprobs":{"tokens":["token_id:1","token_id:2"],` +
	`"token_logprobs":[-0.1,-0.2],"top_logprobs":null,"text_offset":[0,1]}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`

// wireSeeds are bodies as servers send them, and the edges of the
// grammar the one-pass id parser has to check itself.
var wireSeeds = []string{
	`{"count":3,"max_model_len":32768,"tokens":[151644,872,198]}`,
	`{"count":0,"max_model_len":4096,"tokens":[]}`,
	`{"tokens":null}`, `null`, ` {"tokens" : [ 1 , 2 ] } `, `{"TOKENS":[7],"Count":1}`, `{"tok\u0065ns":[7]}`,
	`{"tokens":[01]}`, `{"tokens":[-0]}`, `{"tokens":[1.0]}`, `{"tokens":[1e2]}`, `{"tokens":[2147483647,-2147483648]}`,
	`{"tokens":[2147483648]}`, `{"tokens":[1,]}`, `{"tokens":[-]}`, `{"tokens":[1}`, `{"tokens":[1] `, `{"tokens":[1]}x`,
	completionSeed,
	`{"choices":[{"index":0,"text":"a\"b\\u00e9","token_ids":[3],"prompt_token_ids":null,"finish_reason":"length","stop_reason":151645}]}`,
	`{"choices":[null,{"index":1}]}`, `{"choices":null}`, `{"choices":[]}`, `{"choices":{}}`, `{"choices":[1]}`,
	`{"choices":[{"index":"0"}]}`, `{"usage":null,"id":null}`, `{"a":{"b":[1,{"c":"}]"}]},"tokens":[4]}`, `{"a":tru}`, `{"a":"x`, `[]`, `"x"`, `{`,
	`{"choices":[{"logprobs":{"tokens":["a",null,"\u00e9\n","token_id:5"],"token_logprobs":[-0.1e-3,null,0,-12.5E+2]}}]}`,
	`{"choices":[{"logprobs":{"token_logprobs":[1.]}}]}`, `{"choices":[{"logprobs":{"token_logprobs":[.5]}}]}`,
	`{"choices":[{"logprobs":{"token_logprobs":[+1]}}]}`, `{"choices":[{"logprobs":{"token_logprobs":[NaN]}}]}`,
	`{"choices":[{"logprobs":{"token_logprobs":[-]}}]}`, `{"choices":[{"logprobs":{"token_logprobs":[1e400]}}]}`,
	`{"choices":[{"logprobs":{"token_logprobs":[0x1p-2]}}]}`, `{"choices":[{"logprobs":{"token_logprobs":[-01]}}]}`,
	`{"choices":[{"logprobs":null}]}`, `{"choices":[{"logprobs":{}}]}`, `{"choices":[{"logprobs":{"tokens":null,"token_logprobs":[]}}]}`,
	"{\"choices\":[{\"logprobs\":{\"tokens\":[\"\x01\"]}}]}", "{\"choices\":[{\"logprobs\":{\"tokens\":[\"\xff\"]}}]}",
	`{"choices":[{"logprobs":{"tokens":["a\q"]}}]}`, `{"choices":[{"logprobs":{"tokens":[1]}}]}`,
	`{"content":"a","tokens":[5,9],"stop_type":"eos","stopping_word":"","truncated":false,"tokens_predicted":2,"tokens_evaluated":7,` +
		`"completion_probabilities":[{"id":5,"token":"a","logprob":-0.5,"bytes":[97]},{"id":9,"logprob":-0.1}],"generation_settings":{"top_k":40,"n":[1]}}`,
	`{"tokens":[5],"stop_type":"limit","truncated":true,"completion_probabilities":[{"id":6,"prob":0.5}]}`, `{"truncated":1}`,
	`{"a":1,}`, `{"a" 1}`, `{,}`, "{\"a\":\"\x01\"}", "{\"tokens\":[1]\n}", `{"choices":[{"token_ids":[1],"token_ids":[2]}]}`,
	// The fast paths' edges (wirescan.go): values skipped in one pass,
	// plain strings and integers, exact floats, plain token strings.
	`{"x":[{"a":[1,-2.5e-3,true,false,null,"\"\\\/\b\f\n\r\t\u00AfZ"]},{}],"count":7}`, `{"x":"\u00g0"}`, `{"x":"\x"}`, `{"x":[1 2]}`,
	`{"x":{"a" "b"}}`, `{"x":{"a":1 "b":2}}`, `{"x":{1:2}}`, `{"x":tru}`, `{"x":nul}`, `{"x":fals}`, `{"x":1.}`, `{"x":01}`, `{"x":-}`,
	`{"x":1"a"}`, `{"x":1x}`, `{"x":true"a"}`, `{"x":[1]x}`, `{"x":"a"x}`, `{"x":[]`, `{"x":[`, `{"x":{`, `{"x":"\u00`,
	`{"x":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`, `{"x":` + strings.Repeat(`{"a":`, 70) + `1` + strings.Repeat("}", 70) + `}`,
	"{\"x\":\"\x7f\xc3\xa9\xff\"}", "{\"x\xff\":1,\"co\xc3\xbcnt\":2}", "{\"c\x01\":1}", `{"co\u0075nt":3}`, `{"COUNT":3,"count":4}`,
	`{"count":-0}`, `{"count":-12}`, `{"count":007}`, `{"count":123456789012345678}`, `{"count":1234567890123456789}`,
	`{"count":99999999999999999999}`, `{"count":1e2}`, `{"count":1.0}`, `{"count":"1"}`, `{"count":null}`, `{"count":1 }`, `{"count":1]}`,
	`{"id":"\u00e9","choices":[{"text":"caf\u00e9 \"x\"","finish_reason":"stop\n","index":3}]}`, "{\"id\":\"caf\xc3\xa9\",\"choices\":[{\"text\":\"\x7f\"}]}",
	`{"id":null,"choices":[{"text":null,"finish_reason":7,"index":-1}]}`, `{"id":"a"b}`,
	`{"choices":[{"logprobs":{"token_logprobs":[0.1,-0.30000000000000004,1e22,1e23,-1e-22,1e-23,123456789012345,1234567890123456,` +
		`9007199254740993,0.000000000000000000000000000001,-0e5,5e-324,1.7976931348623157e308,4.9e-324,1e-400,-2.2250738585072014e-308,0.1e1,10e-1]}}]}`,
	`{"choices":[{"logprobs":{"token_logprobs":[1e1000]}}]}`, `{"choices":[{"logprobs":{"token_logprobs":[1E+2,1e-0,00.5]}}]}`,
	`{"choices":[{"logprobs":{"tokens":["token_id:1", null ,"é","token_id:2"],"token_logprobs":[]}}]}`,
	`{"choices":[{"logprobs":{"tokens":["a","b\""]}}]}`, `{"choices":[{"logprobs":{"tokens":["a",]}}]}`, `{"choices":[{"logprobs":{"tokens":["a"`,
	`{"choices":[{"logprobs":{"tokens":["a" "b"]}}]}`, `{"choices":[{"logprobs":{"tokens":["a",1]}}]}`, `{"choices":[{"logprobs":{"tokens":[ ]}}]}`,
	`{"choices":[{"logprobs":{"tokens":["]"],"token_logprobs":null}}]}`, `{"choices":[{"logprobs":{"tokens":[nul]}}]}`,
}

// The one-pass decoders give what json.Unmarshal gives: the same values
// when it succeeds, an error when it fails.
func FuzzWireDecodeMatchesCodec(f *testing.F) {
	for _, s := range wireSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkWire(t, body, func() (wireDecoder, any) { return new(TokenizeResponse), new(TokenizeResponse) })
		checkWire(t, body, func() (wireDecoder, any) { return new(CompletionResponse), new(CompletionResponse) })
		checkWire(t, body, func() (wireDecoder, any) { return new(LlamaCompletionResponse), new(LlamaCompletionResponse) })
	})
}

func checkWire(t *testing.T, body []byte, mk func() (wireDecoder, any)) {
	t.Helper()
	got, want := mk()
	gerr := got.decodeWire(body)
	werr := json.Unmarshal(body, want)
	switch {
	case (gerr == nil) != (werr == nil):
		t.Fatalf("%T on %q: one pass says %v, the codec %v", got, body, gerr, werr)
	case gerr == nil && !reflect.DeepEqual(got, want):
		t.Fatalf("%T on %q:\n one pass %+v\n codec    %+v", got, body, got, want)
	}
}

func TestWireDecodeSeeds(t *testing.T) {
	for _, s := range wireSeeds {
		checkWire(t, []byte(s), func() (wireDecoder, any) { return new(TokenizeResponse), new(TokenizeResponse) })
		checkWire(t, []byte(s), func() (wireDecoder, any) { return new(CompletionResponse), new(CompletionResponse) })
		checkWire(t, []byte(s), func() (wireDecoder, any) { return new(LlamaCompletionResponse), new(LlamaCompletionResponse) })
	}
	var r CompletionResponse
	if err := r.decodeWire([]byte(completionSeed)); err != nil {
		t.Fatal(err)
	}
	c := r.Choices[0]
	if c.Text != "ab" || !reflect.DeepEqual([]int32(c.TokenIDs), []int32{1, 2}) || !reflect.DeepEqual(c.PromptTokenIDs.IDs(), []int32{5, 6, 7}) ||
		c.Logprobs == nil || len(c.Logprobs.TokenLogprobs) != 2 || r.Usage == nil || r.Usage.CompletionTokens != 2 {
		t.Fatalf("decoded %+v", r)
	}
	if err := new(TokenizeResponse).decodeWire([]byte(`{"tokens":[01]}`)); err == nil || !strings.Contains(err.Error(), "token ids") {
		t.Fatalf("leading zero: got %v, want a token ids error", err)
	}
}

// wireBody is a /v1/completions answer of a turn deep in an episode: the
// prompt's ids echoed, 256 ids generated with their logprobs.
func wireBody(prompt, gen int) []byte {
	var b strings.Builder
	ids := func(n, seed int) {
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa((i*7919 + seed) % 151000))
		}
	}
	b.WriteString(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"`)
	b.WriteString(strings.Repeat("word ", gen))
	b.WriteString(`","logprobs":{"text_offset":null,"tokens":[`)
	for i := range gen {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"token_id:` + strconv.Itoa(i*31%151000) + `"`)
	}
	b.WriteString(`],"token_logprobs":[`)
	for i := range gen {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatFloat(-float64(i%97)/13.7, 'g', -1, 64))
	}
	b.WriteString(`],"top_logprobs":null},"finish_reason":"stop","stop_reason":null,"token_ids":[`)
	ids(gen, 3)
	b.WriteString(`],"prompt_token_ids":[`)
	ids(prompt, 11)
	b.WriteString(`]}],"usage":{"prompt_tokens":1,"total_tokens":2,"completion_tokens":1}}`)
	return []byte(b.String())
}

func BenchmarkDecodeCompletion(b *testing.B) {
	body := wireBody(4096, 256)
	b.Run("one-pass", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			var r CompletionResponse
			if err := r.decodeWire(body); err != nil {
				b.Fatal(err)
			}
			r.Choices[0].PromptTokenIDs.Release()
		}
	})
	b.Run("codec", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			var r CompletionResponse
			if err := json.Unmarshal(body, &r); err != nil {
				b.Fatal(err)
			}
			r.Choices[0].PromptTokenIDs.Release()
		}
	})
}

func BenchmarkScanIDs(b *testing.B) {
	body := wireBody(4096, 0)
	i := strings.Index(string(body), `"prompt_token_ids":[`) + len(`"prompt_token_ids":`)
	b.SetBytes(int64(len(body) - i))
	buf := make([]int32, 0, 4096)
	for b.Loop() {
		if _, _, err := scanIDs(body, i, buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// simCompletion is a /v1/completions answer as the simulator sends it
// (rollout sim --family hermes, a 200-id prompt, max_tokens 40): vLLM's
// keys in vLLM's order, top_logprobs and text_offset included.
func simCompletion(tb testing.TB) []byte {
	tb.Helper()
	b, err := os.ReadFile("testdata/completion_sim_hermes.json")
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestWireDecodeSimCompletion(t *testing.T) {
	body := simCompletion(t)
	checkWire(t, body, func() (wireDecoder, any) { return new(CompletionResponse), new(CompletionResponse) })
	var r CompletionResponse
	if err := r.decodeWire(body); err != nil {
		t.Fatal(err)
	}
	c := &r.Choices[0]
	if len(c.TokenIDs) != 35 || len(c.PromptTokenIDs.IDs()) != 200 || c.Logprobs == nil || len(c.Logprobs.Tokens) != 35 || len(c.Logprobs.TokenLogprobs) != 35 {
		t.Fatalf("decoded %+v", r)
	}
	c.PromptTokenIDs.Release()
}

// BenchmarkDecodeSimCompletion decodes a simulator's answer to a turn as
// the gateway's does: the body, then the ids checked against the tokens.
func BenchmarkDecodeSimCompletion(b *testing.B) {
	body := simCompletion(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var r CompletionResponse
		if err := r.decodeWire(body); err != nil {
			b.Fatal(err)
		}
		c := &r.Choices[0]
		for i, t := range c.Logprobs.Tokens {
			if id, ok := parseTokenID(t); !ok || id != c.TokenIDs[i] {
				b.Fatal("token mismatch")
			}
		}
		c.PromptTokenIDs.Release()
	}
}

// exactFloat gives what strconv.ParseFloat gives, whenever it answers.
func FuzzExactFloat(f *testing.F) {
	for _, s := range []string{"0", "-0", "0.1", "-0.032681", "1e22", "1e-22", "123456789012345", "9007199254740993", "1.5E+3", "0.000001e-16", "12e300"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		end, ok := numberEnd([]byte(s), 0)
		if !ok || end != len(s) {
			return
		}
		got, ok := exactFloat([]byte(s))
		if !ok {
			return
		}
		want, err := strconv.ParseFloat(s, 64)
		if err != nil || math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("%q: exactFloat %v, ParseFloat %v (%v)", s, got, want, err)
		}
	})
}

func TestExactFloatSeeds(t *testing.T) {
	for _, s := range []string{"0", "-0", "0.1", "-0.032681", "-1.209031", "1e22", "-1e-22", "123456789012345", "0.30000000000000004",
		"1.5E+3", "0.000001e-16", "100000000000000000000000", "4.9e-324", "0.5e-22", "1234567.891e-5"} {
		want, _ := strconv.ParseFloat(s, 64)
		if got, ok := exactFloat([]byte(s)); ok && math.Float64bits(got) != math.Float64bits(want) {
			t.Errorf("%q: exactFloat %v, ParseFloat %v", s, got, want)
		}
	}
}

// parseTokenID reads what its definition says: "token_id:" and a
// non-negative int32 as strconv.ParseInt reads it.
func FuzzParseTokenID(f *testing.F) {
	for _, s := range []string{"token_id:0", "token_id:151645", "token_id:007", "token_id:+5", "token_id:-0", "token_id:2147483647",
		"token_id:2147483648", "token_id:999999999", "token_id:1_0", "token_id:", "token_id:x", "tok"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, wok := int32(0), false
		if rest, ok := strings.CutPrefix(s, "token_id:"); ok {
			if n, err := strconv.ParseInt(rest, 10, 32); err == nil && n >= 0 {
				want, wok = int32(n), true
			}
		}
		if got, ok := parseTokenID(s); got != want || ok != wok {
			t.Fatalf("%q: got %d %v, want %d %v", s, got, ok, want, wok)
		}
	})
}
