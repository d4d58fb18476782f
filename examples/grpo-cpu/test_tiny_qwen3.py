"""Unit tests of gguf_io and tiny_qwen3 (no engine needed).

    /usr/bin/python3 -m unittest -v test_tiny_qwen3

ROLLOUT_TINY_GGUF=path also round-trips that file (the engine's model).
"""

import os
import struct
import tempfile
import unittest

import numpy as np
import torch

import gguf_io
import tiny_qwen3


def synthetic(seed=7, n_vocab=50, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, head_dim=8, n_ff=48, tied=False):
    """A small random qwen3 GGUF (float32) built with gguf_io alone."""
    rng = np.random.Generator(np.random.PCG64(seed))
    md = [
        ("general.architecture", gguf_io.STRING, "qwen3", None),
        ("general.name", gguf_io.STRING, "synthetic", None),
        ("qwen3.context_length", gguf_io.UINT32, 4096, None),
        ("qwen3.embedding_length", gguf_io.UINT32, n_embd, None),
        ("qwen3.block_count", gguf_io.UINT32, n_layer, None),
        ("qwen3.feed_forward_length", gguf_io.UINT32, n_ff, None),
        ("qwen3.attention.head_count", gguf_io.UINT32, n_head, None),
        ("qwen3.attention.head_count_kv", gguf_io.UINT32, n_head_kv, None),
        ("qwen3.attention.key_length", gguf_io.UINT32, head_dim, None),
        ("qwen3.attention.value_length", gguf_io.UINT32, head_dim, None),
        ("qwen3.rope.freq_base", gguf_io.FLOAT32, 1e6, None),
        ("qwen3.attention.layer_norm_rms_epsilon", gguf_io.FLOAT32, 1e-6, None),
        ("tokenizer.ggml.tokens", gguf_io.ARRAY, ["t%d" % i for i in range(n_vocab)], gguf_io.STRING),
        ("tokenizer.ggml.token_type", gguf_io.ARRAY, [1] * n_vocab, gguf_io.INT32),
        ("tokenizer.ggml.add_bos_token", gguf_io.BOOL, False, None),
    ]
    shapes = [("token_embd.weight", (n_vocab, n_embd))]
    for i in range(n_layer):
        b = "blk.%d." % i
        shapes += [
            (b + "attn_norm.weight", (n_embd,)), (b + "attn_q.weight", (n_head * head_dim, n_embd)),
            (b + "attn_k.weight", (n_head_kv * head_dim, n_embd)), (b + "attn_v.weight", (n_head_kv * head_dim, n_embd)),
            (b + "attn_q_norm.weight", (head_dim,)), (b + "attn_k_norm.weight", (head_dim,)),
            (b + "attn_output.weight", (n_embd, n_head * head_dim)), (b + "ffn_norm.weight", (n_embd,)),
            (b + "ffn_gate.weight", (n_ff, n_embd)), (b + "ffn_up.weight", (n_ff, n_embd)), (b + "ffn_down.weight", (n_embd, n_ff)),
        ]
    shapes.append(("output_norm.weight", (n_embd,)))
    if not tied:
        shapes.append(("output.weight", (n_vocab, n_embd)))
    tensors = []
    for name, shape in shapes:
        if len(shape) == 1:
            data = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            data = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        tensors.append(gguf_io.Tensor(name, shape, gguf_io.GGML_F32, data))
    return gguf_io.GGUFFile(md, tensors)


