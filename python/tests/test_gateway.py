"""GatewayClient against a real `rollout gateway` on the real llama.cpp
engine (ROLLOUT_GATEWAY_ADDR, set by python/python_test.go): a group of two
sessions, each driven by a minimal OpenAI-Chat harness over HTTP, closed,
scored and received with its advantages; the session API's errors; a
watcher following the run directory from a sequence."""

import json
import os
import unittest
import urllib.request

import rollout


def gateway_addr():
    addr = os.environ.get("ROLLOUT_GATEWAY_ADDR")
    if not addr:
        msg = "ROLLOUT_GATEWAY_ADDR is not set (python/python_test.go sets it)"
        if os.environ.get("CI") == "true":
            raise AssertionError("CI=true: " + msg)
        raise unittest.SkipTest(msg)
    return addr


def chat(session, content):
    """One Chat Completions call through the session, as any harness makes
    it (standard library only)."""
    models = json.load(urllib.request.urlopen(session.openai_base_url + "/models", timeout=60))
    body = {"model": models["data"][0]["id"], "messages": [{"role": "user", "content": content}]}
    req = urllib.request.Request(session.openai_base_url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + session.api_key})
    return json.load(urllib.request.urlopen(req, timeout=120))


class GatewayLive(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.gw = rollout.GatewayClient(gateway_addr(), timeout=60)
        cls.gw.wait_ready(60)

    @classmethod
    def tearDownClass(cls):
        cls.gw.close()

    def test_group_of_sessions(self):
        a = self.gw.open_session(item_id="py-item", group_size=2, metadata={"category": "py"})
        b = self.gw.open_session(group_id=a.group_id)
        self.assertEqual((a.index, b.index), (0, 1))
        self.assertTrue(a.openai_base_url.endswith("/v1") and a.id in a.openai_base_url)
        for s in (a, b):
            reply = chat(s, "say hi")
            self.assertEqual(reply["object"], "chat.completion")
            summary = self.gw.close_session(s.id)
            self.assertEqual((summary.status, summary.calls, summary.answered_calls), ("closed", 1, 1))
            self.assertGreater(summary.completion_tokens, 0)
        self.assertEqual(self.gw.score_session(a.id, 0.0), 1)
        self.assertEqual(self.gw.score_session(b.id, 1.0, metrics={"tests_passed": 3}), 0)
        with self.assertRaises(rollout.FailedPrecondition):
            self.gw.score_session(a.id, 1.0)
        group = next(self.gw.watch_groups(timeout=60))
        self.assertEqual((group.group_id, group.item_id, group.env), (a.group_id, "py-item", "gateway"))
        self.assertEqual(group.rewards, [0.0, 1.0])
        # GRPO over the two: (r - mean) / (std + eps).
        for r, want in zip(group.rollouts, (-1.0, 1.0)):
            self.assertAlmostEqual(r.advantage, want, places=4)
        for r in group.rollouts:
            self.assertEqual((r.status, r.stop_reason), ("ok", "session_closed"))
            self.assertEqual(len(r.loss_mask), len(r.tokens))
            self.assertGreater(sum(r.response_mask), 0)
            self.assertEqual(len(r.response_logprobs), len(r.response_ids))
        self.assertEqual(group.rollouts[1].reward_components, {"tests_passed": 3.0})

    def test_errors(self):
        with self.assertRaises(rollout.NotFound):
            self.gw.close_session("s-no-such-session")
        with self.assertRaises(ValueError):
            self.gw.score_session("s-any", float("nan"))
        with self.assertRaises(ValueError):
            self.gw.open_session(group_size=-1)
        s = self.gw.open_session(group_size=1)
        with self.assertRaises(rollout.FailedPrecondition):
            self.gw.score_session(s.id, 1.0)  # before close
        self.gw.close_session(s.id)
        with self.assertRaises(rollout.FailedPrecondition):
            self.gw.close_session(s.id)
        self.gw.score_session(s.id, 0.5)
        group = next(self.gw.watch_groups(timeout=60))
        self.assertEqual(group.rewards, [0.5])

    def test_replay_from_sequence(self):
        s = self.gw.open_session(group_size=1)
        chat(s, "say hi")
        self.gw.close_session(s.id)
        self.gw.score_session(s.id, 0.25)
        with self.assertRaises(ValueError):
            next(self.gw.watch_groups(from_sequence=-1))
        # From the start of the run directory: every group written, in
        # sequence order, this session's among them.
        seqs, mine = [], None
        stream = self.gw.watch_groups(from_sequence=0, timeout=60)
        for g in stream:
            seqs.append(g.sequence)
            if g.group_id == s.group_id:
                mine = g
                break
        stream.close()
        self.assertEqual(seqs, list(range(len(seqs))))
        self.assertIsNotNone(mine)
        self.assertEqual(mine.rewards, [0.25])
        # Resuming at its sequence starts with it.
        again = self.gw.watch_groups(from_sequence=mine.sequence, timeout=60)
        first = next(again)
        again.close()
        self.assertEqual((first.group_id, first.sequence, first.rewards), (mine.group_id, mine.sequence, [0.25]))


if __name__ == "__main__":
    unittest.main()
