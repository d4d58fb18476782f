"""Unit tests of the decoding and the arrays (no server)."""

import unittest

import grpc

import rollout
from rollout import errors
from rollout.batch import to_batch
from rollout.types import Group, Rollout, token_columns
from rollout.v1 import rollout_pb2 as pb


def compact(tokens, runs, trained_logprobs=(), prompt_tokens=0, **kw):
    return pb.Rollout(tokens=tokens, loss_mask_runs=runs, trained_logprobs=trained_logprobs,
                      prompt_tokens=prompt_tokens, **kw)


class TokenColumns(unittest.TestCase):
    def test_compact_equals_full(self):
        tokens = [5, 6, 7, 8, 9, 10]
        mask = [0, 0, 1, 1, 0, 1]
        lps = [-0.5, -0.25, -1.0]
        full = pb.Rollout(tokens=tokens, loss_mask=mask, logprobs=[1.0, 1.0, -0.5, -0.25, 1.0, -1.0])
        comp = compact(tokens, [2, 2, 1, 1], lps)
        self.assertEqual(token_columns(full), token_columns(comp))
        self.assertEqual(token_columns(comp), (mask, [1.0, 1.0, -0.5, -0.25, 1.0, -1.0]))

    def test_first_token_trained(self):
        self.assertEqual(token_columns(compact([1, 2], [0, 2]))[0], [1, 1])

    def test_no_logprobs(self):
        self.assertIsNone(token_columns(pb.Rollout(tokens=[1, 2], loss_mask=[0, 1]))[1])

    def test_inconsistent(self):
        for name, r in [
            ("runs short", compact([1, 2, 3], [1, 1])),
            ("both masks", pb.Rollout(tokens=[1], loss_mask=[1], loss_mask_runs=[0, 1])),
            ("trained count", compact([1, 2, 3], [1, 2], [-1.0])),
            ("both logprobs", pb.Rollout(tokens=[1], loss_mask=[1], logprobs=[-1.0], trained_logprobs=[-1.0])),
            ("mask length", pb.Rollout(tokens=[1, 2], loss_mask=[1])),
            ("negative run", compact([1, 2], [3, -1])),
        ]:
            with self.subTest(name):
                with self.assertRaises(rollout.LayoutError):
                    token_columns(r)

    def test_prompt_tokens_beyond_tokens(self):
        with self.assertRaises(rollout.LayoutError):
            Rollout.from_proto(compact([1, 2], [1, 1], [-0.1], prompt_tokens=3))


class Arrays(unittest.TestCase):
    def group(self):
        r0 = compact([1, 2, 3, 4], [2, 2], [-0.1, -0.2], prompt_tokens=2, status="ok", reward=1.0, advantage=0.5,
                     token_versions=[0, 0, 3, 3])
        r1 = compact([1, 2, 3, 4, 5, 6], [2, 1, 2, 1], [-0.5, -0.25], prompt_tokens=2, status="ok", reward=0.0,
                     advantage=-0.5, index=1)
        r2 = pb.Rollout(index=2, status="infra_failed", failure_kind="sandbox")
        return Group.from_proto(pb.Group(group_id="g", rollouts=[r0, r1, r2]))

    def test_failed_rollout_trains_nothing(self):
        r = Rollout.from_proto(compact([1, 2, 3], [1, 2], [-0.1, -0.2], prompt_tokens=1, status="infra_failed"))
        self.assertEqual(r.response_mask, [1, 1])
        self.assertEqual(r.trainable_response_mask, [0, 0])
        b = to_batch([Group.from_proto(pb.Group(rollouts=[r.raw]))], include_failed=True)
        self.assertEqual(b.loss_mask, [[0, 0]])

    def test_response_split(self):
        g = self.group()
        r = g.rollouts[1]
        self.assertEqual(r.prompt_ids, [1, 2])
        self.assertEqual(r.response_ids, [3, 4, 5, 6])
        self.assertEqual(r.response_mask, [1, 0, 0, 1])
        self.assertEqual(r.response_logprobs, [-0.5, 0.0, 0.0, -0.25])

    def test_batch_padding(self):
        b = to_batch([self.group()])
        self.assertEqual(len(b), 2)  # the failed rollout is left out
        with_failed = to_batch([self.group()], include_failed=True)
        self.assertEqual(len(with_failed), 3)
        self.assertEqual(with_failed.ok, [True, True, False])
        p = b.padded(pad_token_id=99)
        as_list = (lambda a: a.tolist()) if rollout.have_numpy() else (lambda a: a)
        self.assertEqual(as_list(p["response_ids"]), [[3, 4, 99, 99], [3, 4, 5, 6]])
        self.assertEqual(as_list(p["response_attention_mask"]), [[1, 1, 0, 0], [1, 1, 1, 1]])
        self.assertEqual(as_list(p["loss_mask"]), [[1, 1, 0, 0], [1, 0, 0, 1]])
        self.assertEqual(as_list(p["versions"])[0], [3, 3, -1, -1])
        self.assertEqual(as_list(p["advantages"]), [0.5, -0.5])
        with self.assertRaises(ValueError):
            b.padded(prompt_side="middle")

    def test_lists_without_numpy(self):
        import rollout.batch as batch_module

        saved, batch_module._np = batch_module._np, None
        try:
            p = to_batch([self.group()]).padded(pad_token_id=99)
        finally:
            batch_module._np = saved
        self.assertIsInstance(p["response_ids"], list)
        self.assertEqual(p["response_ids"], [[3, 4, 99, 99], [3, 4, 5, 6]])
        self.assertEqual(p["rewards"], [1.0, 0.0])

    def test_left_padded_prompts(self):
        g = Group.from_proto(pb.Group(rollouts=[
            compact([7, 1, 2], [3], prompt_tokens=3, status="ok"), compact([1, 2], [1, 1], prompt_tokens=1, status="ok")]))
        p = to_batch([g]).padded(pad_token_id=0)
        as_list = (lambda a: a.tolist()) if rollout.have_numpy() else (lambda a: a)
        self.assertEqual(as_list(p["prompt_ids"]), [[7, 1, 2], [0, 0, 1]])
        self.assertEqual(as_list(p["prompt_attention_mask"]), [[1, 1, 1], [0, 0, 1]])


