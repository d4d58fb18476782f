#!/usr/bin/python3
"""Engine vs trainer logprobs, straight from llama-server (no rollout).

Samples --samples completions from llama-server's /completion (token ids
in, neutral sampler at temperature 1, n_probs 1, return_tokens) and
recomputes the logprob of every sampled token with the PyTorch model of the
same GGUF. This isolates the model half of the agreement that grpo_cpu.py
checks on rollout's records: when this passes and the loop's check fails,
the records are misaligned.

llama-server leaves out the probability entry of a sampled token whose text
is an incomplete UTF-8 sequence (a lone byte token of a multi-byte
character): the entry of the token that completes the character carries
the joined text. Such tokens are counted as "without logprob" and not
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


def align(ids, probs):
    """Pairs each probability entry with its token: entries come in token
    order, and a token without one is skipped. Returns (index, logprob)."""
    out, j = [], 0
    for i, t in enumerate(ids):
        if j < len(probs) and probs[j]["id"] == t:
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
    prompt = post(args.endpoint + "/tokenize", {"content": args.prompt, "add_special": False})["tokens"]
    deltas, without, total = [], 0, 0
    for seed in range(args.samples):
        res = post(args.endpoint + "/completion", {
            "prompt": prompt, "n_predict": args.max_tokens, "n_probs": 1, "temperature": 1.0, "top_k": 0,
            "top_p": 1.0, "min_p": 0.0, "seed": seed, "return_tokens": True, "cache_prompt": True})
        ids = res["tokens"]
        pairs = align(ids, res["completion_probabilities"])
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
