package render

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// Source is what a model file says about its tokenizer and template.
type Source struct {
	// Tokenizer tokenises as the engine does.
	Tokenizer *Tokenizer
	// ChatTemplate is the default chat template ("" when none).
	ChatTemplate string
	// BOS and EOS are the token texts ("" when none).
	BOS, EOS string
	// BOSID is the BOS token id, -1 when none.
	BOSID int32
	// AddBOS reports whether the tokenizer prepends BOS when special
	// tokens are added (GGUF tokenizer.ggml.add_bos_token; Hugging Face:
	// tokenizer_config.json add_bos_token or the post_processor).
	AddBOS bool
}

// GGUF metadata value types.
const (
	ggufUint8 uint32 = iota
	ggufInt8
	ggufUint16
	ggufInt16
	ggufUint32
	ggufInt32
	ggufFloat32
	ggufBool
	ggufString
	ggufArray
	ggufUint64
	ggufInt64
	ggufFloat64
)

// Limits on what a GGUF header may ask for, beyond the file's own size.
const (
	maxGGUFString     = 64 << 20
	maxGGUFArrayDepth = 4
)

// ggufMeta is a GGUF file's metadata: each value is an uint64 (unsigned
// integers), int64 (signed), float64, bool, string, or an array: []string,
// []int64 (integers up to 32 bits and int64), []uint64, []float64, []bool
// or []any (arrays of arrays).
type ggufMeta map[string]any

// ggufReader reads little-endian GGUF values, never past left bytes.
type ggufReader struct {
	r    *bufio.Reader
	left int64
	buf  [8]byte
}

var errGGUFShort = errors.New("truncated file")

func (g *ggufReader) take(n int64) error {
	if n < 0 || n > g.left {
		return errGGUFShort
	}
	g.left -= n
	return nil
}

func (g *ggufReader) fixed(n int) ([]byte, error) {
	if err := g.take(int64(n)); err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(g.r, g.buf[:n]); err != nil {
		return nil, err
	}
	return g.buf[:n], nil
}