class FakeRpcError(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "next.count: must be positive"


class Errors(unittest.TestCase):
    def test_codes(self):
        for code, cls in [(grpc.StatusCode.INVALID_ARGUMENT, rollout.InvalidArgument),
                          (grpc.StatusCode.NOT_FOUND, rollout.NotFound),
                          (grpc.StatusCode.FAILED_PRECONDITION, rollout.FailedPrecondition),
                          (grpc.StatusCode.UNAVAILABLE, rollout.Unavailable),
                          (grpc.StatusCode.DATA_LOSS, rollout.Internal)]:
            e = errors.from_rpc_error(FakeRpcError(code), "CollectGroups")
            self.assertIsInstance(e, cls)
            self.assertIsInstance(e, rollout.RolloutError)
            self.assertEqual(e.code, code)
            self.assertIn("next.count", str(e))


if __name__ == "__main__":
    unittest.main()


class RoutedExperts(unittest.TestCase):
    """Routing replay: the flat wire column as [tokens][layers][topk],
    zero-padded; the adapters' mapping."""

    def rollout(self, n_tokens=4, positions=3, layers=2, topk=2, flat=None):
        if flat is None:
            flat = list(range(1, positions * layers * topk + 1))
        return Rollout.from_proto(pb.Rollout(tokens=list(range(n_tokens)), loss_mask=[0] * n_tokens, prompt_tokens=2,
                                             routed_experts=flat, routed_experts_shape=[positions, layers, topk]))

    def test_decode_and_pad(self):
        re = self.rollout().routed_experts()
        self.assertEqual(len(re), 4)
        self.assertEqual(re[0], [[1, 2], [3, 4]])
        self.assertEqual(re[2], [[9, 10], [11, 12]])
        self.assertEqual(re[3], [[0, 0], [0, 0]])  # the last sampled token has none

    def test_none_and_bad(self):
        self.assertIsNone(Rollout.from_proto(pb.Rollout(tokens=[1], loss_mask=[1])).routed_experts())
        for r in (self.rollout(flat=[1, 2, 3]), self.rollout(n_tokens=2), ):
            with self.assertRaises(errors.LayoutError):
                r.routed_experts()

    def test_adapters(self):
        from rollout.adapters._common import AdapterError, group_routing
        from rollout.adapters.verl import RolloutAgentLoopManager

        a, b = self.rollout(), self.rollout()
        self.assertEqual(len(group_routing([a, b], "t")), 2)
        plain = Rollout.from_proto(pb.Rollout(tokens=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1], prompt_tokens=2))
        self.assertIsNone(group_routing([plain], "t"))
        with self.assertRaises(AdapterError):
            group_routing([a, plain], "t")
        # verl's padded batch: routing aligned with input_ids.
        m = RolloutAgentLoopManager(rollout.Client("127.0.0.1:1"), "env: x\n", prompt_length=3, response_length=3)
        out = {"prompt_ids": a.prompt_ids, "response_ids": a.response_ids, "response_mask": [1, 1],
               "response_logprobs": None, "routed_experts": a.routed_experts(), "reward_score": 1.0,
               "num_turns": 2, "metrics": {}, "extra_fields": {}}
        tensors, _, _ = m.postprocess([out])
        re = [[list(map(int, l)) for l in p] for p in tensors["routed_experts"][0]]
        zero = [[0, 0], [0, 0]]
        self.assertEqual(re, [zero, [[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10], [11, 12]], zero, zero])
        m.close()
