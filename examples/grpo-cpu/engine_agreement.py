#!/usr/bin/python3
"""Engine vs trainer logprobs, straight from llama-server (no rollout).

Samples --samples completions from llama-server's /completion (token ids
in, neutral sampler at temperature 1, n_probs 1, return_tokens) and
recomputes the logprob of every sampled token with the PyTorch model of the
same GGUF. This isolates the model half of the agreement that grpo_cpu.py
checks on rollout's records: when this passes and the loop's check fails,
the records are misaligned.

llama-server leaves out the probability entry of a sampled token after
which the generated text ends inside a UTF-8 sequence (e.g. a lone lead
byte of a multi-byte character): the entry of the token that completes the
sequence carries the joined text. align() reproduces that rule from the
tokens' bytes; such tokens are counted as "without logprob" and not
compared.

Exit status 2 when p99 |engine - trainer| exceeds --tol.
"""

import argparse
import json
import os
import sys
import urllib.request

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_qwen3  # noqa: E402


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)


def byte_decoder():
    """The inverse of the byte-level BPE alphabet (GPT-2's convention, which
    llama.cpp's "gpt2" tokenizer model uses): printable Latin-1 bytes stand
    for themselves, the others for code points 256 and up in byte order."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, shifted = {}, 0
    for b in range(256):
        if b in keep:
            out[chr(b)] = b
        else:
            out[chr(256 + shifted)] = b
            shifted += 1
    return out


def token_bytes(g):
    """The bytes each token id stands for, from a GGUF's vocabulary
    (normal tokens are byte-level BPE text; control and user-defined tokens
    their own UTF-8 text)."""
    if g.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError("tokenizer model %r: only byte-level BPE (gpt2) is handled" % g.get("tokenizer.ggml.model"))
    dec = byte_decoder()
    out = []
    for tok, typ in zip(g.get("tokenizer.ggml.tokens"), g.get("tokenizer.ggml.token_type")):
        if typ == 1:
            out.append(bytes(dec[c] for c in tok))
        else:
            out.append(tok.encode("utf-8"))
    return out


def incomplete_utf8(text):
    """llama-server's test for a generated text that ends inside a UTF-8
    sequence: a lead byte among the last three bytes with fewer bytes after
    it than its sequence needs (the bytes after it are not checked)."""
    for i in range(1, min(4, len(text)) + 1):
        c = text[-i]
        if (c & 0xE0) == 0xC0 and i < 2 or (c & 0xF0) == 0xE0 and i < 3 or (c & 0xF8) == 0xF0 and i < 4:
            return True
    return False


def align(ids, probs, tb):
    """Pairs llama-server's probability entries with the sampled tokens.
    The server holds back a token while the generated text ends inside a
    UTF-8 sequence and gives no entry for it; the entry of the token that
    completes the sequence carries the joined text. Returns (index,
    logprob) pairs; an entry that does not fall where this rule puts it is
    an error."""
    out, j, text = [], 0, b""
    for i, t in enumerate(ids):
        text += tb[t]
        if incomplete_utf8(text):
            continue
        if j >= len(probs) or probs[j]["id"] != t:
            raise ValueError("token %d (id %d): expected its probability entry, found %s"
                             % (i, t, "none" if j >= len(probs) else "one for id %d" % probs[j]["id"]))
        out.append((i, probs[j]["logprob"]))
        j += 1
    if j != len(probs):
        raise ValueError("%d of %d probability entries match no sampled token" % (len(probs) - j, len(probs)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--policy", required=True, help="the GGUF the engine serves")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt", default="<|im_start|>user\nWrite digits.<|im_end|>\n<|im_start|>assistant\n")
    ap.add_argument("--kv-f16", action="store_true", help="emulate an engine with llama.cpp's default float16 KV cache")
    ap.add_argument("--tol", type=float, default=1e-3)
    args = ap.parse_args()

    model = tiny_qwen3.load(args.policy, kv_f16=args.kv_f16)
    tb = token_bytes(model.source)
    prompt = post(args.endpoint + "/tokenize", {"content": args.prompt, "add_special": False})["tokens"]
    deltas, without, total = [], 0, 0
    for seed in range(args.samples):
        res = post(args.endpoint + "/completion", {
            "prompt": prompt, "n_predict": args.max_tokens, "n_probs": 1, "temperature": 1.0, "top_k": 0,
            "top_p": 1.0, "min_p": 0.0, "seed": seed, "return_tokens": True, "cache_prompt": True})
        ids = res["tokens"]
        pairs = align(ids, res["completion_probabilities"], tb)
        with torch.no_grad():
            mine = model.token_logprobs(prompt + ids)[len(prompt):].numpy()
        deltas += [abs(float(mine[i]) - lp) for i, lp in pairs]
        total += len(ids)
        without += len(ids) - len(pairs)
    d = np.asarray(deltas)
    p99 = float(np.quantile(d, 0.99))
    print("ENGINE_AGREEMENT tokens=%d without_logprob=%d/%d p50=%.2e p99=%.2e max=%.2e frac_gt_1e-3=%.4f"
          % (d.size, without, total, np.quantile(d, 0.5), p99, d.max(), float((d > 1e-3).mean())), flush=True)
    if p99 > args.tol:
        print("FAILED: p99 %.3g > %.3g" % (p99, args.tol), flush=True)
        return 2
    print("OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
