#!/usr/bin/env python3
"""Write rollout's tiny random-weight Qwen3-architecture GGUF.

Everything that determines the model is in tiny-qwen3.json (architecture,
initialisation, tokenizer, seed) next to this script, plus corpus.txt (the
text the BPE merges are learned from) and chat_template.jinja. The output is
deterministic: the same inputs and the same numpy give the same bytes.

    make_tiny_gguf.py [--config tiny-qwen3.json] --out DIR [--dump-npz FILE]

writes DIR/tiny-qwen3.gguf and DIR/tiny-qwen3.json (the config plus what was
derived from it: vocabulary size, special token ids, tensor names and shapes
with their Hugging Face names, the file's sha256). --dump-npz also writes
every tensor under its Hugging Face name, in (out, in) layout.

Needs numpy and gguf (Debian: python3-numpy, python3-gguf). See
docs/real-engines.md in the rollout repository.
"""

import argparse
import collections
import hashlib
import json
import os
import re
import sys

import numpy as np
import gguf

# Pre-tokenisation for training the merges: an approximation, with Python's
# re module, of the regular expression of llama.cpp's "qwen2" pre-tokenizer
# (letters = [^\W\d_], numbers = \d). It only decides which merges are
# learned; llama.cpp applies its own qwen2 pre-tokenizer when tokenising.
_NOT_LN = r"(?:[^\w\r\n]|_)"
PRETOKENIZE = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    r"|" + _NOT_LN + r"?[^\W\d_]+"
    r"|\d"
    r"| ?(?:[^\s\w]|_)+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


def byte_symbols():
    """Map each byte 0..255 to the printable character that stands for it
    in a byte-level BPE vocabulary (the GPT-2 convention llama.cpp's "gpt2"
    tokenizer model decodes): printable Latin-1 bytes stand for themselves,
    the others are shifted to code points 256 and up, in byte order."""
    keep = set(range(ord("!"), ord("~") + 1))
    keep |= set(range(ord("\u00a1"), ord("\u00ac") + 1))
    keep |= set(range(ord("\u00ae"), ord("\u00ff") + 1))
    out, shifted = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + shifted)
            shifted += 1
    return out


def learn_merges(text, specials, n_merges):
    """Byte-level BPE training: the most frequent adjacent pair is merged
    first; ties go to the lexicographically smallest pair, so the result
    depends only on the text."""
    sym = byte_symbols()
    # Special tokens are never learned: they split the text.
    pieces = [text]
    for s in specials:
        pieces = [q for p in pieces for q in p.split(s)]
    words = collections.Counter()
    for p in pieces:
        for w in PRETOKENIZE.findall(p):
            words[tuple(sym[b] for b in w.encode("utf-8"))] += 1
    words = {w: c for w, c in words.items() if len(w) > 1}
    merges = []
    while len(merges) < n_merges:
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        new = {}
        for w, c in words.items():
            if len(w) < 2:
                continue
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            out = tuple(out)
            if len(out) > 1:
                new[out] = new.get(out, 0) + c
        words = new
    return merges


def build_vocab(cfg, here):
    tok = cfg["tokenizer"]
    with open(os.path.join(here, tok["corpus"]), encoding="utf-8") as f:
        corpus = f.read()
    specials = [s["content"] for s in tok["special_tokens"]]
    merges = learn_merges(corpus, specials, tok["merges"])
    sym = byte_symbols()
    tokens = [sym[b] for b in range(256)]
    types = [gguf.TokenType.NORMAL] * 256
    seen = set(tokens)
    for a, b in merges:
        t = a + b
        if t not in seen:
            seen.add(t)
            tokens.append(t)
            types.append(gguf.TokenType.NORMAL)
    kinds = {"control": gguf.TokenType.CONTROL, "user_defined": gguf.TokenType.USER_DEFINED}
    for s in tok["special_tokens"]:
        if s["content"] in seen:
            sys.exit("special token %r is also a learned token" % s["content"])
        if s["type"] not in kinds:
            sys.exit("special token %r: unknown type %r" % (s["content"], s["type"]))
        seen.add(s["content"])
        tokens.append(s["content"])
        types.append(kinds[s["type"]])
    return tokens, types, ["%s %s" % m for m in merges]


