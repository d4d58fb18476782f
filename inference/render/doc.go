// Package render turns chat prompts into token ids in-process, exactly as
// the inference engine would, so the gateway need not ask the engine over
// HTTP.
//
// This part is the tokenizer: byte-level BPE (GPT-2's byte-to-unicode
// mapping) with added and special tokens, read from a llama.cpp GGUF model
// file (ReadGGUF) or a Hugging Face model directory (ReadHF). The
// pre-tokenizers are hand-written scanners equivalent to llama.cpp's
// regular expressions for "qwen2", "llama-bpe" (Llama 3), "gpt-2" and
// "default"; a Hugging Face Split pre-tokenizer with another expression
// runs it with regexp2. Other tokenizer models (SentencePiece, Unigram,
// WordPiece), normalizers other than none or NFC, and other pre-tokenizer
// types are refused with an error naming what is not supported.
//
// The tests hold Encode to a real llama-server's /tokenize on the
// project's tiny Qwen3 GGUF, through both ReadGGUF and ReadHF.
package render
