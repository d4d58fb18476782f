package render

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// ggufKV is one metadata entry for ggufBytes: the value is a string,
// bool, uint32 (written as uint32), int32, uint64, int64, float32,
// float64, uint8, int8, uint16, int16, []string, []int32, []uint8 or
// []any of []string (an array of arrays).
type ggufKV struct {
	key   string
	value any
}

// ggufBytes writes a GGUF v3 header with the entries and no tensors.
func ggufBytes(t testing.TB, kvs ...ggufKV) []byte {
	t.Helper()
	var b bytes.Buffer
	le := binary.LittleEndian
	b.WriteString("GGUF")
	_ = binary.Write(&b, le, uint32(3))
	_ = binary.Write(&b, le, uint64(0))
	_ = binary.Write(&b, le, uint64(len(kvs)))
	for _, kv := range kvs {
		writeGGUFString(&b, kv.key)
		writeGGUFValue(t, &b, kv.value, true)
	}
	return b.Bytes()
}

func writeGGUFString(b *bytes.Buffer, s string) {
	_ = binary.Write(b, binary.LittleEndian, uint64(len(s)))
	b.WriteString(s)
}

// writeGGUFValue writes v, preceded by its type when typed.
func writeGGUFValue(t testing.TB, b *bytes.Buffer, v any, typed bool) {
	le := binary.LittleEndian
	typ := func(x uint32) {
		if typed {
			_ = binary.Write(b, le, x)
		}
	}
	switch v := v.(type) {
	case string:
		typ(ggufString)
		writeGGUFString(b, v)
	case bool:
		typ(ggufBool)
		_ = binary.Write(b, le, v)
	case uint8:
		typ(ggufUint8)
		b.WriteByte(v)
	case int8:
		typ(ggufInt8)
		_ = binary.Write(b, le, v)
	case uint16:
		typ(ggufUint16)
		_ = binary.Write(b, le, v)
	case int16:
		typ(ggufInt16)
		_ = binary.Write(b, le, v)
	case uint32:
		typ(ggufUint32)
		_ = binary.Write(b, le, v)
	case int32:
		typ(ggufInt32)
		_ = binary.Write(b, le, v)
	case uint64:
		typ(ggufUint64)
		_ = binary.Write(b, le, v)
	case int64:
		typ(ggufInt64)
		_ = binary.Write(b, le, v)
	case float32:
		typ(ggufFloat32)
		_ = binary.Write(b, le, math.Float32bits(v))
	case float64:
		typ(ggufFloat64)
		_ = binary.Write(b, le, math.Float64bits(v))
	case []string:
		typ(ggufArray)
		_ = binary.Write(b, le, ggufString)
		_ = binary.Write(b, le, uint64(len(v)))
		for _, s := range v {
			writeGGUFString(b, s)
		}
	case []int32:
		typ(ggufArray)
		_ = binary.Write(b, le, ggufInt32)
		_ = binary.Write(b, le, uint64(len(v)))
		for _, x := range v {
			_ = binary.Write(b, le, x)
		}
	case []any:
		typ(ggufArray)
		_ = binary.Write(b, le, ggufArray)
		_ = binary.Write(b, le, uint64(len(v)))
		for _, x := range v {
			writeGGUFValue(t, b, x, false)
		}
	default:
		t.Fatalf("ggufBytes: unsupported value %T", v)
	}
}

// tinyGGUF is a byte-level BPE model: the 256 byte symbols, a few merges
// and the Qwen-style added tokens; extra entries replace (or, with a nil
// value, remove) the defaults.
func tinyGGUF(t testing.TB, pre string, extra ...ggufKV) []byte {
	t.Helper()
	tokens, types := []string{}, []int32{}
	for b := range 256 {
		tokens, types = append(tokens, byteLevel[b]), append(types, tokNormal)
	}
	merges := []string{"h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d", "Ġ Ġ", "1 2"}
	for _, m := range merges {
		tokens, types = append(tokens, strings.ReplaceAll(m, " ", "")), append(types, tokNormal)
	}
	for _, s := range []struct {
		text string
		typ  int32
	}{{"<|endoftext|>", tokControl}, {"<|im_start|>", tokControl}, {"<|im_end|>", tokControl},
		{"<think>", tokUserDefined}, {"</think>", tokUserDefined}, {"<tool_call>", tokUserDefined}, {"<x>", tokUnused}} {
		tokens, types = append(tokens, s.text), append(types, s.typ)
	}
	kvs := []ggufKV{
		{"general.architecture", "qwen3"}, {"general.alignment", uint32(32)},
		{keyModel, "gpt2"}, {keyPre, pre}, {keyTokens, tokens}, {keyTokenType, types}, {keyMerges, merges},
		{keyBOS, uint32(idOf(tokens, "<|endoftext|>"))}, {keyEOS, uint32(idOf(tokens, "<|im_end|>"))},
		{keyAddBOS, false}, {keyChatTemplate, "{{ messages }}"},
	}
	for _, e := range extra {
		kvs = slices.DeleteFunc(kvs, func(kv ggufKV) bool { return kv.key == e.key })
		if e.value != nil { // nil removes the key
			kvs = append(kvs, e)
		}
	}
	return ggufBytes(t, kvs...)
}

const tokUnused = 5

func idOf(tokens []string, s string) int { return slices.Index(tokens, s) }

