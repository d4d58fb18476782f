"""A Qwen3-architecture decoder in PyTorch that computes what llama.cpp's
"qwen3" graph computes, with its weights loaded from and written back to
the GGUF file llama-server serves.

The graph, per layer (all float32):
    h = x + o_proj(attn(rope(q_norm(q)), rope(k_norm(k)), v))  on rms_norm(x) * attn_norm
    x = h + down(silu(gate(u)) * up(u))                        with u = rms_norm(h) * ffn_norm
then rms_norm * output_norm and the output matrix (or the embedding when
the file has no output.weight: tied). q_norm and k_norm are RMSNorms over
each head's dimension; attention uses grouped KV heads (head_count_kv) and
a causal mask, scaled by 1/sqrt(head_dim). Rotary embeddings are NEOX-style
(llama.cpp's LLAMA_ROPE_TYPE_NEOX for qwen3): dimension i is rotated with
i + head_dim/2 by pos * base^(-2i/head_dim). llama.cpp stores the q/k
weights of qwen3 unpermuted (the HF layout), so no rows are reordered.

llama.cpp's default KV cache is float16, and its non-flash attention then
also rounds q and the attention weights to float16 for the matrix products;
kv_f16=True reproduces those roundings (about 1e-4 agreement instead of
1e-6 with an engine started with -ctk f32 -ctv f32). Flash attention
(-fa on, or auto on CPU) computes differently again: start the engine with
-fa off.

GGUF weights are (out, in) row-major, the layout of torch's Linear weight
(ggml's ne is the reverse of the numpy shape), so they are used as they are.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F

import gguf_io


class Config:
    """The architecture keys of a qwen3 GGUF."""

    KEYS = {
        "n_layer": "block_count",
        "n_embd": "embedding_length",
        "n_ff": "feed_forward_length",
        "n_head": "attention.head_count",
        "n_head_kv": "attention.head_count_kv",
        "head_dim": "attention.key_length",
        "head_dim_v": "attention.value_length",
        "rope_base": "rope.freq_base",
        "eps": "attention.layer_norm_rms_epsilon",
        "n_ctx_train": "context_length",
    }

    def __init__(self, g):
        arch = g.arch()
        if arch != "qwen3":
            raise gguf_io.GGUFError("architecture %r: this model implements qwen3" % arch)
        for attr, key in self.KEYS.items():
            v = g.get(arch + "." + key)
            if v is None and attr in ("head_dim", "head_dim_v"):
                v = g.get(arch + ".embedding_length") // g.get(arch + ".attention.head_count")
            if v is None:
                raise gguf_io.GGUFError("metadata %s.%s is missing" % (arch, key))
            setattr(self, attr, v)
        if self.head_dim != self.head_dim_v:
            raise gguf_io.GGUFError("key_length %d != value_length %d is not supported" % (self.head_dim, self.head_dim_v))
        if self.n_head % self.n_head_kv:
            raise gguf_io.GGUFError("head_count %d is not a multiple of head_count_kv %d" % (self.n_head, self.n_head_kv))
        if g.get(arch + ".rope.scaling.type") not in (None, "none"):
            raise gguf_io.GGUFError("rope scaling is not implemented")
        tokens = g.get("tokenizer.ggml.tokens")
        self.n_vocab = len(tokens) if tokens is not None else g.tensor("token_embd.weight").shape[0]
        self.tied = not any(t.name == "output.weight" for t in g.tensors)


def _f16(x):
    """Rounds to float16 and back; the gradient passes straight through."""
    return x + (x.detach().half().float() - x.detach())


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class TinyQwen3(torch.nn.Module):
    """The model; parameters are named after the GGUF tensors (dots → '__')."""

    def __init__(self, g, kv_f16=False):
        super().__init__()
        self.cfg = Config(g)
        self.kv_f16 = kv_f16
        self.source = g
        self.names = []
        for t in g.tensors:
            if t.ggml_type != gguf_io.GGML_F32:
                raise gguf_io.GGUFError("tensor %s has ggml type %d: only float32 models are trainable here" % (t.name, t.ggml_type))
            p = torch.nn.Parameter(torch.from_numpy(np.array(t.data, dtype=np.float32, copy=True)))
            self.register_parameter(t.name.replace(".", "__"), p)
            self.names.append(t.name)
        self._check_shapes()
        c = self.cfg
        inv = 1.0 / (c.rope_base ** (torch.arange(0, c.head_dim // 2, dtype=torch.float64) * 2.0 / c.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def w(self, name):
        return getattr(self, name.replace(".", "__"))

    def _check_shapes(self):
        c = self.cfg
        want = {"token_embd.weight": (c.n_vocab, c.n_embd), "output_norm.weight": (c.n_embd,)}
        if not c.tied:
            want["output.weight"] = (c.n_vocab, c.n_embd)
        for i in range(c.n_layer):
            b = "blk.%d." % i
            want.update({
                b + "attn_norm.weight": (c.n_embd,),
                b + "attn_q.weight": (c.n_head * c.head_dim, c.n_embd),
                b + "attn_k.weight": (c.n_head_kv * c.head_dim, c.n_embd),
                b + "attn_v.weight": (c.n_head_kv * c.head_dim, c.n_embd),
                b + "attn_q_norm.weight": (c.head_dim,),
                b + "attn_k_norm.weight": (c.head_dim,),
                b + "attn_output.weight": (c.n_embd, c.n_head * c.head_dim),
                b + "ffn_norm.weight": (c.n_embd,),
                b + "ffn_gate.weight": (c.n_ff, c.n_embd),
                b + "ffn_up.weight": (c.n_ff, c.n_embd),
                b + "ffn_down.weight": (c.n_embd, c.n_ff),
            })
        have = set(self.names)
        missing = sorted(set(want) - have)
        extra = sorted(have - set(want))
        if missing or extra:
            raise gguf_io.GGUFError("tensors missing %s, unexpected %s" % (missing, extra))
        for name, shape in want.items():
            if tuple(self.w(name).shape) != shape:
                raise gguf_io.GGUFError("tensor %s has shape %s, want %s" % (name, tuple(self.w(name).shape), shape))

    def rope(self, x, pos):
        # x: (seq, heads, head_dim); NEOX: rotate (i, i + d/2).
        ang = (pos.to(torch.float64)[:, None] * self.inv_freq[None, :])
        cos = torch.cos(ang).to(x.dtype)[:, None, :]
        sin = torch.sin(ang).to(x.dtype)[:, None, :]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def forward(self, tokens):
        """Logits (seq, n_vocab) for one sequence of token ids."""
        c = self.cfg
        ids = torch.as_tensor(tokens, dtype=torch.long)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= c.n_vocab):
            raise ValueError("token id out of range [0, %d)" % c.n_vocab)
        n = ids.shape[0]
        pos = torch.arange(n)
        x = F.embedding(ids, self.w("token_embd.weight"))
        mask = torch.full((n, n), float("-inf")).triu(1)
        rep = c.n_head // c.n_head_kv
        for i in range(c.n_layer):
            b = "blk.%d." % i
            h = rms_norm(x, self.w(b + "attn_norm.weight"), c.eps)
            q = F.linear(h, self.w(b + "attn_q.weight")).view(n, c.n_head, c.head_dim)
            k = F.linear(h, self.w(b + "attn_k.weight")).view(n, c.n_head_kv, c.head_dim)
            v = F.linear(h, self.w(b + "attn_v.weight")).view(n, c.n_head_kv, c.head_dim)
            q = self.rope(rms_norm(q, self.w(b + "attn_q_norm.weight"), c.eps), pos)
            k = self.rope(rms_norm(k, self.w(b + "attn_k_norm.weight"), c.eps), pos)
            if self.kv_f16:
                q, k, v = _f16(q), _f16(k), _f16(v)
            # Query head j reads KV head j // rep (llama.cpp's grouping).
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            att = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(c.head_dim) + mask
            p = torch.softmax(att, dim=-1)
            if self.kv_f16:
                p = _f16(p)
            out = torch.einsum("hqk,khd->qhd", p, v).reshape(n, c.n_head * c.head_dim)
            x = x + F.linear(out, self.w(b + "attn_output.weight"))
            h = rms_norm(x, self.w(b + "ffn_norm.weight"), c.eps)
            x = x + F.linear(F.silu(F.linear(h, self.w(b + "ffn_gate.weight"))) * F.linear(h, self.w(b + "ffn_up.weight")),
                             self.w(b + "ffn_down.weight"))
        x = rms_norm(x, self.w("output_norm.weight"), c.eps)
        out = self.w("token_embd.weight") if c.tied else self.w("output.weight")
        return F.linear(x, out)

    def token_logprobs(self, tokens, temperature=1.0):
        """logprob of tokens[t] given tokens[:t] for t = 1..n-1 (index 0
        has no prediction and gets 0), at the sampling temperature."""
        logits = self.forward(tokens)[:-1] / temperature
        lp = torch.log_softmax(logits, dim=-1)
        tgt = torch.as_tensor(tokens[1:], dtype=torch.long)
        picked = lp.gather(1, tgt[:, None])[:, 0]
        return torch.cat([torch.zeros(1, dtype=picked.dtype), picked])

    def to_gguf(self):
        """A GGUFFile with the source's metadata (unchanged, in order) and
        the current weights."""
        tensors = []
        for t in self.source.tensors:
            data = self.w(t.name).detach().cpu().numpy().astype(np.float32, copy=True)
            tensors.append(gguf_io.Tensor(t.name, t.shape, t.ggml_type, data))
        return gguf_io.GGUFFile(list(self.source.metadata), tensors)


def load(path, kv_f16=False):
    return TinyQwen3(gguf_io.read(path), kv_f16=kv_f16)


def save(model, path):
    """Writes the model's GGUF to path atomically (temp file + rename)."""
    import os

    tmp = path + ".tmp"
    gguf_io.write(tmp, model.to_gguf())
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