func (g *ggufReader) u32() (uint32, error) {
	b, err := g.fixed(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (g *ggufReader) u64() (uint64, error) {
	b, err := g.fixed(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

func (g *ggufReader) str() (string, error) {
	n, err := g.u64()
	if err != nil {
		return "", err
	}
	if n > maxGGUFString {
		return "", fmt.Errorf("string of %d bytes", n)
	}
	if err := g.take(int64(n)); err != nil {
		return "", err
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(g.r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// scalarSize is the encoded size of a fixed-size type, 0 for others.
func scalarSize(typ uint32) int {
	switch typ {
	case ggufUint8, ggufInt8, ggufBool:
		return 1
	case ggufUint16, ggufInt16:
		return 2
	case ggufUint32, ggufInt32, ggufFloat32:
		return 4
	case ggufUint64, ggufInt64, ggufFloat64:
		return 8
	}
	return 0
}

// scalar reads one fixed-size value.
func (g *ggufReader) scalar(typ uint32) (any, error) {
	b, err := g.fixed(scalarSize(typ))
	if err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	switch typ {
	case ggufUint8:
		return uint64(b[0]), nil
	case ggufInt8:
		return int64(int8(b[0])), nil
	case ggufUint16:
		return uint64(le.Uint16(b)), nil
	case ggufInt16:
		return int64(int16(le.Uint16(b))), nil
	case ggufUint32:
		return uint64(le.Uint32(b)), nil
	case ggufInt32:
		return int64(int32(le.Uint32(b))), nil
	case ggufFloat32:
		return float64(math.Float32frombits(le.Uint32(b))), nil
	case ggufBool:
		return b[0] != 0, nil
	case ggufUint64:
		return le.Uint64(b), nil
	case ggufInt64:
		return int64(le.Uint64(b)), nil
	case ggufFloat64:
		return math.Float64frombits(le.Uint64(b)), nil
	}
	return nil, fmt.Errorf("value type %d", typ)
}

// value reads a value of type typ.
func (g *ggufReader) value(typ uint32, depth int) (any, error) {
	switch {
	case typ == ggufString:
		return g.str()
	case typ == ggufArray:
		return g.array(depth)
	case scalarSize(typ) > 0:
		return g.scalar(typ)
	}
	return nil, fmt.Errorf("unknown value type %d", typ)
}

// array reads an array: element type, count, elements.
func (g *ggufReader) array(depth int) (any, error) {
	if depth >= maxGGUFArrayDepth {
		return nil, errors.New("arrays nested too deep")
	}
	typ, err := g.u32()
	if err != nil {
		return nil, err
	}
	n, err := g.u64()
	if err != nil {
		return nil, err
	}
	min := uint64(scalarSize(typ))
	if typ == ggufString || typ == ggufArray {
		min = 8
	}
	if min == 0 {
		return nil, fmt.Errorf("array of unknown value type %d", typ)
	}
	if n > uint64(g.left)/min {
		return nil, fmt.Errorf("array of %d elements of type %d in %d bytes", n, typ, g.left)
	}
	return g.elements(typ, int(n), depth)
}

// elements reads n array elements into the slice type for typ.
func (g *ggufReader) elements(typ uint32, n, depth int) (any, error) {
	switch typ {
	case ggufString:
		out := make([]string, 0, n)
		for range n {
			s, err := g.str()
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	case ggufArray:
		out := make([]any, 0, n)
		for range n {
			v, err := g.array(depth + 1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return g.scalars(typ, n)
}

// scalars reads n fixed-size elements.
func (g *ggufReader) scalars(typ uint32, n int) (any, error) {
	var (
		ints   []int64
		uints  []uint64
		floats []float64
		bools  []bool
	)
	for range n {
		v, err := g.scalar(typ)
		if err != nil {
			return nil, err
		}
		switch v := v.(type) {
		case int64:
			ints = append(ints, v)
		case uint64:
			if typ == ggufUint64 {
				uints = append(uints, v)
			} else {
				ints = append(ints, int64(v))
			}
		case float64:
			floats = append(floats, v)
		case bool:
			bools = append(bools, v)
		}
	}
	switch typ {
	case ggufUint64:
		return nonNil(uints), nil
	case ggufFloat32, ggufFloat64:
		return nonNil(floats), nil
	case ggufBool:
		return nonNil(bools), nil
	}
	return nonNil(ints), nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// readGGUFMeta reads the header and metadata of a GGUF v2 or v3 stream of
// size bytes; it stops before the tensor infos.
func readGGUFMeta(r io.Reader, size int64) (ggufMeta, error) {
	g := &ggufReader{r: bufio.NewReaderSize(r, 1<<16), left: size}
	magic, err := g.fixed(4)
	if err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if string(magic) != "GGUF" {
		return nil, fmt.Errorf("not a GGUF file (magic %q)", magic)
	}
	version, err := g.u32()
	if err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if version != 2 && version != 3 {
		return nil, fmt.Errorf("GGUF version %d is not supported (only 2 and 3, little-endian)", version)
	}
	if _, err := g.u64(); err != nil { // tensor count
		return nil, fmt.Errorf("header: %w", err)
	}
	n, err := g.u64()
	if err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if n > uint64(g.left)/13 { // a key needs at least 8+1 bytes, its type 4
		return nil, fmt.Errorf("header: %d metadata entries in %d bytes", n, g.left)
	}
	meta := make(ggufMeta, min(n, 1024))
	for i := range n {
		key, err := g.str()
		if err != nil {
			return nil, fmt.Errorf("metadata entry %d: key: %w", i, err)
		}
		typ, err := g.u32()
		if err != nil {
			return nil, fmt.Errorf("metadata %s: %w", key, err)
		}
		v, err := g.value(typ, 0)
		if err != nil {
			return nil, fmt.Errorf("metadata %s: %w", key, err)
		}
		meta[key] = v
	}
	return meta, nil
}

// ReadGGUF reads the tokenizer and chat template of a llama.cpp model
// file. Only byte-level BPE (tokenizer.ggml.model "gpt2") is supported.
// It reads the metadata only, not the tensors.
func ReadGGUF(path string) (*Source, error) {
	src, err := readGGUFFile(path)
	if err != nil {
		return nil, fmt.Errorf("render: read gguf %s: %w", path, err)
	}
	return src, nil
}

func readGGUFFile(path string) (*Source, error) {
	meta, err := readGGUFPath(path)
	if err != nil {
		return nil, err
	}
	return meta.source()
}

// readGGUFPath reads the metadata of the GGUF file at path.
func readGGUFPath(path string) (ggufMeta, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return readGGUFMeta(f, st.Size())
}

// Keys of the GGUF tokenizer metadata.
const (
	keyModel        = "tokenizer.ggml.model"
	keyPre          = "tokenizer.ggml.pre"
	keyTokens       = "tokenizer.ggml.tokens"
	keyTokenType    = "tokenizer.ggml.token_type"
	keyMerges       = "tokenizer.ggml.merges"
	keyBOS          = "tokenizer.ggml.bos_token_id"
	keyEOS          = "tokenizer.ggml.eos_token_id"
	keyAddBOS       = "tokenizer.ggml.add_bos_token"
	keyChatTemplate = "tokenizer.chat_template"
)

// GGUF token types (tokenizer.ggml.token_type).
const (
	tokNormal      = 1
	tokUnknown     = 2
	tokControl     = 3
	tokUserDefined = 4
)

// modelNames explains the tokenizer models that are not supported.
var modelNames = map[string]string{
	"llama": "SentencePiece", "t5": "Unigram", "bert": "WordPiece", "rwkv": "RWKV", "plamo2": "PLaMo-2",
}

// source builds the Source the metadata describes.
func (m ggufMeta) source() (*Source, error) {
	model, _ := m[keyModel].(string)
	if model != "gpt2" {
		desc := fmt.Sprintf("%q", model)
		if kind, ok := modelNames[model]; ok {
			desc += " (" + kind + ")"
		}
		return nil, fmt.Errorf("tokenizer model %s is not supported: only byte-level BPE (\"gpt2\")", desc)
	}
	tokens, ok := m[keyTokens].([]string)
	if !ok || len(tokens) == 0 {
		return nil, fmt.Errorf("%s: missing or not an array of strings", keyTokens)
	}
	pre, _ := m[keyPre].(string)
	lp, err := llamaPreTokenizer(pre)
	if err != nil {
		return nil, err
	}
	spec, err := m.spec(tokens, lp)
	if err != nil {
		return nil, err
	}
	tok, err := newTokenizer(spec)
	if err != nil {
		return nil, err
	}
	src := &Source{Tokenizer: tok, BOSID: -1}
	src.ChatTemplate, _ = m[keyChatTemplate].(string)
	// Without the key llama.cpp falls back to id 11 for "gpt2" models; a
	// Source says only what the file says.
	if id, ok := m.tokenID(keyBOS, len(tokens)); ok {
		src.BOSID, src.BOS = id, tokens[id]
	}
	if id, ok := m.tokenID(keyEOS, len(tokens)); ok {
		src.EOS = tokens[id]
	}
	src.AddBOS = lp.addBOS
	if v, ok := m[keyAddBOS].(bool); ok {
		src.AddBOS = v
	}
	return src, nil
}

// spec gathers the tokenizer's parts from the metadata.
func (m ggufMeta) spec(tokens []string, lp llamaPre) (tokenizerSpec, error) {
	merges, ok := m[keyMerges].([]string)
	if _, present := m[keyMerges]; present && !ok {
		return tokenizerSpec{}, fmt.Errorf("%s: not an array of strings", keyMerges)
	}
	types, _ := m[keyTokenType].([]int64)
	if types != nil && len(types) != len(tokens) {
		return tokenizerSpec{}, fmt.Errorf("%s has %d entries for %d tokens", keyTokenType, len(types), len(tokens))
	}
	spec := tokenizerSpec{
		vocab: make(map[string]int32, len(tokens)), size: len(tokens), merges: merges,
		ignoreMerges: lp.ignoreMerges, pre: lp.pre,
	}
	for i, s := range tokens {
		spec.vocab[s] = int32(i)
		if types != nil && (types[i] == tokControl || types[i] == tokUserDefined || types[i] == tokUnknown) {
			spec.added = append(spec.added, addedToken{text: s, id: int32(i)})
		}
	}
	return spec, nil
}

// tokenID returns the token id stored under key, when present and in
// range.
func (m ggufMeta) tokenID(key string, n int) (int32, bool) {
	var id int64
	switch v := m[key].(type) {
	case uint64:
		if v >= uint64(n) {
			return 0, false
		}
		id = int64(v)
	case int64:
		id = v
	default:
		return 0, false
	}
	if id < 0 || id >= int64(n) {
		return 0, false
	}
	return int32(id), true
}