class GGUFRoundTrip(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def roundtrip_bytes(self, src):
        m = tiny_qwen3.load(src)
        dst = self.path("rt.gguf")
        tiny_qwen3.save(m, dst)
        with open(src, "rb") as a, open(dst, "rb") as b:
            self.assertEqual(a.read(), b.read(), "GGUF -> torch -> GGUF is not byte-identical")

    def test_synthetic_roundtrip_is_byte_identical(self):
        for tied in (False, True):
            src = self.path("syn-%s.gguf" % tied)
            gguf_io.write(src, synthetic(tied=tied))
            self.roundtrip_bytes(src)

    @unittest.skipUnless(os.environ.get("ROLLOUT_TINY_GGUF"), "ROLLOUT_TINY_GGUF not set")
    def test_engine_model_roundtrip_is_byte_identical(self):
        self.roundtrip_bytes(os.environ["ROLLOUT_TINY_GGUF"])

    def test_trained_weights_are_written_exactly(self):
        src = self.path("syn.gguf")
        gguf_io.write(src, synthetic())
        m = tiny_qwen3.load(src)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m.token_logprobs([1, 2, 3, 4, 5]).sum().backward()
        opt.step()
        dst = self.path("trained.gguf")
        tiny_qwen3.save(m, dst)
        back = gguf_io.read(dst)
        self.assertEqual([(k, t, v) for k, t, v, _ in back.metadata], [(k, t, v) for k, t, v, _ in m.source.metadata])
        changed = 0
        for t in back.tensors:
            want = m.w(t.name).detach().numpy()
            self.assertEqual(t.data.tobytes(), want.tobytes(), t.name)  # bit-identical float32
            changed += int(not np.array_equal(t.data, m.source.tensor(t.name).data))
        self.assertGreater(changed, 0, "the SGD step changed nothing")

    def test_causal(self):
        src = self.path("syn.gguf")
        gguf_io.write(src, synthetic())
        m = tiny_qwen3.load(src)
        with torch.no_grad():
            a = m.token_logprobs([3, 1, 4, 1, 5])
            b = m.token_logprobs([3, 1, 4, 1, 5, 9, 2, 6])
        self.assertTrue(torch.allclose(a, b[:5], atol=1e-6))
        self.assertTrue(bool((b[1:] < 0).all()))

    def test_rope_is_neox(self):
        # Rotating (i, i + d/2) by the position angle: a vector with only
        # component 0 set moves into components 0 and d/2.
        src = self.path("syn.gguf")
        gguf_io.write(src, synthetic())
        m = tiny_qwen3.load(src)
        d = m.cfg.head_dim
        x = torch.zeros(2, 1, d)
        x[:, 0, 0] = 1
        y = m.rope(x, torch.tensor([0, 1]))
        self.assertTrue(torch.allclose(y[0, 0], x[0, 0]))
        nz = torch.nonzero(y[1, 0].abs() > 1e-7).flatten().tolist()
        self.assertEqual(nz, [0, d // 2])
        self.assertAlmostEqual(float(y[1, 0, 0]), float(np.cos(1.0)), places=6)
        self.assertAlmostEqual(float(y[1, 0, d // 2]), float(np.sin(1.0)), places=6)


class GGUFErrors(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def test_bad_magic(self):
        p = os.path.join(self.dir.name, "x.gguf")
        with open(p, "wb") as f:
            f.write(b"GGML" + b"\0" * 20)
        with self.assertRaisesRegex(gguf_io.GGUFError, "bad magic"):
            gguf_io.read(p)

    def test_truncated(self):
        p = os.path.join(self.dir.name, "x.gguf")
        gguf_io.write(p, synthetic())
        with open(p, "rb") as f:
            b = f.read()
        with open(p, "wb") as f:
            f.write(b[:200])
        with self.assertRaisesRegex(gguf_io.GGUFError, "truncated"):
            gguf_io.read(p)

    def test_other_version(self):
        p = os.path.join(self.dir.name, "x.gguf")
        with open(p, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 2, 0, 0))
        with self.assertRaisesRegex(gguf_io.GGUFError, "version 2"):
            gguf_io.read(p)

    def test_wrong_arch(self):
        g = synthetic()
        g.metadata[0] = ("general.architecture", gguf_io.STRING, "llama", None)
        with self.assertRaisesRegex(gguf_io.GGUFError, "implements qwen3"):
            tiny_qwen3.TinyQwen3(g)

    def test_missing_tensor(self):
        g = synthetic()
        g.tensors = [t for t in g.tensors if t.name != "blk.1.ffn_up.weight"]
        with self.assertRaisesRegex(gguf_io.GGUFError, "blk.1.ffn_up.weight"):
            tiny_qwen3.TinyQwen3(g)

    def test_token_out_of_range(self):
        m = tiny_qwen3.TinyQwen3(synthetic())
        with self.assertRaisesRegex(ValueError, "out of range"):
            m.token_logprobs([1, 999])


if __name__ == "__main__":
    unittest.main()


class ProbabilityAlignment(unittest.TestCase):
    """engine_agreement.align against llama-server's withheld entries."""

    # Token bytes: 0 'a', 1 '\xe2' (3-byte lead), 2 '\x1f', 3 '\xc3' (2-byte lead), 4 '\xa9'.
    TB = [b"a", b"\xe2", b"\x1f", b"\xc3", b"\xa9"]

    def entries(self, *pairs):
        return [{"id": i, "logprob": lp} for i, lp in pairs]

    def test_all_complete(self):
        import engine_agreement as ea
        got = ea.align([0, 2, 0], self.entries((0, -1.0), (2, -2.0), (0, -3.0)), self.TB)
        self.assertEqual(got, [(0, -1.0), (1, -2.0), (2, -3.0)])

    def test_lead_byte_held_until_enough_bytes(self):
        # Seen on llama-server: after \xe2 the next \x1f is still "incomplete"
        # (3 bytes needed, continuation bytes not checked); the entry of the
        # second \x1f carries all three. Pairing by id alone would give it
        # to position 2.
        import engine_agreement as ea
        got = ea.align([0, 1, 2, 2, 0], self.entries((0, -1.0), (2, -2.0), (0, -3.0)), self.TB)
        self.assertEqual(got, [(0, -1.0), (3, -2.0), (4, -3.0)])

    def test_trailing_incomplete_has_no_entry(self):
        import engine_agreement as ea
        self.assertEqual(ea.align([0, 3], self.entries((0, -1.0)), self.TB), [(0, -1.0)])
        self.assertEqual(ea.align([3, 4], self.entries((4, -1.0)), self.TB), [(1, -1.0)])

    def test_misplaced_entry_is_an_error(self):
        import engine_agreement as ea
        with self.assertRaisesRegex(ValueError, "expected its probability entry"):
            ea.align([0, 2], self.entries((2, -1.0), (0, -2.0)), self.TB)
        with self.assertRaisesRegex(ValueError, "match no sampled token"):
            ea.align([0], self.entries((0, -1.0), (0, -2.0)), self.TB)

    def test_token_bytes_of_byte_level_vocab(self):
        import engine_agreement as ea
        g = synthetic()
        g.metadata = [m for m in g.metadata if m[0] not in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")] + [
            ("tokenizer.ggml.model", gguf_io.STRING, "gpt2", None),
            ("tokenizer.ggml.tokens", gguf_io.ARRAY, ["a", "\u0120b", "\u00c3", "<|im_end|>"], gguf_io.STRING),
            ("tokenizer.ggml.token_type", gguf_io.ARRAY, [1, 1, 1, 3], gguf_io.INT32),
        ]
        self.assertEqual(ea.token_bytes(g), [b"a", b" b", b"\xc3", b"<|im_end|>"])
