package render

import "fmt"

// GGUFVocab exposes, to the external tests, the tokenizer data of a GGUF
// file: token texts, token types and merges.
func GGUFVocab(path string) (tokens []string, types []int64, merges []string, err error) {
	meta, err := readGGUFPath(path)
	if err != nil {
		return nil, nil, nil, err
	}
	tokens, _ = meta[keyTokens].([]string)
	types, _ = meta[keyTokenType].([]int64)
	merges, _ = meta[keyMerges].([]string)
	return tokens, types, merges, nil
}

// ResetCache empties t's per-word cache.
func ResetCache(t *Tokenizer) { t.cache = &wordCache{} }

// SyntheticVocab returns a vocabulary of the same size and special tokens
// as tokens/types (the 256 byte symbols first), whose other normal tokens
// and merges spell each of words (raw text, built up left to right), then
// each of whole (raw text, a token without merges), then fillers.
func SyntheticVocab(tokens []string, types []int64, words, whole []string) ([]string, []int32, []string, error) {
	out := append([]string(nil), tokens...)
	outTypes := make([]int32, len(types))
	var slots []int
	for i, typ := range types {
		outTypes[i] = int32(typ)
		if i >= 256 && typ == tokNormal {
			slots = append(slots, i)
		} else if i < 256 && tokens[i] != byteLevel[i] {
			return nil, nil, nil, fmt.Errorf("token %d is %q, not the byte symbol %q", i, tokens[i], byteLevel[i])
		}
	}
	seen := map[string]bool{}
	for _, s := range out[:256] {
		seen[s] = true
	}
	var merges []string
	next := 0
	add := func(tok string) error {
		if next >= len(slots) {
			return fmt.Errorf("more than %d synthetic tokens", len(slots))
		}
		seen[tok] = true
		out[slots[next]] = tok
		next++
		return nil
	}
	for _, w := range words {
		cur := byteLevel[w[0]]
		for i := 1; i < len(w); i++ {
			sym := byteLevel[w[i]]
			if !seen[cur+sym] {
				merges = append(merges, cur+" "+sym)
				if err := add(cur + sym); err != nil {
					return nil, nil, nil, err
				}
			}
			cur += sym
		}
	}
	for _, w := range whole {
		if tok := string(appendByteLevel(nil, w)); !seen[tok] {
			if err := add(tok); err != nil {
				return nil, nil, nil, err
			}
		}
	}
	for i := 0; next < len(slots); i++ {
		if tok := fmt.Sprintf("ĠzzfillĠ%d", i); !seen[tok] {
			_ = add(tok)
		}
	}
	return out, outTypes, merges, nil
}
