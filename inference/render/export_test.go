package render

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