func writeFile(t testing.TB, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadGGUFTiny(t *testing.T) {
	src, err := ReadGGUF(writeFile(t, tinyGGUF(t, "qwen2")))
	if err != nil {
		t.Fatal(err)
	}
	if src.BOS != "<|endoftext|>" || src.EOS != "<|im_end|>" || src.BOSID != 267 || src.AddBOS || src.ChatTemplate != "{{ messages }}" {
		t.Errorf("source %+v", src)
	}
	if n := src.Tokenizer.VocabSize(); n != 256+11+7 {
		t.Errorf("VocabSize %d", n)
	}
	// Without add_bos_token, llama.cpp's default for the pre-tokenizer;
	// without bos_token_id, no BOS.
	for pre, want := range map[string]bool{"llama-bpe": true, "qwen2": false, "": false} {
		src, err := ReadGGUF(writeFile(t, tinyGGUF(t, pre, ggufKV{keyAddBOS, nil}, ggufKV{keyBOS, nil})))
		if err != nil {
			t.Fatal(err)
		}
		if src.AddBOS != want || src.BOSID != -1 || src.BOS != "" {
			t.Errorf("pre %q: AddBOS %v BOS %q/%d, want AddBOS %v and no BOS", pre, src.AddBOS, src.BOS, src.BOSID, want)
		}
	}
}

func TestReadGGUFValueTypes(t *testing.T) {
	b := ggufBytes(t,
		ggufKV{"u8", uint8(200)}, ggufKV{"i8", int8(-3)}, ggufKV{"u16", uint16(65000)}, ggufKV{"i16", int16(-300)},
		ggufKV{"u32", uint32(4e9)}, ggufKV{"i32", int32(-7)}, ggufKV{"u64", uint64(1 << 60)}, ggufKV{"i64", int64(-1 << 60)},
		ggufKV{"f32", float32(1.5)}, ggufKV{"f64", 2.25}, ggufKV{"b", true}, ggufKV{"s", "héllo"},
		ggufKV{"as", []string{"a", "", "c"}}, ggufKV{"ai", []int32{1, -2}},
		ggufKV{"aa", []any{[]string{"x"}, []string{"y", "z"}}})
	meta, err := readGGUFMeta(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"u8": uint64(200), "i8": int64(-3), "u16": uint64(65000), "i16": int64(-300), "u32": uint64(4e9),
		"i32": int64(-7), "u64": uint64(1 << 60), "i64": int64(-1 << 60), "f32": 1.5, "f64": 2.25, "b": true, "s": "héllo",
	}
	for k, v := range want {
		if meta[k] != v {
			t.Errorf("%s = %#v, want %#v", k, meta[k], v)
		}
	}
	if !slices.Equal(meta["as"].([]string), []string{"a", "", "c"}) || !slices.Equal(meta["ai"].([]int64), []int64{1, -2}) {
		t.Errorf("arrays %#v %#v", meta["as"], meta["ai"])
	}
	if aa := meta["aa"].([]any); len(aa) != 2 || !slices.Equal(aa[1].([]string), []string{"y", "z"}) {
		t.Errorf("array of arrays %#v", meta["aa"])
	}
}

func TestReadGGUFErrors(t *testing.T) {
	valid := tinyGGUF(t, "qwen2")
	huge := ggufBytes(t, ggufKV{keyModel, "gpt2"})
	// Claim a 2^62-byte string for the value.
	binary.LittleEndian.PutUint64(huge[len(huge)-12:], 1<<62)
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"bad magic", []byte("GGML\x03\x00\x00\x00"), "not a GGUF file"},
		{"version 1", append([]byte("GGUF\x01\x00\x00\x00"), make([]byte, 16)...), "version 1"},
		{"big-endian", append([]byte("GGUF\x00\x00\x00\x03"), make([]byte, 16)...), "not supported"},
		{"truncated", valid[:len(valid)/2], "truncated"},
		{"huge string", huge, "string of"},
		{"huge kv count", append([]byte("GGUF\x03\x00\x00\x00"), append(make([]byte, 8), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f)...), "metadata entries"},
		{"sentencepiece", tinyGGUF(t, "qwen2", ggufKV{keyModel, "llama"}), `tokenizer model "llama" (SentencePiece) is not supported: only byte-level BPE`},
		{"wordpiece", tinyGGUF(t, "qwen2", ggufKV{keyModel, "bert"}), `"bert" (WordPiece) is not supported`},
		{"unknown pre", tinyGGUF(t, "tekken"), `pre-tokenizer "tekken" is not supported`},
		{"no tokens", ggufBytes(t, ggufKV{keyModel, "gpt2"}), "tokenizer.ggml.tokens: missing"},
		{"bad merge", tinyGGUF(t, "qwen2", ggufKV{keyMerges, []string{"ab"}}), `merge 0 "ab"`},
		{"type count", tinyGGUF(t, "qwen2", ggufKV{keyTokenType, []int32{1}}), "token_type has 1 entries"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadGGUF(writeFile(t, c.data))
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "render: read gguf ") {
				t.Errorf("err %v, want it to contain %q", err, c.want)
			}
		})
	}
	if _, err := ReadGGUF(filepath.Join(t.TempDir(), "missing.gguf")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
}

// FuzzReadGGUF: any bytes give a Source or an error, never a panic or a
// runaway allocation.
func FuzzReadGGUF(f *testing.F) {
	f.Add(tinyGGUF(f, "qwen2"))
	f.Add(tinyGGUF(f, "llama-bpe"))
	f.Add(ggufBytes(f, ggufKV{"aa", []any{[]string{"x"}}}, ggufKV{"f", 1.0}))
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		meta, err := readGGUFMeta(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		src, err := meta.source()
		if err != nil {
			return
		}
		if _, err := src.Tokenizer.Encode("hello <|im_start|> world 12", true); err != nil {
			t.Fatal(err)
		}
	})
}
