// Package render turns chat prompts into token ids in-process, as the
// inference engine does, for tokens mode's local render
// (inference.Config.LocalRender; docs/inference.md, "Local render"): a
// Model is a model's chat template and tokenizer read from its own files
// (Open).
//
// The template (template.go) runs on github.com/ardanlabs/jinja, fed as
// llama.cpp's server feeds templates, with tojson printing as Python's
// json.dumps. The tokenizer is byte-level BPE (GPT-2's byte-to-unicode
// mapping) with added and special tokens, read from a llama.cpp GGUF model
// file (ReadGGUF) or a Hugging Face model directory (ReadHF). The
// pre-tokenizers are hand-written scanners equivalent to llama.cpp's
// regular expressions for "qwen2", "llama-bpe" (Llama 3), "gpt-2" and
// "default"; a Hugging Face Split pre-tokenizer with another expression
// runs it with regexp2. Other tokenizer models (SentencePiece, Unigram,
// WordPiece), normalizers other than none or NFC, and other pre-tokenizer
// types are refused with an error naming what is not supported.
//
// The tests hold Encode to a real llama-server's /tokenize and Apply to its
// /apply-template on the project's tiny Qwen3 GGUF, through both ReadGGUF
// and ReadHF. The package imports nothing of the project; the caller (package
// inference) checks its renders against the server's before trusting them.
package render