def tensor_plan(cfg, n_vocab):
    """The tensors in the order they are drawn from the generator and
    written: (gguf name, Hugging Face name, numpy shape (out, in), std or
    None for a norm weight)."""
    a = cfg["architecture"]
    init = cfg["init"]
    d, hd = a["hidden_size"], a["head_dim"]
    nq, nkv, ff = a["num_attention_heads"], a["num_key_value_heads"], a["intermediate_size"]
    if init["linear_std"] != "1/sqrt(fan_in)":
        sys.exit("init.linear_std: only \"1/sqrt(fan_in)\" is implemented")

    def lin(fan_in):
        return 1.0 / np.sqrt(fan_in)

    plan = [("token_embd.weight", "model.embed_tokens.weight", (n_vocab, d), init["embedding_std"])]
    for i in range(a["num_hidden_layers"]):
        g, h = "blk.%d." % i, "model.layers.%d." % i
        plan += [
            (g + "attn_norm.weight", h + "input_layernorm.weight", (d,), None),
            (g + "attn_q.weight", h + "self_attn.q_proj.weight", (nq * hd, d), lin(d)),
            (g + "attn_k.weight", h + "self_attn.k_proj.weight", (nkv * hd, d), lin(d)),
            (g + "attn_v.weight", h + "self_attn.v_proj.weight", (nkv * hd, d), lin(d)),
            (g + "attn_q_norm.weight", h + "self_attn.q_norm.weight", (hd,), None),
            (g + "attn_k_norm.weight", h + "self_attn.k_norm.weight", (hd,), None),
            (g + "attn_output.weight", h + "self_attn.o_proj.weight", (d, nq * hd), lin(nq * hd)),
            (g + "ffn_norm.weight", h + "post_attention_layernorm.weight", (d,), None),
            (g + "ffn_gate.weight", h + "mlp.gate_proj.weight", (ff, d), lin(d)),
            (g + "ffn_up.weight", h + "mlp.up_proj.weight", (ff, d), lin(d)),
            (g + "ffn_down.weight", h + "mlp.down_proj.weight", (d, ff), lin(ff)),
        ]
    plan += [
        ("output_norm.weight", "model.norm.weight", (d,), None),
        ("output.weight", "lm_head.weight", (n_vocab, d), init["output_std"]),
    ]
    return plan


def make_weights(cfg, n_vocab):
    """Draws every non-norm tensor as float64 standard normals from
    numpy's PCG64 generator seeded with cfg["seed"], in plan order, scaled
    by its std and cast to float32; norm weights are constant."""
    rng = np.random.Generator(np.random.PCG64(cfg["seed"]))
    out = []
    for name, hf, shape, std in tensor_plan(cfg, n_vocab):
        if std is None:
            w = np.full(shape, cfg["init"]["norm_weights"], dtype=np.float32)
        else:
            w = (rng.standard_normal(shape, dtype=np.float64) * std).astype(np.float32)
        out.append((name, hf, w))
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(here, "tiny-qwen3.json"))
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--dump-npz", help="also write the tensors under their Hugging Face names")
    args = ap.parse_args()

    with open(args.config, encoding="utf-8") as f:
        cfg = json.load(f)
    here = os.path.dirname(os.path.abspath(args.config))
    a, tok = cfg["architecture"], cfg["tokenizer"]
    if a["gguf_arch"] != "qwen3":
        sys.exit("architecture.gguf_arch: only qwen3 is implemented")
    with open(os.path.join(here, cfg["chat_template"]), encoding="utf-8") as f:
        template = f.read()

    tokens, types, merges = build_vocab(cfg, here)
    ids = {t: i for i, t in enumerate(tokens)}
    weights = make_weights(cfg, len(tokens))

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, cfg["name"] + ".gguf")
    w = gguf.GGUFWriter(path, a["gguf_arch"])
    w.add_name(cfg["name"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(a["max_position_embeddings"])
    w.add_embedding_length(a["hidden_size"])
    w.add_block_count(a["num_hidden_layers"])
    w.add_feed_forward_length(a["intermediate_size"])
    w.add_head_count(a["num_attention_heads"])
    w.add_head_count_kv(a["num_key_value_heads"])
    w.add_key_length(a["head_dim"])
    w.add_value_length(a["head_dim"])
    w.add_rope_freq_base(a["rope_theta"])
    w.add_layer_norm_rms_eps(a["rms_norm_eps"])
    w.add_tokenizer_model(tok["gguf_model"])
    w.add_tokenizer_pre(tok["gguf_pre"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ids[tok["bos_token"]])
    w.add_eos_token_id(ids[tok["eos_token"]])
    w.add_pad_token_id(ids[tok["pad_token"]])
    w.add_add_bos_token(tok["add_bos_token"])
    w.add_chat_template(template)
    for name, _, t in weights:
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    side = dict(cfg)
    side["derived"] = {
        "gguf_file": os.path.basename(path),
        "gguf_sha256": h.hexdigest(),
        "vocab_size": len(tokens),
        "merges": len(merges),
        "special_token_ids": {s["content"]: ids[s["content"]] for s in tok["special_tokens"]},
        "bos_token_id": ids[tok["bos_token"]],
        "eos_token_id": ids[tok["eos_token"]],
        "pad_token_id": ids[tok["pad_token"]],
        "parameters": int(sum(t.size for _, _, t in weights)),
        "tensors": [{"gguf": n, "hf": hf, "shape": list(t.shape)} for n, hf, t in weights],
        "numpy_version": np.__version__,
    }
    side_path = os.path.join(args.out, cfg["name"] + ".json")
    with open(side_path, "w", encoding="utf-8") as f:
        json.dump(side, f, indent=2, sort_keys=False)
        f.write("\n")
    if args.dump_npz:
        np.savez(args.dump_npz, **{hf: t for _, hf, t in weights})
    print("%s: %d tokens (%d merges), %d parameters, sha256 %s" % (
        path, len(tokens), len(merges), side["derived"]["parameters"], h.hexdigest()))


if __name__ == "__main__":
    main()
